# Sourced by scripts/chain.sh and scripts/skeleton.sh: `bench_data NAME` makes DATA, a fresh
# directory under $TMPDIR (warned of when it is a tmpfs, where fdatasync does nothing), and
# stops $SERVER and $ECHO (the scripts' server and echo server, when set) and removes DATA on
# exit, however the script ends.
bench_data() {
  DATA=$(mktemp -d "${TMPDIR:-/tmp}/picket-$1.XXXXXX") || exit 1
  if [ "$(stat -f -c %T "$DATA")" = tmpfs ]; then
    echo "$1.sh: $DATA is on tmpfs, where fdatasync does nothing; set TMPDIR to a disk" >&2
  fi
  SERVER=; ECHO=
  trap bench_data_cleanup EXIT
}

bench_data_cleanup() {
  [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null
  [ -n "$ECHO" ] && kill "$ECHO" 2>/dev/null
  wait 2>/dev/null; rm -rf "$DATA"
}
