#!/usr/bin/env bash
# Runs the lock benchmark matrix with Picket and, interleaved round by round, the peers measured
# by ../shared/peerbench, so every figure comes from the same session on the same machine.
#
# usage: scripts/bench.sh OUTFILE [ROUNDS] [SECS] [SYSTEMS...]
#   SYSTEMS: picket picket-cluster skeleton-pipeline skeleton-direct skeleton-loop etcd zk redis
#            redis-aof
#            (default: picket etcd zk redis redis-aof)
#   Peers must already run (../shared/peerbench/scripts/servers.sh start etcd|zk|redis|redis-aof);
#   Picket (one node, or a 3-node loopback cluster) is started and stopped here, and so are the
#   three shapes of the skeleton server (issue 19's reference: crates/picket/examples/
#   handoff_skeleton.rs; build it with cargo build --release -p picket --example handoff_skeleton).
# Each run is bounded by --secs plus a timeout; every process started here is stopped on exit.
set -uo pipefail
OUT=$1; ROUNDS=${2:-3}; SECS=${3:-10}; shift 3 || true
SYSTEMS=${*:-picket etcd zk redis redis-aof}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
PEER=${PEERBENCH_DIR:-$ROOT/../shared/peerbench}
PB=${PEERBENCH_BIN:-${CARGO_TARGET_DIR_PEERBENCH:-/tmp/peerbench-target}/release/peerbench}
PICKET=${PICKET_BIN:-$ROOT/target/release/picket}
SKELETON=${SKELETON_BIN:-$ROOT/target/release/examples/handoff_skeleton}
BASE=${PEERBENCH_BASE:-/tmp/peerbench}
WORK=$(mktemp -d /tmp/picket-bench.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null
  if [ -s "$WORK/bench.err" ]; then echo "client errors (last 20 lines of $WORK/bench.err):" >&2; tail -20 "$WORK/bench.err" >&2; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

start_picket() { # name port [extra args...]: starts a node and sets STARTED_PID.
  # Not called in $(...): a subshell would lose PIDS and leave the server running after exit.
  local name=$1 port=$2; shift 2
  if curl -s -o /dev/null "127.0.0.1:$port/v1/cluster"; then
    echo "port $port is already in use (a server left from an earlier run?); stop it first" >&2; exit 1
  fi
  "$PICKET" serve --listen "127.0.0.1:$port" --data-dir "$WORK/$name" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
  STARTED_PID=$!; PIDS+=("$STARTED_PID")
}
wait_leader() { # port
  for _ in $(seq 1 100); do
    curl -s "127.0.0.1:$1/v1/cluster" | grep -q '"leader_id":[1-9]' && return 0; sleep 0.1
  done
  echo "no leader on port $1" >&2; return 1
}
leader_pid() { # the pid of the node whose port is the leader's
  local addr; addr=$(curl -s 127.0.0.1:17901/v1/cluster | sed -n 's/.*"leader_addr":"\([^"]*\)".*/\1/p')
  case $addr in *:17901) echo "${CLUSTER_PIDS[0]}";; *:17902) echo "${CLUSTER_PIDS[1]}";; *) echo "${CLUSTER_PIDS[2]}";; esac
}

for sys in $SYSTEMS; do
  case $sys in
    picket) start_picket single 17801; PICKET_PID=$STARTED_PID; wait_leader 17801 ;;
    picket-cluster)
      peers=1=127.0.0.1:17901,2=127.0.0.1:17902,3=127.0.0.1:17903
      CLUSTER_PIDS=()
      for i in 1 2 3; do start_picket node$i 1790$i --node-id $i --peers $peers; CLUSTER_PIDS+=("$STARTED_PID"); done
      wait_leader 17901 ;;
    skeleton-pipeline|skeleton-direct|skeleton-loop)
      case $sys in skeleton-pipeline) port=17811;; skeleton-loop) port=17812;; *) port=17813;; esac
      "$SKELETON" serve "${sys#skeleton-}" "127.0.0.1:$port" "$WORK/$sys" >"$WORK/$sys.out" 2>"$WORK/$sys.err" &
      PIDS+=("$!")
      case $sys in skeleton-pipeline) PIPELINE_PID=$!;; skeleton-loop) LOOP_PID=$!;; *) DIRECT_PID=$!;; esac
      ready=
      for _ in $(seq 1 50); do
        kill -0 "${PIDS[-1]}" 2>/dev/null || break
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && { ready=1; break; }
        sleep 0.1
      done
      [ -n "$ready" ] || { echo "$sys did not listen on port $port within 5 s" >&2; exit 1; } ;;
  esac
