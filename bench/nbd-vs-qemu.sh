#!/usr/bin/env bash
# fio's nbd engine against `grove serve` and against qemu-nbd on a raw file,
# in the same run, over unix sockets: sequential 1M read and write, random 4K
# read and write, 4 jobs x iodepth 16 each. Both hold the same data (a
# prefilled 1 GiB image), both run with the host page cache (qemu-nbd's
# default writeback cache). Each workload alternates grove and qemu-nbd
# ROUNDS times; the table gives median IOPS and the ratio grove/qemu-nbd.
#
#   bench/nbd-vs-qemu.sh [OUT_DIR]      env: SIZE (1G), RUNTIME (10 s), ROUNDS (3)
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${SIZE:-1G}
RUNTIME=${RUNTIME:-10}
ROUNDS=${ROUNDS:-3}
OUT=${1:-bench/results}
mkdir -p "$OUT"
for tool in fio qemu-nbd python3; do
  command -v "$tool" >/dev/null || { echo "nbd-vs-qemu: $tool is missing" >&2; exit 1; }
done
cargo build --release --quiet -p grove
grove=$PWD/target/release/grove

work=$(mktemp -d /var/tmp/grove-nbd-bench.XXXXXX)
cleanup() { kill "${grove_pid:-}" "${qemu_pid:-}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

head -c "$SIZE" /dev/urandom > "$work/disk.raw"
"$grove" --pool "$work/pool" init >/dev/null
"$grove" --pool "$work/pool" import disk "$work/disk.raw" >/dev/null
"$grove" --pool "$work/pool" serve --socket "$work/grove.sock" >/dev/null 2>&1 &
grove_pid=$!
qemu-nbd --socket="$work/qemu.sock" --format=raw --persistent --shared=16 \
  --cache=writeback --aio=threads --export-name=disk "$work/disk.raw" &
qemu_pid=$!
for sock in grove.sock qemu.sock; do
  for _ in $(seq 100); do [ -S "$work/$sock" ] && break; sleep 0.1; done
done

run_fio() { # server workload rw bs
  fio --name="$2" --ioengine=nbd --uri="nbd+unix:///disk?socket=$work/$1.sock" \
    --rw="$3" --bs="$4" --numjobs=4 --iodepth=16 --runtime="$RUNTIME" --time_based \
    --group_reporting --output-format=json > "$work/$1-$2-$round.json"
}

workloads="seq-read:read:1M seq-write:write:1M rand-read:randread:4k rand-write:randwrite:4k"
for round in $(seq "$ROUNDS"); do
  for w in $workloads; do
    IFS=: read -r name rw bs <<<"$w"
    run_fio grove "$name" "$rw" "$bs"
    run_fio qemu "$name" "$rw" "$bs"
  done
done

python3 - "$work" "$OUT" "$ROUNDS" "$RUNTIME" <<'PY'
import json, statistics, sys, pathlib, datetime
work, out, rounds, runtime = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def iops(server, name, r):
    # The nbd engine prints "fio: connected to NBD server" lines before the JSON.
    text = (work / f"{server}-{name}-{r}.json").read_text()
    job = json.loads(text[text.index("{"):])["jobs"][0]
    return job["read"]["iops"] + job["write"]["iops"]
rows = []
for name in ["seq-read", "seq-write", "rand-read", "rand-write"]:
    g = [iops("grove", name, r) for r in range(1, rounds + 1)]
    q = [iops("qemu", name, r) for r in range(1, rounds + 1)]
    ratios = [a / b for a, b in zip(g, q)]
    rows.append({"workload": name, "grove_iops": statistics.median(g), "qemu_nbd_iops": statistics.median(q),
                 "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)})
stamp = datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")
(out / "nbd-vs-qemu.json").write_text(json.dumps({"date": stamp, "rounds": rounds, "runtime_s": runtime, "rows": rows}, indent=2))
lines = [f"fio nbd engine, 4 jobs x iodepth 16, unix socket, {rounds} alternating rounds of {runtime} s ({stamp})", "",
         "| workload | grove IOPS | qemu-nbd (raw) IOPS | grove / qemu-nbd (median, min-max) |", "|---|---:|---:|---|"]
for r in rows:
    lines.append(f"| {r['workload']} | {r['grove_iops']:.0f} | {r['qemu_nbd_iops']:.0f} | {r['ratio_median']:.2f} ({r['ratio_min']:.2f}-{r['ratio_max']:.2f}) |")
(out / "nbd-vs-qemu.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
