"""grove on RADOS against RBD (issue 38 point 7), on the one Ceph cluster
of $CEPH_CONF (scripts/ceph.sh), in a pool of the bench's own (POOL):

- fio through `grove serve` on a pool in RADOS (`grove init --pool
  rados://POOL/NAME`, fio's nbd engine) against fio's rbd engine on an RBD
  image of the same size and the same 4 MiB objects, and `rados bench` as
  the cluster's limit: random 4K reads and writes, 1 MiB sequential reads
  and writes, both images written whole first;
- the first writes after a snapshot, against the writes just before it;
- 100 snapshots taken while fio writes, then removed while fio writes
  (grove: `grove rm` each and `grove gc --wait`; RBD: `rbd snap rm` each
  and the OSD's snapshot trimming, waited for): foreground IOPS while
  removing against the seconds just before, in the same fio run;
- takeover: kill -9 of the holder, to the first write served by the next
  (grove: `grove serve --takeover` on another host directory; RBD: a new
  librbd client's write, which must wait for the dead one's lock).

Writes on both sides are stored when acknowledged: grove-rados writes are
synchronous in librados, and RBD runs with librbd's cache off
(CEPH_ARGS=--rbd_cache=false; its default cache acknowledges writes
before the OSD has them). The OSD's HDD defaults stay, except that
snapshot trimming's sleep is 0 while the removal runs (with the HDD
default of 5 s a step, trimming 100 snapshots takes hours); the settings
each side ran with are in the results."""

import json
import os
import shutil
import signal
import subprocess
import time

import fio
import procs
from procs import CommandError, Server

POOL = "grove-bench"
GROVE_NAME = "bench"
RBD_IMAGE = "grove-bench-img"
OBJECT_BYTES = 4 << 20
RBD_ENV = {"CEPH_ARGS": "--rbd_cache=false"}
TRIM_SLEEP_OPTION = "osd_snap_trim_sleep_hdd"
# A quiet span of fio before each removal starts, to compare against.
QUIET_LEAD_S = 8.0
# Longest the removal window may run (RBD's trimming included).
REMOVAL_MAX_S = 600.0
TAKEOVER_MAX_S = 120.0
IOPS_LOG_MS = 250


def run(ctx):
    p = ctx.profile
    need_cluster()
    work = ctx.dir("rados")
    ensure_pool()
    result = {"pool": POOL, "image_bytes": p.rados_image_bytes, "object_bytes": OBJECT_BYTES,
              "runtime_s": p.rados_runtime_s, "settings": settings(p)}
    result["rados_bench"] = rados_bench(ctx, p)
    location = f"rados://{POOL}/{GROVE_NAME}-{os.getpid()}"
    grove = GroveSide(ctx, work, location)
    rbd = RbdSide(ctx, work, f"{RBD_IMAGE}-{os.getpid()}")
    try:
        for side in (grove, rbd):
            result[side.name] = measure_side(ctx, p, side)
    finally:
        grove.clean_up()
        rbd.clean_up()
    return result


def measure_side(ctx, p, side):
    """A side's figures; one that fails keeps the figures it got, with
    the error, so that a late step's failure loses none of the others."""
    try:
        return side.measure(p)
    except (CommandError, subprocess.SubprocessError, OSError, ValueError, KeyError) as e:
        ctx.log(f"rados: {side.name}: FAILED: {e}")
        procs.stop_all()
        return {**side.out, "error": str(e)}


def sh(args, timeout=600, env=None):
    full_env = {**os.environ, **env} if env else None
    return procs.run(args, timeout=timeout, env=full_env)


def need_cluster():
    if not os.environ.get("CEPH_CONF"):
        raise CommandError("rados: no Ceph cluster: CEPH_CONF is not set "
                           "(scripts/ceph.sh start; source /var/tmp/grove-ceph/env.sh)")
    for tool in ("ceph", "rados", "rbd"):
        if shutil.which(tool) is None:
            raise CommandError(f"rados: {tool} is missing (apt-get install ceph-common)")
    out, _ = sh(["fio", "--enghelp=rbd"])
    if "rbdname" not in out:
        raise CommandError("rados: this fio has no rbd engine (Debian's fio has it, with librbd1)")


