"""Reads of an archived snapshot (issue 37 point 8), run by the archive
workload at the end of its year, on the same pool and archives. The
snapshot read is the oldest one the archive keeps and the pool no longer
has: its blocks lie in packs placed over the whole year. `grove archive
restore` puts the same bytes back in the pool as a snapshot of its own
(the restore checks `grove hash` against the one recorded at push); that
copy is the pool's side of every comparison. For the reads the policy is
taken out of grove.toml, so that `grove serve`'s scheduler takes, pushes
and prunes nothing meanwhile, and `[archive] cache_size` is set to twice
the volume, so the cache holds the whole snapshot.

For each archive (file://, and the S3 gateway when there is one):

- random 4 KiB reads over NBD through one `grove serve` (fio's nbd
  engine, iodepth 16, one job, each block of the device read once per
  pass): the archived snapshot with its cache cold, then warm, then the
  pool's copy, then the archived snapshot and the copy again. `grove
  serve` keeps an archived snapshot's cache only while someone has the
  snapshot open (its readers share one open snapshot, dropped with the
  last), and fio's connection closes at the end of each pass: a qemu-io
  process holds the snapshot open across the passes, as a VM reading it
  would. Without it the second pass starts cold again.
- sequential 1 MiB reads over NBD (iodepth 4, the whole device once) of
  the archived snapshot in a fresh `grove serve` (cache cold), and of the
  pool's copy;
- against them, the other way back from object storage: `grove receive
  --from URL` of a full stream of the same snapshot, which `grove send
  --to` stored beforehand (untimed) beside the archive on the same kind of
  store. A receive writes the snapshot into a pool (a fresh one), so
  `grove archive restore` into a fresh pool is timed too: the archive's
  own way back, writing the same bytes.

On file://, the archive's and the stream's files are dropped from the
page cache (posix_fadvise DONTNEED, these files only) before each cold
read, so that cold means read from disk; the gateway's own caches are out
of reach. On the gateway a cold random read is one ranged GET per 4 KiB
block (about 560 a second here, at 256 MiB): the cold pass over a 1 GiB
snapshot takes some 8 minutes."""

import json
import os
import pathlib
import shutil
import subprocess
import urllib.parse

import fio
from procs import CommandError, run as run_command

RANDOM_IODEPTH = 16
SEQUENTIAL_IODEPTH = 4
COPY = "vm@pool-copy"
HOLDER_WAIT_S = 60


def archived_only(g, pool, url):
    """The oldest snapshot the archive at `url` keeps that the pool has not."""
    in_pool = {v["name"] for v in json.loads(g.cli(pool, "list", "--json")[0])}
    listing = json.loads(g.cli(pool, "archive", "list", "--to", url, "--json")[0])[0]
    kept = sorted(listing["snapshots"], key=lambda s: s["seq"])
    for snapshot in kept:
        if snapshot["name"] not in in_pool:
            return snapshot["name"]
    raise CommandError(f"{url}: every archived snapshot is still in the pool")


def set_archive(pool, base_toml, url, cache_bytes):
    """grove.toml as it was before the policy, with [archive] naming `url`."""
    text = base_toml + (f'\n[archive]\nlocation = "{url}"\n'
                        f'cache_size = "{cache_bytes >> 20}M"\n')
    (pool / "grove.toml").write_text(text)


def evict(path):
    """Drops the page cache of the files under `path` (a file:// store)."""
    if not path or not path.exists():
        return
    for root, _, files in os.walk(path):
        for name in files:
            try:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def local_dir(url):
    """The directory of a file:// URL, else None."""
    return pathlib.Path(url[len("file://"):]) if url.startswith("file://") else None


def fio_pass(sock, export, rw, bs, iodepth):
    """One pass of fio's nbd engine over the whole export: IOPS and MiB/s."""
    uri = fio.nbd_uri(sock, urllib.parse.quote(export, safe=""))
    out = run_command(["fio", "--name=read", "--ioengine=nbd", f"--uri={uri}", f"--rw={rw}",
                   f"--bs={bs}", f"--iodepth={iodepth}", "--numjobs=1",
                   "--output-format=json"], timeout=3600)[0]
    return fio.parse(out)


