#!/usr/bin/env bash
# Interleaved A/B of two picket builds on one node: for each round and each build, start that
# build's server on a fresh data directory, run uncontended 1 and 64 and contended 8 and 64
# clients with that build's bench, stop the server. Extra environment for the server (e.g.
# PICKET_SERVER_ENV="TOKIO_WORKER_THREADS=1") applies to both builds. With AB_CLUSTER=1 each run
# is `picket bench --cluster` instead (a 3-node loopback cluster of that build, started and
# stopped by the bench itself). With AB_DATA_B=DIR, build B's nodes keep their data under DIR
# instead (for example /dev/shm, a tmpfs, where a sync costs almost nothing: what the node
# costs without its disk). B is told apart from A by its path, so give one binary two names
# (hard links) to compare it with itself.
#
# usage: scripts/ab.sh OUTFILE ROUNDS SECS BIN_A BIN_B
#   summarize: python3 ../shared/peerbench/scripts/summarize.py OUTFILE (rows named by binary)
set -u
OUT=$1; ROUNDS=$2; SECS=$3; A=$4; B=$5
PORT=${AB_PORT:-17951}
DATA=$(mktemp -d "${TMPDIR:-/tmp}/picket-ab.XXXXXX") || exit 1
SERVER=
DATA_B=
cleanup() { [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null; wait 2>/dev/null; rm -rf "$DATA" ${DATA_B:+"$DATA_B"}; }
trap cleanup EXIT
DATA_B=$(mktemp -d "${AB_DATA_B:-${TMPDIR:-/tmp}}/picket-ab.XXXXXX") || exit 1
for round in $(seq 1 "$ROUNDS"); do
  for bin in "$A" "$B"; do
    name=$(basename "$bin")
    if [ -n "${AB_CLUSTER:-}" ]; then
      for spec in "uncontended 1" "uncontended 64" "contended 8" "contended 64"; do
        set -- $spec
        tmp=${TMPDIR:-/tmp}; [ "$bin" = "$B" ] && tmp=${AB_DATA_B:-$tmp}
        TMPDIR=$tmp timeout $((SECS + 90)) "$bin" bench --cluster --mode "$1" --clients "$2" \
          --secs "$SECS" --tag "$name/r$round" >> "$OUT"
      done
      continue
    fi
    dir=$DATA; [ "$bin" = "$B" ] && dir=$DATA_B
    rm -rf "$dir/node"
    env ${PICKET_SERVER_ENV:-} "$bin" serve --listen "127.0.0.1:$PORT" --data-dir "$dir/node" >/dev/null 2>&1 &
    SERVER=$!
    for _ in $(seq 1 50); do
      curl -s "127.0.0.1:$PORT/v1/cluster" | grep -q '"leader_id":[1-9]' && break; sleep 0.1
    done
    for spec in "uncontended 1" "uncontended 64" "contended 8" "contended 64"; do
      set -- $spec
      timeout $((SECS + 60)) "$bin" --endpoints "127.0.0.1:$PORT" bench --mode "$1" --clients "$2" \
        --secs "$SECS" --server-pid "$SERVER" --tag "$name/r$round" >> "$OUT"
    done
    kill "$SERVER"; wait "$SERVER" 2>/dev/null; SERVER=
  done
done
