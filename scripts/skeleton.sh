#!/usr/bin/env bash
# Issue 19's reference: Picket beside the skeleton of a durable lock server with its shape
# (`crates/picket/examples/handoff_skeleton.rs`: no consensus, sessions or request stack; a
# preallocated log synced before every answer), in each of the skeleton's shapes, and the floor
# (fdatasync into preallocated space, one loopback round trip), round by round. Each round: the
# floor's sync; then for each server in turn (`picket serve`, the skeleton's `pipeline`,
# `direct` and `loop`): contended at 8 clients, uncontended at 64 and at 1; then the round
# trip. Each skeleton row has a server of its own, whose SYNCS line says what its syncs took in
# that row (its warm-up second included).
# SKELETON_DRIVE_THREADS=1 drives the skeletons from one thread (Picket's bench keeps its own).
#
# usage: scripts/skeleton.sh OUTFILE ROUNDS SECS PICKET_BIN SKELETON_BIN [PEERBENCH_BIN]
#   build: cargo build --release -p picket --bin picket --example handoff_skeleton
#   it appends RESULT lines (read the medians off them) and SYNCS lines.
set -uo pipefail
OUT=$1; ROUNDS=$2; SECS=$3; BIN=$4; SKELETON=$5
PB=${6:-${PEERBENCH_BIN:-/tmp/peerbench-target/release/peerbench}}
PORT=${SKELETON_PORT:-17971}
ECHO_PORT=${SKELETON_ECHO_PORT:-17972}
. "$(dirname "$0")/bench-data.sh"
bench_data skeleton
# The echo server lives as long as the whole run may take: 13 runs a round, each bounded.
"$PB" tcp-server --listen "127.0.0.1:$ECHO_PORT" --max-secs $((ROUNDS * 13 * (SECS + 70) + 60)) >/dev/null 2>&1 &
ECHO=$!
ROWS="contended 8
uncontended 64
uncontended 1"
for round in $(seq 1 "$ROUNDS"); do
  "$PB" fsync --dir "$DATA" --count 2000 --size 64 --prealloc falloc | sed "s/tag=-/tag=floor\/r$round/" >> "$OUT" \
    || { echo "skeleton.sh: the floor's sync failed" >&2; exit 1; }
  for server in picket pipeline direct loop; do
    if [ "$server" = picket ]; then
      rm -rf "$DATA/node"
      "$BIN" serve --listen "127.0.0.1:$PORT" --data-dir "$DATA/node" >/dev/null 2>&1 &
      SERVER=$!
      ready=
      for _ in $(seq 1 50); do
        kill -0 "$SERVER" 2>/dev/null || break
        curl -s "127.0.0.1:$PORT/v1/cluster" | grep -q '"leader_id":[1-9]' && { ready=1; break; }
        sleep 0.1
      done
      [ -n "$ready" ] || { echo "skeleton.sh: the node on port $PORT did not lead within 5 s" >&2; exit 1; }
    fi
    while read -r mode clients; do
      if [ "$server" = picket ]; then
        timeout $((SECS + 60)) "$BIN" --endpoints "127.0.0.1:$PORT" bench --mode "$mode" \
          --clients "$clients" --secs "$SECS" --server-pid "$SERVER" --tag "picket/r$round" >> "$OUT" \
          || { echo "skeleton.sh: picket $mode $clients failed" >&2; exit 1; }
        continue
      fi
      # A skeleton server of its own for each row: on SIGTERM it prints what its syncs took.
      rm -rf "$DATA/node"
      "$SKELETON" serve "$server" "127.0.0.1:$PORT" "$DATA/node" > "$DATA/syncs" &
      SERVER=$!
      ready=
      for _ in $(seq 1 50); do
        kill -0 "$SERVER" 2>/dev/null || break
        (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && { ready=1; break; }
        sleep 0.1
      done
      [ -n "$ready" ] || { echo "skeleton.sh: the $server skeleton did not listen on port $PORT within 5 s" >&2; exit 1; }
      timeout $((SECS + 60)) "$SKELETON" drive "127.0.0.1:$PORT" "$mode" "$clients" "$SECS" \
        "$SERVER" "$server/r$round" >> "$OUT" \
        || { echo "skeleton.sh: $server $mode $clients failed" >&2; exit 1; }
      kill "$SERVER"; wait "$SERVER" 2>/dev/null; SERVER=
      [ -s "$DATA/syncs" ] || { echo "skeleton.sh: the $server skeleton printed no SYNCS line" >&2; exit 1; }
      sed "s/\$/ mode=$mode clients=$clients tag=$server\/r$round/" "$DATA/syncs" >> "$OUT"
    done <<< "$ROWS"
    [ -n "$SERVER" ] && { kill "$SERVER"; wait "$SERVER" 2>/dev/null; SERVER=; }
  done
  timeout $((SECS + 60)) "$PB" tcp-rr --endpoint "127.0.0.1:$ECHO_PORT" --clients 1 \
    --secs "$SECS" --server-pid "$ECHO" | sed "s/tag=-/tag=floor\/r$round/" >> "$OUT" \
    || { echo "skeleton.sh: the round trip's measurement failed" >&2; exit 1; }
done
