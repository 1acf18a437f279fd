#!/usr/bin/env bash
# Where a contended handoff's and an uncontended cycle's time goes (issue 19), measured side by
# side: in each round, the node's write path without the network (`picket bench --mode chain`:
# fdatasync into preallocated space, one writer's acquire and release, handoffs among 8 tasks
# and cycles of 8 tasks on locks of their own, all in one process), then the same handoffs
# over the wire protocol (`picket serve` and `picket bench --mode contended --clients 8`); the
# same again with 64 (uncontended over the wire); then one loopback round trip (peerbench's
# `tcp-rr` against its echo server, which this script starts and stops).
#
# usage: scripts/chain.sh OUTFILE ROUNDS SECS BIN [PEERBENCH_BIN]
#   every line it appends is a RESULT line; read the medians off them.
set -u
OUT=$1; ROUNDS=$2; SECS=$3; BIN=$4
PB=${5:-/tmp/peerbench-target/release/peerbench}
PORT=${CHAIN_PORT:-17952}
ECHO_PORT=${CHAIN_ECHO_PORT:-17953}
. "$(dirname "$0")/bench-data.sh"
bench_data chain
"$PB" tcp-server --listen "127.0.0.1:$ECHO_PORT" --max-secs 1800 >/dev/null 2>&1 &
ECHO=$!
for round in $(seq 1 "$ROUNDS"); do
  for spec in "8 contended" "64 uncontended"; do
    set -- $spec
    TMPDIR="$DATA" timeout $((2 * SECS + 60)) "$BIN" bench --mode chain --clients "$1" \
      --secs "$SECS" --tag "chain/r$round" >> "$OUT" || { echo "chain.sh: chain failed" >&2; exit 1; }
    rm -rf "$DATA/node"
    "$BIN" serve --listen "127.0.0.1:$PORT" --data-dir "$DATA/node" >/dev/null 2>&1 &
    SERVER=$!
    ready=
    for _ in $(seq 1 50); do
      curl -s "127.0.0.1:$PORT/v1/cluster" | grep -q '"leader_id":[1-9]' && { ready=1; break; }
      sleep 0.1
    done
    [ -n "$ready" ] || { echo "chain.sh: the node on port $PORT did not lead within 5 s" >&2; exit 1; }
    timeout $((SECS + 60)) "$BIN" --endpoints "127.0.0.1:$PORT" bench --mode "$2" \
      --clients "$1" --secs "$SECS" --server-pid "$SERVER" --tag "wire/r$round" >> "$OUT" \
      || { echo "chain.sh: the wire bench failed" >&2; exit 1; }
    kill "$SERVER"; wait "$SERVER" 2>/dev/null; SERVER=
  done
  timeout $((SECS + 60)) "$PB" tcp-rr --endpoint "127.0.0.1:$ECHO_PORT" --clients 1 \
    --secs "$SECS" --server-pid "$ECHO" >> "$OUT"
done