def ensure_pool():
    """The bench's pool, made once (the cluster forbids deleting pools),
    ready for RBD images."""
    out, _ = sh(["ceph", "osd", "pool", "ls"])
    if POOL not in out.split():
        sh(["ceph", "osd", "pool", "create", POOL])
        sh(["rbd", "pool", "init", POOL])


def settings(p):
    trim_sleep, _ = sh(["ceph", "config", "get", "osd", TRIM_SLEEP_OPTION])
    rotational, _ = sh(["ceph", "osd", "metadata", "0", "-f", "json"])
    return {
        "osd_rotational": json.loads(rotational).get("rotational"),
        "osd_snap_trim_sleep_hdd_default": trim_sleep.strip(),
        "osd_snap_trim_sleep_hdd_during_removal": "0",
        "rbd": "librbd cache off (CEPH_ARGS=--rbd_cache=false), fio rbd engine, 1 job x "
               f"iodepth {p.numjobs * p.iodepth} (several jobs on one image pass its "
               "exclusive lock back and forth), 4 MiB objects, no striping",
        "grove": f"grove serve, fio nbd engine over a unix socket, {p.numjobs} jobs x iodepth "
                 f"{p.iodepth}; RadosDevice, 4 MiB objects, synchronous librados writes",
        "rados_bench": f"{p.numjobs * p.iodepth} in flight",
    }


# --- rados bench: the cluster's limit -------------------------------------

def rados_bench(ctx, p):
    """4 KiB and 4 MiB objects written, then read (random and sequential)."""
    inflight = str(p.numjobs * p.iodepth)
    seconds = str(max(1, int(p.rados_runtime_s)))
    out = {}
    for size, read_mode in (("4096", "rand"), ("4194304", "seq")):
        name = f"grove-bench-{size}-{os.getpid()}"
        ctx.log(f"rados: rados bench, {size}-byte objects")
        common = ["-p", POOL, "--run-name", name]
        try:
            written, _ = sh(["rados", "bench", *common, seconds, "write", "-b", size,
                             "-t", inflight, "--no-cleanup"])
            read, _ = sh(["rados", "bench", *common, seconds, read_mode, "-t", inflight])
        finally:
            sh(["rados", "-p", POOL, "cleanup", "--run-name", name])
        out[f"{size}_write"] = parse_rados_bench(written)
        out[f"{size}_{read_mode}"] = parse_rados_bench(read)
    return out


def parse_rados_bench(text):
    figures = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Bandwidth (MB/sec)":
            figures["mib_s"] = float(value)
        elif key.strip() == "Average IOPS":
            figures["iops"] = float(value)
    if "iops" not in figures:
        raise CommandError(f"rados bench printed no Average IOPS: {text[-500:]}")
    return figures


# --- what both sides measure ----------------------------------------------

