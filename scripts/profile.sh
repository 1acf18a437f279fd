#!/usr/bin/env bash
# Flame graphs of Picket under `picket bench`: starts a server on a fresh data directory, runs
# the bench, records the server and the bench client with perf for SECS seconds in the middle of
# the run, and writes OUTDIR/server.svg and OUTDIR/client.svg (plus the folded stacks, which
# `inferno-diff-folded` can compare between two builds).
#
# needs: perf, and inferno (`cargo install inferno --version 0.12.3 --locked`)
# usage: scripts/profile.sh OUTDIR [MODE] [CLIENTS] [SECS]
#   e.g. scripts/profile.sh /tmp/prof uncontended 64 4
set -eu
OUT=$1; MODE=${2:-uncontended}; CLIENTS=${3:-64}; SECS=${4:-4}
BIN=${PICKET_BIN:-target/release/picket}
PORT=${PROFILE_PORT:-17961}
mkdir -p "$OUT"
DATA=$(mktemp -d "${TMPDIR:-/tmp}/picket-profile.XXXXXX")
SERVER=; BENCH=
cleanup() {
  [ -n "$BENCH" ] && kill "$BENCH" 2>/dev/null
  [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null
  wait 2>/dev/null; rm -rf "$DATA"
}
trap cleanup EXIT
"$BIN" serve --listen "127.0.0.1:$PORT" --data-dir "$DATA/node" >/dev/null 2>&1 &
SERVER=$!
for _ in $(seq 1 50); do
  curl -s "127.0.0.1:$PORT/v1/cluster" | grep -q '"leader_id":[1-9]' && break; sleep 0.1
done
"$BIN" --endpoints "127.0.0.1:$PORT" bench --mode "$MODE" --clients "$CLIENTS" \
  --secs $((SECS + 4)) --server-pid "$SERVER" > "$OUT/bench.txt" 2>/dev/null &
BENCH=$!
sleep 3
# Both recordings run at once, over the same seconds of the bench.
perf record -q -F 499 --call-graph dwarf,32768 -o "$OUT/server.data" -p "$SERVER" -- sleep "$SECS" 2>/dev/null &
perf record -q -F 499 --call-graph dwarf,32768 -o "$OUT/client.data" -p "$BENCH" -- sleep "$SECS" 2>/dev/null &
wait %3 %4 2>/dev/null || true
wait "$BENCH"; BENCH=
for side in server client; do
  perf script -i "$OUT/$side.data" 2>/dev/null | inferno-collapse-perf > "$OUT/$side.folded"
  inferno-flamegraph --minwidth 0.3 --title "picket $side, bench $MODE $CLIENTS clients" \
    < "$OUT/$side.folded" > "$OUT/$side.svg"
  rm -f "$OUT/$side.data"
done
grep RESULT "$OUT/bench.txt"
