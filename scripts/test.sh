#!/usr/bin/env bash
# Runs grove's whole test suite. First installs what the tests need, from the
# package registries only: the real NBD clients the interop tests drive
# (qemu-img, qemu-io, nbdinfo, nbdcopy, fio) and the tools for file systems on
# loop devices over `grove mount` files (fuse3, util-linux, e2fsprogs, xfsprogs).
# Building needs none of them: fuser mounts in pure Rust. Safe to run again: it installs only what is missing.
#
#   scripts/test.sh            everything
#   scripts/test.sh model      only tests whose name contains "model"
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the tests use, and a command that shows each is there.
declare -A NEEDED=(
  [qemu-img]=qemu-utils
  [qemu-io]=qemu-utils
  [nbdinfo]=libnbd-bin
  [nbdcopy]=libnbd-bin
  [fio]=fio
  [nbdkit]=nbdkit
  [mkfs.ext4]=e2fsprogs
  [mkfs.xfs]=xfsprogs
  [xfs_repair]=xfsprogs
  [fusermount3]=fuse3
  [losetup]=util-linux
  [fsfreeze]=util-linux
  [setpriv]=util-linux
  [unshare]=util-linux
)

install_missing() {
  local missing=()
  for tool in "${!NEEDED[@]}"; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("${NEEDED[$tool]}")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: cannot install ${missing[*]} (needs root and apt-get); tests that need them will say they skip" >&2
    return 0
  fi
  echo "test.sh: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

install_missing

# nextest runs each test in its own process and the binaries in parallel;
# plain cargo test is the fallback on machines without it.
if cargo nextest --version >/dev/null 2>&1; then
  exec cargo nextest run --workspace --no-fail-fast "$@"
else
  exec cargo test --workspace --no-fail-fast "$@"
fi
