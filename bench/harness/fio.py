"""fio jobs and their results. The same four jobs run against the plain
file (libaio, O_DIRECT) and against every NBD server (fio's nbd engine),
with the same numjobs, iodepth and runtime. Every run starts with no dirty
pages on the host (sync), so none pays for write-back another left behind."""

import json
import os
import pathlib
import time

from procs import run

# name -> (fio rw, block size)
JOBS = {
    "seq-read": ("read", "1M"),
    "seq-write": ("write", "1M"),
    "rand-read": ("randread", "4k"),
    "rand-write": ("randwrite", "4k"),
}


def nbd_uri(sock, export):
    return f"nbd+unix:///{export}?socket={sock}"


def common_args(profile, job, name="job"):
    rw, bs = JOBS[job]
    return ["fio", f"--name={name}", f"--rw={rw}", f"--bs={bs}",
            f"--numjobs={profile.numjobs}", f"--iodepth={profile.iodepth}",
            f"--runtime={int(profile.runtime_s * 1000)}ms", "--time_based",
            "--group_reporting", "--output-format=json"]


def parse(text):
    """IOPS and MiB/s of a group-reported fio run. The nbd engine prints
    lines of its own before the JSON."""
    result = json.loads(text[text.index("{"):])
    job = result["jobs"][0]
    iops = job["read"]["iops"] + job["write"]["iops"]
    bw_kib = job["read"]["bw"] + job["write"]["bw"]
    return {"iops": iops, "mib_s": bw_kib / 1024}


def run_clean(profile, args):
    """Runs fio once the host has no dirty pages (sync), and parses it."""
    os.sync()
    out, _ = run(args, timeout=profile.runtime_s + 120)
    return parse(out)


def run_file(profile, job, path, size_bytes, cache="direct"):
    """A job on a plain file: the limit. Direct: libaio at the profile's
    depth, past the host's page cache. Buffered: each of the jobs a
    pread/pwrite loop through the page cache (fio's psync engine), which is
    what a buffered server does with the requests it has, so a buffered
    server compares with the limit in its own cache mode."""
    if cache == "direct":
        engine = ["--ioengine=libaio", "--direct=1"]
    else:
        engine = ["--ioengine=psync", "--direct=0"]
    args = common_args(profile, job) + engine + [f"--filename={path}", f"--size={size_bytes}"]
    return run_clean(profile, args)


def run_nbd(profile, job, sock, export, extra=()):
    """A job through fio's nbd engine on one export."""
    args = common_args(profile, job) + ["--ioengine=nbd", f"--uri={nbd_uri(sock, export)}"]
    return run_clean(profile, args + list(extra))


def run_nbd_exports(profile, job, sock, exports):
    """One job per export, numjobs each, reported as one group."""
    rw, bs = JOBS[job]
    args = ["fio", f"--rw={rw}", f"--bs={bs}", f"--iodepth={profile.iodepth}",
            f"--runtime={int(profile.runtime_s * 1000)}ms", "--time_based",
            "--group_reporting", "--output-format=json", "--ioengine=nbd"]
    for i, export in enumerate(exports):
        args += [f"--name=job{i}", f"--uri={nbd_uri(sock, export)}"]
    return run_clean(profile, args)


# Windowed logs: one row per job every LOG_WINDOW_MS, holding the
# histogram of that window's completion latencies (fio's hist log), so that
# a span inside a run has its own IOPS (the rows' counts) and worst latency
# (the highest bin used, within 1/64 of the true value).
LOG_WINDOW_MS = 100
# fio's histogram bins: 64 per power of two (FIO_IO_U_PLAT_BITS = 6).
PLAT_BITS = 6