class Side:
    """One side of the comparison: how it runs fio, takes and removes
    snapshots and is taken over; `measure` runs the same steps on both."""

    name = ""

    def __init__(self, ctx, work):
        self.ctx = ctx
        self.work = work
        # The figures so far.
        self.out = {}

    def measure(self, p):
        out = self.out
        self.ctx.log(f"rados: {self.name}: setting up, writing the image whole")
        with self.started(p):
            _, out["fill_s"] = sh(self.fill_args(p), env=self.env)
            out["jobs"] = {}
            for job in fio.JOBS:
                self.ctx.log(f"rados: {self.name}: {job}")
                out["jobs"][job] = self.fio(p, job, p.rados_runtime_s)
            out["first_write"] = self.first_write(p)
            out["snapshots"] = self.snapshots_under_writes(p)
            out["removal"] = self.removal_under_writes(p)
        self.ctx.log(f"rados: {self.name}: takeover")
        out["takeover"] = self.takeover(p)
        return out

    def fio(self, p, job, seconds, extra=()):
        rw, bs = fio.JOBS[job]
        args = self.fio_args(p) + [
            "--name=job", f"--rw={rw}", f"--bs={bs}", f"--runtime={int(seconds * 1000)}ms",
            "--time_based", "--group_reporting", "--output-format=json", *extra]
        out, _ = sh(args, timeout=seconds + 300, env=self.env)
        return fio.parse(out)

    def first_write(self, p):
        """Random 4K writes just before a snapshot, then the first writes
        after it (fio's random map: no block twice in a run)."""
        self.ctx.log(f"rados: {self.name}: first writes after a snapshot")
        extra = self.regions(p)
        before = self.fio(p, "rand-write", p.rados_runtime_s, extra)
        _, snapshot_s = sh(self.snapshot_args(1), env=self.env)
        after = self.fio(p, "rand-write", p.rados_runtime_s, extra)
        return {"before_iops": before["iops"], "after_iops": after["iops"],
                "ratio": after["iops"] / before["iops"], "snapshot_s": snapshot_s}

    def snapshots_under_writes(self, p):
        """Snapshots 2..N, spread over a window of random 4K writes (the
        first was taken by first_write)."""
        count = p.rados_snapshots
        self.ctx.log(f"rados: {self.name}: {count} snapshots under writes")
        gap_s = p.rados_snapshot_gap_s

        def during(_started):
            times = []
            for i in range(2, count + 1):
                time.sleep(gap_s)
                times.append(sh(self.snapshot_args(i), env=self.env)[1])
            return times
        summary, times = self.logged_window(p, "snapshots", REMOVAL_MAX_S, during,
                                             stop_after=True)
        return {"count": count, "fio_iops": summary["iops"],
                "snapshot_s_median": sorted(times)[len(times) // 2] if times else None}

    def removal_under_writes(self, p):
        """Every snapshot removed (and its space given back) while fio
        writes; IOPS during that against the quiet seconds before it."""
        self.ctx.log(f"rados: {self.name}: removing {p.rados_snapshots} snapshots under writes")

        def during(started):
            time.sleep(QUIET_LEAD_S)
            t = {"start_ms": fio.ms_since(started)}
            t.update(self.remove_snapshots(p.rados_snapshots))
            t["end_ms"] = fio.ms_since(started)
            time.sleep(1.0)
            return t
        _, t = self.logged_window(p, "removal", REMOVAL_MAX_S, during, stop_after=True)
        prefix = self.work / f"{self.name}-removal"
        quiet = span_iops(prefix, 1000.0, QUIET_LEAD_S * 1000.0)
        busy = span_iops(prefix, t["start_ms"], t["end_ms"])
        return {**t, "quiet_iops": quiet, "during_iops": busy,
                "ratio": busy / quiet if quiet else None,
                "removal_s": (t["end_ms"] - t["start_ms"]) / 1000.0}

    def logged_window(self, p, what, seconds, during, stop_after=False):
        """fio's random 4K writes for `seconds`, logging IOPS every
        IOPS_LOG_MS, while `during(started)` runs; with stop_after, fio is
        stopped (SIGINT: it writes its logs and summary) once during returns."""
        rw, bs = fio.JOBS["rand-write"]
        prefix = self.work / f"{self.name}-{what}"
        args = self.fio_args(p) + [
            "--name=job", f"--rw={rw}", f"--bs={bs}", f"--runtime={int(seconds * 1000)}ms",
            "--time_based", "--group_reporting", "--output-format=json",
            f"--write_iops_log={prefix}", f"--log_avg_msec={IOPS_LOG_MS}",
            "--log_unix_epoch=1"]
        os.sync()
        started = fio.mark_origin(prefix)
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env={**os.environ, **(self.env or {})})
        try:
            events = during(started)
            if stop_after:
                proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=seconds + 120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        # Stopped by SIGINT, fio exits 128 after writing its summary.
        stopped = stop_after and "{" in out
        if proc.returncode != 0 and not stopped:
            raise CommandError(f"fio ({self.name}, {what}) exited {proc.returncode}: "
                               f"{err.strip()[-2000:]}")
        return fio.parse(out), events

    def time_first_write(self, write_args, killed_at, env=None):
        """Seconds from killed_at until `write_args` first succeeds."""
        while True:
            proc = subprocess.run(write_args, capture_output=True, text=True,
                                  env={**os.environ, **(env or {})}, timeout=TAKEOVER_MAX_S)
            if proc.returncode == 0 and "error" not in proc.stdout.lower():
                return time.monotonic() - killed_at
            if time.monotonic() - killed_at > TAKEOVER_MAX_S:
                raise CommandError(f"{self.name}: no write served {TAKEOVER_MAX_S:.0f} s after "
                                   f"kill -9: {proc.stdout[-300:]} {proc.stderr[-500:]}")
            time.sleep(0.05)


def span_iops(prefix, start_ms, end_ms):
    """Mean IOPS over [start_ms, end_ms] (ms since fio.mark_origin(prefix))
    of a run logged with --write_iops_log, all jobs summed."""
    origin_ms = float(fio.origin_path(prefix).read_text())
    total = 0.0
    n = 1
    while os.path.exists(f"{prefix}_iops.{n}.log"):
        rows = []
        with open(f"{prefix}_iops.{n}.log") as f:
            for line in f:
                fields = line.split(",")
                rows.append((int(fields[0]) - origin_ms, int(fields[1])))
        # Rows whole inside the span; a span shorter than a row takes the
        # rows that overlap it.
        values = [v for t, v in rows if start_ms + IOPS_LOG_MS <= t <= end_ms] or \
            [v for t, v in rows if start_ms <= t <= end_ms + IOPS_LOG_MS]
        total += sum(values) / len(values) if values else 0.0
        n += 1
    return total


# --- grove serve on a pool in RADOS ----------------------------------------

class GroveSide(Side):
    name = "grove"

    def __init__(self, ctx, work, location):
        super().__init__(ctx, work)
        self.location = location
        self.sock = work / "grove.sock"
        self.server = None
        # One "host": its directory for RADOS pools; the scheduler idle.
        self.env = self.host_env("host-a")

    def host_env(self, host):
        return {"GROVE_RADOS_DIR": str(self.work / host),
                "GROVE_CLOCK_FILE": str(self.work / "no-clock")}

    def grove(self, *args):
        return [self.ctx.grove.grove, "--pool", self.location, *map(str, args)]

    def started(self, p):
        mib = p.rados_image_bytes >> 20
        sh(self.grove("init", "--capacity", f"{4 * mib}M"), env=self.env)
        sh(self.grove("create", "disk", "--size", f"{mib}M"), env=self.env)
        self.server = self.serve(self.env)
        return self.server

    def serve(self, env, *flags):
        return Server("grove serve", self.grove("serve", "--socket", self.sock, *flags),
                      self.sock, self.ctx.work / "rados-grove.log",
                      env={**os.environ, **env})

    def fio_args(self, p):
        return ["fio", "--ioengine=nbd", f"--uri={fio.nbd_uri(self.sock, 'disk')}",
                f"--numjobs={p.numjobs}", f"--iodepth={p.iodepth}"]

    def fill_args(self, p):
        return ["fio", "--ioengine=nbd", f"--uri={fio.nbd_uri(self.sock, 'disk')}",
                "--name=fill", "--rw=write", "--bs=1M", "--iodepth=16",
                f"--size={p.rados_image_bytes}"]

    def regions(self, p):
        region = p.rados_image_bytes // p.numjobs
        return [f"--size={region}", f"--offset_increment={region}"]

    def snapshot_args(self, i):
        return self.grove("snapshot", "disk", f"disk@{i}")

    def remove_snapshots(self, count):
        started = time.monotonic()
        for i in range(1, count + 1):
            sh(self.grove("rm", f"disk@{i}"), env=self.env)
        removed = time.monotonic()
        sh(self.grove("gc", "--wait"), env=self.env)
        return {"rm_s": removed - started, "reclaim_s": time.monotonic() - removed}

    def takeover(self, p):
        """kill -9 of the serving process; `grove serve --takeover` from
        another host directory; seconds until qemu-io's write through it
        returns."""
        # --takeover here too: a server stopped before may have been
        # killed when it outlasted its grace, still holding the lock.
        with self.serve(self.env, "--takeover") as holder:
            sh(["qemu-io", "-f", "raw", "-c", "write 0 4k", fio.nbd_uri(self.sock, "disk")])
            killed_at = time.monotonic()
            os.kill(holder.pid, signal.SIGKILL)
            holder.proc.wait()
            with self.serve(self.host_env("host-b"), "--takeover") as taker:
                seconds = self.time_first_write(
                    ["qemu-io", "-f", "raw", "-c", "write 4k 4k",
                     fio.nbd_uri(self.sock, "disk")], killed_at)
                return {"seconds": seconds, "serve_ready_s": taker.ready_s}

    def clean_up(self):
        procs.stop_all()
        prefix = self.location.rsplit("/", 1)[1] + "."
        out, _ = sh(["rados", "-p", POOL, "ls"])
        names = [n for n in out.split() if n.startswith(prefix)]
        for i in range(0, len(names), 100):
            sh(["rados", "-p", POOL, "rm", *names[i:i + 100]])


# --- RBD, librbd's cache off -----------------------------------------------

class RbdSide(Side):
    name = "rbd"

    def __init__(self, ctx, work, image):
        super().__init__(ctx, work)
        self.image = image
        self.spec = f"{POOL}/{image}"
        self.env = RBD_ENV
        self.created = False

    def started(self, p):
        sh(["rbd", "create", "--size", f"{p.rados_image_bytes >> 20}M",
            "--object-size", f"{OBJECT_BYTES >> 20}M", self.spec])
        self.created = True
        return NoServer()

    def fio_args(self, p):
        client = os.environ.get("CEPH_ID", "admin")
        return ["fio", "--ioengine=rbd", f"--clientname={client}", f"--pool={POOL}",
                f"--rbdname={self.image}", "--invalidate=0", "--numjobs=1",
                f"--iodepth={p.numjobs * p.iodepth}"]

    def fill_args(self, p):
        return self.fio_args(p) + ["--name=fill", "--rw=write", "--bs=1M",
                                   f"--size={p.rados_image_bytes}"]

    def regions(self, p):
        return []

    def snapshot_args(self, i):
        return ["rbd", "snap", "create", f"{self.spec}@s{i}"]

    def remove_snapshots(self, count):
        """`rbd snap rm` of each, then the OSD's trimming of their objects,
        with trimming's HDD sleep at 0 meanwhile."""
        before, _ = sh(["ceph", "config", "get", "osd", TRIM_SLEEP_OPTION])
        sh(["ceph", "config", "set", "osd", TRIM_SLEEP_OPTION, "0"])
        try:
            started = time.monotonic()
            for i in range(1, count + 1):
                sh(["rbd", "snap", "rm", f"{self.spec}@s{i}"], env=self.env)
            removed = time.monotonic()
            wait_for_trimming(REMOVAL_MAX_S)
            return {"rm_s": removed - started, "reclaim_s": time.monotonic() - removed}
        finally:
            sh(["ceph", "config", "set", "osd", TRIM_SLEEP_OPTION, before.strip()])

    def takeover(self, p):
        """kill -9 of a librbd client writing (holding the image's
        exclusive lock); seconds until a new client's write returns."""
        args = self.fio_args(p) + ["--name=holder", "--rw=randwrite", "--bs=4k",
                                   "--runtime=600s", "--time_based"]
        holder = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  env={**os.environ, **self.env})
        try:
            time.sleep(3.0)
            killed_at = time.monotonic()
            holder.kill()
            holder.wait()
            seconds = self.time_first_write(
                ["rbd", "bench", "--io-type", "write", "--io-size", "4096", "--io-threads", "1",
                 "--io-total", "4096", self.spec], killed_at, env=self.env)
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait()
        return {"seconds": seconds}

    def clean_up(self):
        if not self.created:
            return
        deadline = time.monotonic() + 90
        while True:
            try:
                sh(["rbd", "snap", "purge", self.spec])
                sh(["rbd", "rm", self.spec])
                return
            except CommandError:
                # A killed client's watch lasts until it times out.
                if time.monotonic() > deadline:
                    raise
                time.sleep(2)


class NoServer:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def wait_for_trimming(max_s):
    """Until no placement group of POOL trims snapshots or waits to, and
    the OSD map queues none of its removed snapshots for trimming."""
    deadline = time.monotonic() + max_s
    quiet_polls = 0
    while quiet_polls < 3:
        if time.monotonic() > deadline:
            raise CommandError(f"snapshot trimming still running after {max_s:.0f} s")
        time.sleep(0.5)
        quiet_polls = 0 if trimming() else quiet_polls + 1


def trimming():
    out, _ = sh(["ceph", "pg", "ls-by-pool", POOL, "-f", "json"])
    data = json.loads(out)
    stats = data["pg_stats"] if isinstance(data, dict) else data
    if any("snaptrim" in pg["state"] for pg in stats):
        return True
    out, _ = sh(["ceph", "osd", "dump", "-f", "json"])
    dump = json.loads(out)
    pool_ids = [x["pool"] for x in dump["pools"] if x["pool_name"] == POOL]
    return any(q["pool"] in pool_ids and q.get("snaps")
               for q in dump.get("removed_snaps_queue", []))
