#!/usr/bin/env bash
# A three-node Picket cluster on loopback, without containers:
#
#   deploy/cluster.sh start [DIR]   # nodes on 127.0.0.1:7687, :7688, :7689, data in DIR
#   deploy/cluster.sh stop [DIR]
#
# PICKET names the binary (default: target/release/picket, else `picket` on the PATH);
# PICKET_BASE_PORT moves the ports (default 7687).
set -euo pipefail
action="${1:-}"
dir="${2:-./picket-cluster}"
base="${PICKET_BASE_PORT:-7687}"
picket="${PICKET:-}"
if [ -z "$picket" ]; then
  if [ -x target/release/picket ]; then picket=target/release/picket; else picket=picket; fi
fi
peers="1=127.0.0.1:${base},2=127.0.0.1:$((base + 1)),3=127.0.0.1:$((base + 2))"

case "$action" in
  start)
    mkdir -p "$dir"
    for id in 1 2 3; do
      port=$((base + id - 1))
      if [ -e "$dir/node$id.pid" ] && kill -0 "$(cat "$dir/node$id.pid")" 2>/dev/null; then
        echo "node $id is already running (pid $(cat "$dir/node$id.pid"))"
        continue
      fi
      "$picket" serve --node-id "$id" --listen "127.0.0.1:$port" --peers "$peers" \
        --data-dir "$dir/node$id" >"$dir/node$id.out" 2>"$dir/node$id.log" &
      echo $! >"$dir/node$id.pid"
      echo "node $id: 127.0.0.1:$port (pid $!, log $dir/node$id.log)"
    done
    ;;
  stop)
    for id in 1 2 3; do
      if [ -e "$dir/node$id.pid" ]; then
        pid="$(cat "$dir/node$id.pid")"
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
        rm -f "$dir/node$id.pid"
        echo "node $id stopped"
      fi
    done
    ;;
  *)
    echo "usage: $0 start|stop [DIR]" >&2
    exit 2
    ;;
esac
