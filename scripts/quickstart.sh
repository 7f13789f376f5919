#!/usr/bin/env bash
# grove's main job on the embedded default pool, from a fresh checkout:
# builds grove, creates ./grove-pool if it is missing, then walks through a
# volume, data, a snapshot and a clone, and shows the family tree with the
# space each volume uses, and ends by serving the pool over NBD (Ctrl-C stops
# it). Safe to run again: each run adds a new snapshot and clone of the same
# volume.
set -euo pipefail
cd "$(dirname "$0")/.."

# cargo's own progress stays on: a first build takes minutes.
echo "==> building grove (release)"
cargo build --release -p grove
bin="${CARGO_TARGET_DIR:-target}/release/grove"
echo "==> grove is $bin; to run it as \`grove\`, put it on PATH:"
echo "    export PATH=\"$(cd "$(dirname "$bin")" && pwd):\$PATH\"   (or: cargo install --path crates/grove)"
grove() { "$bin" "$@"; }
export GROVE_POOL="${GROVE_POOL:-./grove-pool}"

show() { echo; echo "\$ grove $*"; grove "$@"; }

if [ ! -f "$GROVE_POOL/grove.toml" ]; then
  show init
fi
if ! grove list --json | grep -q '"name":"demo"'; then
  show create demo --size 10G
  echo
  echo "\$ head -c 64M /dev/urandom | grove write demo"
  head -c 64M /dev/urandom | grove write demo
fi

stamp=$(date +%Y%m%d-%H%M%S)
show snapshot demo "demo@$stamp"
show clone "demo@$stamp" "scratch-$stamp"
echo
echo "\$ echo 'written only to the clone' | grove write scratch-$stamp --offset 1M"
echo 'written only to the clone' | grove write "scratch-$stamp" --offset 1M
show read "scratch-$stamp" --offset 1M --length 25
echo
show tree
show list
show info
echo
echo "==> grove is $bin (see above to put it on PATH)"
echo "==> serving $GROVE_POOL over NBD until Ctrl-C (other grove commands keep working meanwhile)"
echo "\$ grove serve"
exec "$bin" serve
