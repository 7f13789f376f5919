#!/usr/bin/env bash
# fio through a `grove mount` volume file, next to the same fio on a plain
# file on the same file system and on `grove serve` with fio's nbd engine,
# in one run. Prints IOPS and bandwidth per workload and each grove figure
# as a ratio of the plain file's. Needs root (FUSE), fio (with the nbd
# engine) and jq; builds nothing: run `cargo build --release -p grove` first.
#
#   bench/fio-fuse.sh                    1 GiB, 10 s per workload, queue depth 16
#   SIZE=4G RUNTIME=30 IODEPTH=32 bench/fio-fuse.sh
set -euo pipefail
cd "$(dirname "$0")/.."

grove="${GROVE:-${CARGO_TARGET_DIR:-target}/release/grove}"
size="${SIZE:-1G}"
runtime="${RUNTIME:-10}"
iodepth="${IODEPTH:-16}"
work=$(mktemp -d "${TMPDIR:-/var/tmp}/grove-fio.XXXXXX")
serve_pid=""

cleanup() {
  mountpoint -q "$work/mnt" && umount "$work/mnt" || true
  [ -n "$serve_pid" ] && kill -TERM "$serve_pid" 2>/dev/null && wait "$serve_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# One workload on one target; prints "iops bandwidth_MiB_s".
run_fio() {
  local target=$1 rw=$2 bs=$3
  local args=(--name=job --rw="$rw" --bs="$bs" --size="$size" --runtime="$runtime"
    --time_based --direct=1 --iodepth="$iodepth" --numjobs=1 --group_reporting
    --randrepeat=0 --output-format=json)
  case $target in
    nbd) args+=(--ioengine=nbd --uri="nbd+unix:///disk?socket=$work/nbd-pool/nbd.sock") ;;
    *) args+=(--ioengine=libaio --filename="$target") ;;
  esac
  # The nbd engine prints a line of its own before the JSON.
  fio "${args[@]}" | sed -n '/^{/,$p' | jq -r '.jobs[0] | (.read.iops + .write.iops | tostring) + " "
    + ((.read.bw + .write.bw) / 1024 | tostring)'
}

mkdir -p "$work/mnt"
"$grove" --pool "$work/fuse-pool" init >/dev/null
"$grove" --pool "$work/fuse-pool" create disk --size "$size" >/dev/null
"$grove" --pool "$work/fuse-pool" mount "$work/mnt" >/dev/null
"$grove" --pool "$work/nbd-pool" init >/dev/null
"$grove" --pool "$work/nbd-pool" create disk --size "$size" >/dev/null
"$grove" --pool "$work/nbd-pool" serve >/dev/null 2>&1 &
serve_pid=$!
for _ in $(seq 100); do [ -S "$work/nbd-pool/nbd.sock" ] && break; sleep 0.1; done
truncate -s "$size" "$work/plain.img"

declare -A targets=([plain]="$work/plain.img" [fuse]="$work/mnt/disk" [nbd]=nbd)
# Writes first: the sequential write fills every target, so reads read data.
workloads=("write 1M" "randwrite 4k" "read 1M" "randread 4k")
printf '%-12s %-6s %12s %10s %9s\n' workload target IOPS MiB/s vs-plain
for workload in "${workloads[@]}"; do
  read -r rw bs <<<"$workload"
  plain_iops=""
  for name in plain fuse nbd; do
    read -r iops bw < <(run_fio "${targets[$name]}" "$rw" "$bs")
    [ -z "$plain_iops" ] && plain_iops=$iops
    ratio=$(awk -v a="$iops" -v b="$plain_iops" 'BEGIN { printf "%.2f", a / b }')
    printf '%-12s %-6s %12.0f %10.1f %9s\n' "$rw $bs" "$name" "$iops" "$bw" "$ratio"
  done
done
