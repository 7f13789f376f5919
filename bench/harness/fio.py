"""fio jobs and their results. The same four jobs run against the plain
file (libaio, O_DIRECT) and against every NBD server (fio's nbd engine),
with the same numjobs, iodepth and runtime. Every run starts with no dirty
pages on the host (sync), so none pays for write-back another left behind."""

import json
import os

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


def run_file(profile, job, path, size_bytes):
    """A job on a plain file with direct I/O: the limit."""
    args = common_args(profile, job) + ["--ioengine=libaio", "--direct=1",
                                         f"--filename={path}", f"--size={size_bytes}"]
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


# Windowed logs: one row per job every LOG_WINDOW_MS, holding the window's
# IOPS (iops log) and its worst total latency in ns (lat log, with
# log_max_value), so that a span inside a run can be measured apart.
LOG_WINDOW_MS = 100


def logged_nbd_args(job, sock, export, runtime_s, numjobs, iodepth, log_prefix):
    """A time-based job through fio's nbd engine that writes windowed IOPS
    and worst-latency logs to LOG_PREFIX_{iops,lat}.N.log (N: job number)."""
    rw, bs = JOBS[job]
    return ["fio", "--name=job", f"--rw={rw}", f"--bs={bs}", f"--numjobs={numjobs}",
            f"--iodepth={iodepth}", f"--runtime={int(runtime_s * 1000)}ms", "--time_based",
            "--group_reporting", "--output-format=json", "--ioengine=nbd",
            f"--uri={nbd_uri(sock, export)}", f"--log_avg_msec={LOG_WINDOW_MS}",
            "--log_max_value=1", f"--write_iops_log={log_prefix}",
            f"--write_lat_log={log_prefix}"]


def parse_summary(text):
    """IOPS, worst and 99.9th percentile total latency (ms) of a
    group-reported run of one direction."""
    job = json.loads(text[text.index("{"):])["jobs"][0]
    side = job["write"] if job["write"]["total_ios"] else job["read"]
    pct = side["clat_ns"].get("percentile", {})
    return {"iops": side["iops"], "ios": side["total_ios"],
            "lat_max_ms": side["lat_ns"]["max"] / 1e6,
            "clat_p999_ms": pct.get("99.900000", 0) / 1e6}


def read_log(path):
    """(time ms, value) rows of one fio log file."""
    rows = []
    with open(path) as f:
        for line in f:
            fields = line.split(",")
            if len(fields) >= 2:
                rows.append((int(fields[0]), int(fields[1])))
    return rows


def span_figures(log_prefix, numjobs, start_ms, end_ms):
    """IOPS (all jobs) and worst total latency (ms) in the log windows that
    end within [start_ms, end_ms + LOG_WINDOW_MS) of a logged run: each
    window is counted where it ends, so the span is widened by one window."""
    iops = 0.0
    worst_ns = 0
    for n in range(1, numjobs + 1):
        inside = [v for t, v in read_log(f"{log_prefix}_iops.{n}.log")
                  if start_ms <= t < end_ms + LOG_WINDOW_MS]
        iops += sum(inside) / len(inside) if inside else 0.0
        worst_ns = max([worst_ns] + [v for t, v in read_log(f"{log_prefix}_lat.{n}.log")
                                     if start_ms <= t < end_ms + LOG_WINDOW_MS])
    return {"iops": iops, "lat_max_ms": worst_ns / 1e6}
