#!/usr/bin/env bash
# Installs what the test suites need and a fresh Debian machine lacks, then runs every suite.
# This is the README's test command; `.ci/run` runs it after the format and lint checks.
#
# - PostgreSQL's server binaries: the PostgreSQL fence's tests start their own server.
# - nftables: the fault harness's partitions (`picket chaos run`) cut links with nftables rules
#   matched by cgroup; they also need root and cgroup v2.
# - Chromium and ChromeDriver: the dashboard's test drives a headless browser.
# - systemd (for systemd-analyze): the deploy test verifies deploy/picket.service.
# - Python 3 with venv: the Python client's tests (pytest, mypy) run in target/python-venv.
# - openssl: the Python client's TLS tests make their certificates with it.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then missing+=(postgresql); fi
if ! command -v nft >/dev/null 2>&1 && [ ! -x /usr/sbin/nft ]; then missing+=(nftables); fi
if [ ! -x /usr/bin/chromium ]; then missing+=(chromium); fi
if [ ! -x /usr/bin/chromedriver ]; then missing+=(chromium-driver); fi
if ! command -v systemd-analyze >/dev/null 2>&1; then missing+=(systemd); fi
if ! command -v python3 >/dev/null 2>&1; then missing+=(python3); fi
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then missing+=(python3-venv); fi
if ! command -v openssl >/dev/null 2>&1; then missing+=(openssl); fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing ${missing[*]} (needed by the tests)"
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

echo "== cargo test --workspace"
cargo test --workspace

# The Rust client and the CLI speak the wire protocol by default; their suites run again over
# gRPC, which every other client uses and which the client falls back to. `--workspace` keeps
# the features cargo unifies the same as above: `-p picket` alone would build the whole stack a
# second time (another 5 GB of target/ and several minutes). picket-core's model test named
# no_ghost_holders runs again too (a fraction of a second, no network).
echo "== the Rust client's and the CLI's suites again over gRPC (PICKET_PROTOCOL=grpc)"
PICKET_PROTOCOL=grpc cargo test --workspace --test client --test no_ghost_holders --test tls \
  --test auth --test cli

echo "== the Python client: mypy --strict and pytest (against target/debug/picket)"
venv=target/python-venv
if [ ! -x "$venv/bin/pip" ]; then python3 -m venv "$venv"; fi
"$venv/bin/pip" install --quiet --upgrade pip
"$venv/bin/pip" install --quiet --upgrade './clients/python[test]'
"$venv/bin/mypy" --strict --config-file clients/python/pyproject.toml clients/python/src
PICKET_BIN="$PWD/target/debug/picket" "$venv/bin/pytest" -q -p no:cacheprovider clients/python/tests
