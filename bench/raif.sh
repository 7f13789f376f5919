#!/usr/bin/env bash
# RAIF figures for issue 17, each against one plain branch directory in the
# same run: random 4K reads (fio, psync, 4 jobs) on RAIF1 over 2 and 4
# branches, and sequential 1M writes on RAIF0 and RAIF5 over 4 branches.
# All branches sit in one directory of this machine's file system, so the
# thesis's gain from separate disks cannot show here.
#   bench/raif.sh [WORKDIR]     (root and /dev/fuse needed)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p grove
GROVE=$PWD/target/release/grove
WORK=${1:-/var/tmp/grove-raif-bench}
SIZE=256M
RUNTIME=5s
rm -rf "$WORK" && mkdir -p "$WORK"
iops() { python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["read"]["iops"]))'; }
bw() { python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["write"]["bw"])'; }
randread() {
  fio --name=r --directory="$1" --rw=randread --bs=4k --size=$SIZE --numjobs=4 \
    --runtime=$RUNTIME --time_based --group_reporting --output-format=json | iops
}
seqwrite() {
  fio --name=w --directory="$1" --rw=write --bs=1M --size=$SIZE --numjobs=1 \
    --end_fsync=1 --output-format=json | bw
}
mount_raif() { # level width
  local dir=$WORK/$1x$2; mkdir -p "$dir/mnt"
  local branches=(); for i in $(seq 1 "$2"); do mkdir -p "$dir/b$i"; branches+=("$dir/b$i"); done
  "$GROVE" raif mount --level "$1" "${branches[@]}" "$dir/mnt" >/dev/null
  echo "$dir/mnt"
}
mkdir -p "$WORK/plain"
plain_read=$(randread "$WORK/plain"); plain_write=$(seqwrite "$WORK/plain")
echo "plain directory: random 4K read $plain_read IOPS, sequential write $plain_write KiB/s"
for spec in raif1:2 raif1:4; do
  mnt=$(mount_raif "${spec%:*}" "${spec#*:}")
  r=$(randread "$mnt"); fusermount3 -u "$mnt"
  echo "$spec: random 4K read $r IOPS ($(python3 -c "print(f'{$r/$plain_read:.2f}')") of plain)"
done
for spec in raif0:4 raif5:4; do
  mnt=$(mount_raif "${spec%:*}" "${spec#*:}")
  w=$(seqwrite "$mnt"); fusermount3 -u "$mnt"
  echo "$spec: sequential write $w KiB/s ($(python3 -c "print(f'{$w/$plain_write:.2f}')") of plain)"
done
