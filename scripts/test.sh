#!/usr/bin/env bash
# Runs grove's whole test suite. First installs what the tests need, from the
# package registries only: the real NBD clients the interop tests drive
# (qemu-img, qemu-io, qemu-nbd, nbdinfo, nbdcopy, fio), openssl for the TLS
# tests' certificates, the tools for file systems on loop devices over
# `grove mount` files (fuse3, util-linux, e2fsprogs, xfsprogs), mergerfs and
# bindfs (the peers the RAIF POSIX suite is compared with), openssh's
# server and client (the replication test runs its own sshd on 127.0.0.1
# and pipes `grove send` through ssh), and Ceph with radosgw
# (scripts/ceph.sh) for the S3 and RADOS tests. Building needs none of them
# (fuser mounts in pure Rust) but one: grove-rados links librados, whose
# headers and link library come in librados-dev. Safe to run again: it installs only
# what is missing, and stops with an error when it cannot.
#
# It sets GROVE_REQUIRE_TOOLS=1, so a test whose tool is missing fails with
# the tool's name instead of passing after a printed "SKIP". Run alone (plain
# cargo test), such tests still skip, visibly.
#
#   scripts/test.sh            everything, then the doc tests
#   scripts/test.sh model      only tests whose name contains "model"
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the tests use, and a command that shows each is there.
declare -A NEEDED=(
  [qemu-img]=qemu-utils
  [qemu-io]=qemu-utils
  [qemu-nbd]=qemu-utils
  [nbdinfo]=libnbd-bin
  [nbdcopy]=libnbd-bin
  [fio]=fio
  [nbdkit]=nbdkit
  [restic]=restic
  [/usr/bin/time]=time
  [mkfs.ext4]=e2fsprogs
  [mkfs.xfs]=xfsprogs
  [openssl]=openssl
  [xfs_repair]=xfsprogs
  [fusermount3]=fuse3
  [losetup]=util-linux
  [fsfreeze]=util-linux
  [setpriv]=util-linux
  [unshare]=util-linux
  [mergerfs]=mergerfs
  [bindfs]=bindfs
  [sshd]=openssh-server
  [ssh]=openssh-client
  [ssh-keygen]=openssh-client
)
# Libraries the build links, and a file that shows each is there.
declare -A NEEDED_LIBS=(
  [/usr/include/rados/librados.h]=librados-dev
)

missing_tools() {
  for tool in "${!NEEDED[@]}"; do
    # sshd is in /usr/sbin, which a user's PATH may lack.
    command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] || echo "$tool"
  done
  for file in "${!NEEDED_LIBS[@]}"; do
    [ -e "$file" ] || echo "$file"
  done
}

install_missing() {
  local tools packages
  mapfile -t tools < <(missing_tools | sort)
  [ ${#tools[@]} -eq 0 ] && return 0
  mapfile -t packages < <(for t in "${tools[@]}"; do echo "${NEEDED[$t]:-${NEEDED_LIBS[$t]}}"; done | sort -u)
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: error: the tests need ${tools[*]} (Debian packages: ${packages[*]})," \
      "and installing them needs root and apt-get. Install them, then run again." >&2
    exit 1
  fi
  echo "test.sh: installing ${packages[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get update -qq >/dev/null || \
     ! apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null; then
    echo "test.sh: error: apt-get could not install ${packages[*]}" >&2
    exit 1
  fi
  mapfile -t tools < <(missing_tools | sort)
  if [ ${#tools[@]} -ne 0 ]; then
    echo "test.sh: error: still missing after installing: ${tools[*]}" >&2
    exit 1
  fi
}

install_missing

# The S3 tests (crates/grove-objects) run against a single-node Ceph with
# radosgw on 127.0.0.1 (scripts/ceph.sh installs and starts it, ~15 s after
# the first install); its env file gives them the endpoint, credentials and
# bucket. One this script started is stopped on exit; one already running
# is used and left running.
if scripts/ceph.sh env >/dev/null 2>&1; then
  scripts/ceph.sh start >/dev/null || { echo "test.sh: error: scripts/ceph.sh start failed" >&2; exit 1; }
else
  trap 'scripts/ceph.sh stop || true' EXIT
  scripts/ceph.sh start >/dev/null || { echo "test.sh: error: scripts/ceph.sh start failed" >&2; exit 1; }
fi
eval "$(scripts/ceph.sh env)"

# Every test whose tool is missing now fails instead of skipping.
export GROVE_REQUIRE_TOOLS=1

# nextest runs each test in its own process and the binaries in parallel,
# with the slow-test warnings and hard timeouts of .config/nextest.toml;
# plain cargo test is the fallback on machines without it. nextest does not
# run doc tests, so they run after it.
status=0
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast "$@" || status=$?
else
  cargo test --workspace --no-fail-fast "$@" || status=$?
fi
if [ $# -eq 0 ]; then
  cargo test --doc --workspace || status=$?
fi
exit $status