done

for r in $(seq 1 "$ROUNDS"); do
  for sys in $SYSTEMS; do
    for mode in uncontended contended; do
      for n in 1 8 64; do
        case $sys in
          picket) line=$(timeout $((SECS + 90)) "$PICKET" bench --endpoints 127.0.0.1:17801 --mode $mode --clients $n --secs "$SECS" --server-pid "$PICKET_PID" --tag "picket/r$r" 2>>"$WORK/bench.err") ;;
          picket-cluster) line=$(timeout $((SECS + 90)) "$PICKET" bench --endpoints 127.0.0.1:17901,127.0.0.1:17902,127.0.0.1:17903 --mode $mode --clients $n --secs "$SECS" --server-pid "$(leader_pid)" --tag "picket-cluster/r$r" 2>>"$WORK/bench.err") ;;
          skeleton-pipeline) line=$(timeout $((SECS + 90)) "$SKELETON" drive 127.0.0.1:17811 $mode $n "$SECS" "$PIPELINE_PID" "skeleton-pipeline/r$r" 2>>"$WORK/bench.err") ;;
          skeleton-direct) line=$(timeout $((SECS + 90)) "$SKELETON" drive 127.0.0.1:17813 $mode $n "$SECS" "$DIRECT_PID" "skeleton-direct/r$r" 2>>"$WORK/bench.err") ;;
          skeleton-loop) line=$(timeout $((SECS + 90)) "$SKELETON" drive 127.0.0.1:17812 $mode $n "$SECS" "$LOOP_PID" "skeleton-loop/r$r" 2>>"$WORK/bench.err") ;;
          etcd) line=$(timeout $((SECS + 90)) "$PB" etcd --endpoint 127.0.0.1:2379 --clients $n --mode $mode --secs "$SECS" --server-pid "$(cat $BASE/etcd.pid)" --tag "etcd/r$r" 2>>"$WORK/bench.err") ;;
          zk) line=$(timeout $((SECS + 90)) "$PB" zk --endpoint 127.0.0.1:2181 --clients $n --mode $mode --secs "$SECS" --server-pid "$(cat $BASE/zk.pid)" --tag "zk/r$r" 2>>"$WORK/bench.err") ;;
          redis) line=$(timeout $((SECS + 90)) "$PB" redis --endpoint 127.0.0.1:16379 --clients $n --mode $mode --secs "$SECS" --server-pid "$(cat $BASE/redis.pid)" --tag "redis/r$r" 2>>"$WORK/bench.err") ;;
          redis-aof) line=$(timeout $((SECS + 90)) "$PB" redis --endpoint 127.0.0.1:16380 --clients $n --mode $mode --secs "$SECS" --server-pid "$(cat $BASE/redis-aof.pid)" --tag "redis-aof/r$r" 2>>"$WORK/bench.err") ;;
        esac
        result=$(echo "$line" | grep '^RESULT')
        # A run that printed no RESULT line (it failed or timed out) is reported, not written
        # as an empty line; its errors are in bench.err, shown on exit.
        if [ -n "$result" ]; then echo "$result" | tee -a "$OUT"; else echo "no result: $sys $mode $n (round $r)" >&2; fi
      done
    done
  done
done
echo "summary: python3 $PEER/scripts/summarize.py $OUT"