class Holder:
    """A qemu-io process that keeps an export open until closed."""

    def __init__(self, sock, export):
        uri = fio.nbd_uri(sock, urllib.parse.quote(export, safe=""))
        self.proc = subprocess.Popen(["qemu-io", "-r", "-f", "raw", uri], text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT)
        # It answers `length` once the export is open.
        self.proc.stdin.write("length\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer.strip() or self.proc.poll() is not None:
            self.close()
            raise CommandError(f"qemu-io could not open {uri}: {answer.strip()}")

    def close(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(HOLDER_WAIT_S)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


def random_reads(ctx, pool, label, snapshot, archive_dir):
    sock = ctx.work / f"archive-reads-{label}.sock"
    passes = {"archive": [], "pool": []}
    with ctx.grove.server(pool, sock, f"archive-reads-{label}.log"):
        evict(archive_dir)
        holder = Holder(sock, snapshot)
        try:
            for export, side in [(snapshot, "archive"), (snapshot, "archive"), (COPY, "pool"),
                                 (snapshot, "archive"), (COPY, "pool")]:
                passes[side].append(fio_pass(sock, export, "randread", "4k",
                                             RANDOM_IODEPTH)["iops"])
        finally:
            holder.close()
    cold, *warm = passes["archive"]
    pool_iops = passes["pool"]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {"cold_iops": cold, "warm_iops": warm, "pool_iops": pool_iops,
            "warm_over_pool": mean(warm) / mean(pool_iops) if mean(pool_iops) else None}


def sequential_reads(ctx, pool, label, snapshot, archive_dir):
    sock = ctx.work / f"archive-seq-{label}.sock"
    with ctx.grove.server(pool, sock, f"archive-seq-{label}.log"):
        evict(archive_dir)
        archived = fio_pass(sock, snapshot, "read", "1M", SEQUENTIAL_IODEPTH)["mib_s"]
        in_pool = fio_pass(sock, COPY, "read", "1M", SEQUENTIAL_IODEPTH)["mib_s"]
    return {"archive_cold_mib_s": archived, "pool_mib_s": in_pool}


def stream_url(url):
    """Where the comparison's stream goes: beside the archive, same store."""
    return f"{url.rstrip('/')}-streams/copy"


def ways_back(ctx, pool, label, url, snapshot, volume_bytes, run_measured):
    """`grove receive --from` of a stream of the snapshot against `grove
    archive restore` of it, each into a fresh pool: seconds, MiB/s, RSS."""
    g = ctx.grove
    stream = stream_url(url)
    g.cli(pool, "send", COPY, "--to", stream, timeout=3600)
    out = {}
    for way in ["receive", "restore"]:
        fresh = ctx.work / f"archive-{way}-{label}"
        g.init(fresh)
        evict(local_dir(stream) if way == "receive" else local_dir(url))
        args = ([g.grove, "--pool", fresh, "receive", "--from", stream, "vm@received"]
                if way == "receive" else
                [g.grove, "--pool", fresh, "archive", "restore", snapshot, "vm@restored",
                 "--volume", "vm", "--to", url])
        done = run_measured(args)
        out[way] = {"s": done["s"], "mib_s": volume_bytes / (1 << 20) / done["s"],
                    "peak_rss_bytes": done["peak_rss_bytes"]}
        shutil.rmtree(fresh, ignore_errors=True)
    return out


def run(ctx, pool, urls, volume_bytes, run_measured):
    """The read figures of every archive in `urls` (label -> URL)."""
    g = ctx.grove
    snapshot = archived_only(g, pool, urls["file"])
    toml = (pool / "grove.toml").read_text()
    base_toml = toml.split("\n[retention.volumes]")[0] + "\n"
    g.cli(pool, "archive", "restore", snapshot, COPY, "--to", urls["file"], timeout=3600)
    out = {"snapshot": snapshot, "volume_bytes": volume_bytes,
           "random_iodepth": RANDOM_IODEPTH, "sequential_iodepth": SEQUENTIAL_IODEPTH}
    try:
        for label, url in urls.items():
            set_archive(pool, base_toml, url, 2 * max(volume_bytes, 32 << 20))
            archive_dir = local_dir(url)
            out[label] = {
                "random_4k": random_reads(ctx, pool, label, snapshot, archive_dir),
                "sequential_1m": sequential_reads(ctx, pool, label, snapshot, archive_dir),
                "ways_back": ways_back(ctx, pool, label, url, snapshot, volume_bytes,
                                       run_measured),
            }
            ctx.log(f"archive reads ({label}): {summary_line(out[label])}")
    finally:
        (pool / "grove.toml").write_text(toml)
    return out


def summary_line(row):
    r, s, w = row["random_4k"], row["sequential_1m"], row["ways_back"]
    listed = lambda xs: "/".join(f"{x:.0f}" for x in xs)  # noqa: E731
    return (f"random 4K cold {r['cold_iops']:.0f}, warm {listed(r['warm_iops'])}, "
            f"pool {listed(r['pool_iops'])} IOPS (warm/pool {r['warm_over_pool']:.2f}); "
            f"sequential archive "
            f"{s['archive_cold_mib_s']:.0f}, pool {s['pool_mib_s']:.0f}, receive --from "
            f"{w['receive']['mib_s']:.0f}, archive restore {w['restore']['mib_s']:.0f} MiB/s")