def logged_nbd_args(job, sock, export, runtime_s, numjobs, iodepth, log_prefix):
    """A time-based job through fio's nbd engine that writes windowed
    latency histograms to LOG_PREFIX_clat_hist.N.log (N: job number).
    Rows are stamped on the wall clock (ms since the Unix epoch): fio's
    own clock starts once its jobs are set up, 100s of ms after fio is
    started, and spans timed by the harness would land that far off."""
    rw, bs = JOBS[job]
    return ["fio", "--name=job", f"--rw={rw}", f"--bs={bs}", f"--numjobs={numjobs}",
            f"--iodepth={iodepth}", f"--runtime={int(runtime_s * 1000)}ms", "--time_based",
            "--group_reporting", "--output-format=json", "--ioengine=nbd",
            f"--uri={nbd_uri(sock, export)}", f"--log_hist_msec={LOG_WINDOW_MS}",
            f"--write_hist_log={log_prefix}", "--log_unix_epoch=1"]


def mark_origin(log_prefix):
    """Records now, on the wall clock, as the time base of LOG_PREFIX's
    rows, and returns it (seconds since the epoch): spans given to
    span_figures are in ms since then (`ms_since`). Call it just before
    starting fio."""
    now = time.time()
    origin_path(log_prefix).write_text(f"{now * 1000:.3f}\n")
    return now


def ms_since(origin):
    """ms since ORIGIN (mark_origin's), on the same wall clock."""
    return (time.time() - origin) * 1000.0


def origin_path(log_prefix):
    return pathlib.Path(f"{log_prefix}_origin_ms")


def parse_summary(text):
    """IOPS, worst and 99.9th percentile completion latency (ms) of a
    group-reported run of one direction."""
    job = json.loads(text[text.index("{"):])["jobs"][0]
    side = job["write"] if job["write"]["total_ios"] else job["read"]
    pct = side["clat_ns"].get("percentile", {})
    return {"iops": side["iops"], "ios": side["total_ios"],
            "lat_max_ms": side["clat_ns"]["max"] / 1e6,
            "clat_p999_ms": pct.get("99.900000", 0) / 1e6}


def bin_ns(index):
    """The latency (ns) a histogram bin stands for (fio's plat_idx_to_val)."""
    per_power = 1 << PLAT_BITS
    if index < per_power << 1:
        return index
    error_bits = (index >> PLAT_BITS) - 1
    return (1 << (error_bits + PLAT_BITS)) + (index % per_power + 0.5) * (1 << error_bits)


def read_hist_log(path, origin_ms):
    """(time ms since ORIGIN_MS, completions, worst ns) per row of one fio
    hist log stamped on the wall clock."""
    rows = []
    with open(path) as f:
        for line in f:
            fields = line.split(",")
            counts = [int(c) for c in fields[3:]]
            used = [i for i, c in enumerate(counts) if c]
            rows.append((int(fields[0]) - origin_ms, sum(counts),
                         bin_ns(used[-1]) if used else 0))
    return rows


def span_figures(log_prefix, numjobs, start_ms, end_ms):
    """IOPS (all jobs) and worst completion latency (ms) over [start_ms,
    end_ms] of a logged run, from the rows that end within it or one
    window after (a row covers the time since the job's previous row, or
    one window for its first), and at least the first row that ends after
    start_ms: on a loaded machine fio's rows come late, and a span shorter
    than a window may see none in time. Times are ms since
    mark_origin(log_prefix)."""
    origin_ms = float(origin_path(log_prefix).read_text())
    iops = 0.0
    worst_ns = 0
    for n in range(1, numjobs + 1):
        ios = covered_ms = 0
        previous = None
        for t, count, worst in read_hist_log(f"{log_prefix}_clat_hist.{n}.log", origin_ms):
            if previous is None:
                previous = t - LOG_WINDOW_MS
            if start_ms <= t and (t < end_ms + LOG_WINDOW_MS or covered_ms == 0):
                ios += count
                covered_ms += t - previous
                worst_ns = max(worst_ns, worst)
            previous = t
        iops += ios / (covered_ms / 1000.0) if covered_ms else 0.0
    return {"iops": iops, "lat_max_ms": worst_ns / 1e6}
