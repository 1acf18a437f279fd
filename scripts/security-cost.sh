#!/usr/bin/env bash
# What TLS and signed sequencers cost, side by side in one session: for each round and each
# setup (plaintext; TLS between client and node; plaintext with a signing key), start one node
# on a fresh data directory, run uncontended 1 and 64 and contended 8 clients, stop the node.
# Keys and certificates are made with openssl in a temporary directory.
#
# usage: scripts/security-cost.sh OUTFILE ROUNDS SECS [BIN]
#   summarize: python3 ../shared/peerbench/scripts/summarize.py OUTFILE (rows named by setup)
set -eu
OUT=$1; ROUNDS=$2; SECS=$3; BIN=${4:-target/release/picket}
PORT=${SC_PORT:-17961}
DIR=$(mktemp -d "${TMPDIR:-/tmp}/picket-sec.XXXXXX")
SERVER=
cleanup() { [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null; wait 2>/dev/null; rm -rf "$DIR"; }
trap cleanup EXIT
make_keys() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
    -subj "/CN=bench peer CA" -keyout "$DIR/ca-key.pem" -out "$DIR/ca.pem" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=node" \
    -keyout "$DIR/node-key.pem" -out "$DIR/node.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' > "$DIR/node.ext"
  openssl x509 -req -in "$DIR/node.csr" -CA "$DIR/ca.pem" -CAkey "$DIR/ca-key.pem" -days 30 \
    -extfile "$DIR/node.ext" -out "$DIR/node.pem" 2>/dev/null
  openssl genpkey -algorithm ed25519 -out "$DIR/signing-key.pem"
}
make_keys
for round in $(seq 1 "$ROUNDS"); do
  for setup in plaintext tls signed; do
    case $setup in
      plaintext) serve=(); client=() ;;
      tls) serve=(--tls-cert "$DIR/node.pem" --tls-key "$DIR/node-key.pem" --peer-ca "$DIR/ca.pem")
           client=(--ca "$DIR/ca.pem") ;;
      signed) serve=(--signing-key "$DIR/signing-key.pem"); client=() ;;
    esac
    rm -rf "$DIR/node-data"
    "$BIN" serve --listen "127.0.0.1:$PORT" --data-dir "$DIR/node-data" "${serve[@]}" >/dev/null 2>&1 &
    SERVER=$!
    for _ in $(seq 1 50); do
      "$BIN" --endpoints "127.0.0.1:$PORT" "${client[@]}" members >/dev/null 2>&1 && break; sleep 0.1
    done
    for spec in "uncontended 1" "uncontended 64" "contended 8"; do
      set -- $spec
      timeout $((SECS + 60)) "$BIN" --endpoints "127.0.0.1:$PORT" "${client[@]}" bench \
        --mode "$1" --clients "$2" --secs "$SECS" --server-pid "$SERVER" --tag "$setup/r$round" >> "$OUT"
    done
    kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; SERVER=
  done
done
