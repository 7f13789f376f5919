"""The archive tier (issue 37 point 8): a simulated year of daily snapshots
of a volume of random data, `archive_daily_fraction` of its 4 KiB blocks
rewritten at random each day and `archive_weekly_fraction` every 7th day
(`grove-bench scribble`, which writes the same blocks into a raw image).
Each day grove takes the snapshot due (`grove snapshot --auto --now`,
checked against the calendar's rank), pushes what the archive keeps
(`grove archive push`), expires the archive (`grove archive expire --now`)
and prunes the pool; restic, beside it,
backs up the day's image (`restic backup --time`) and runs `restic forget
--prune` with the same keep counts (daily 7, weekly 4, monthly 12, yearly
3). With $GROVE_TEST_S3_BUCKET and AWS_* set (scripts/ceph.sh), grove also
pushes to and expires an archive on the S3 gateway.

Per day and peer: wall time and peak RSS of the push (backup) and of the
expiry (forget --prune), each measured on its own process (GNU time's
peak RSS), and the bytes each process wrote to storage (its rusage block
output). Over
the year: bytes written, bytes expiry copied, the store's size against
what the kept snapshots need (grove's exact distinct block versions,
`needed_bytes`, for both: the same blocks are kept). After the year,
archive_reads.py measures reads of an archived snapshot ("reads")."""

import datetime
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

from . import archive_reads

KEEP = {"daily": 7, "weekly": 4, "monthly": 12, "yearly": 3}
DAY_S = 86_400
# 2026-01-01 00:00 UTC plus an hour.
START = 1_767_225_600 + 3600


class Child(subprocess.Popen):
    """A Popen that keeps the rusage of its own wait."""

    def _try_wait(self, wait_flags):
        pid, status, usage = os.wait4(self.pid, wait_flags)
        if pid == self.pid:
            self.usage = usage
        return pid, status


# GNU time measures each command's peak RSS. wait4's own ru_maxrss cannot:
# Linux carries the high-water mark of the address space a child replaced
# at exec, which for a child of this harness is the harness's own (a copy
# of a 200 MiB Python reported 213 MiB for /bin/true). time's child is
# forked from time, a process of a few MiB.
TIME = "/usr/bin/time"
# Where time writes its figure: in memory, so that its write is not
# counted as the command's block output.
RSS_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None


def run_measured(args, env=None):
    """Runs args; its wall time, peak RSS and bytes written to storage."""
    started = time.monotonic()
    with tempfile.NamedTemporaryFile("r", prefix="grove-bench-rss.", dir=RSS_DIR) as peak:
        proc = Child([TIME, "-f", "%M", "-o", peak.name] + [str(a) for a in args],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        out, err = proc.communicate()
        seconds = time.monotonic() - started
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(map(str, args))} exited {proc.returncode}: "
                               f"{err[-2000:]}")
        # The last line: time puts "Command exited ..." lines above it.
        peak_kib = int(peak.read().split()[-1])
    usage = getattr(proc, "usage", None)
    return {"out": out, "s": seconds, "peak_rss_bytes": peak_kib * 1024,
            # Block output is counted per process from its fork (time's
            # own is none: its figure goes to RSS_DIR), so wait4's is the
            # command's.
            "written_bytes": usage.ru_oublock * 512 if usage else None}


def dir_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except FileNotFoundError:
                pass
    return total


def s3_url():
    bucket = os.environ.get("GROVE_TEST_S3_BUCKET")
    if not bucket:
        return None
    return f"s3://{bucket}/bench-archive-{os.getpid()}-{int(time.time())}"


def grove_day(ctx, pool, day, now, urls):
    g = ctx.grove
    take_ranked(g, pool, day, now)
    row = {}
    for label, url in urls.items():
        push = run_measured([g.grove, "--pool", pool, "archive", "push", "--to", url, "--json"])
        expire = run_measured([g.grove, "--pool", pool, "archive", "expire", "--to", url,
                               "--now", f"@{now}", "--json"])
        reports = json.loads(expire["out"])
        listing = json.loads(g.cli(pool, "archive", "list", "--to", url, "--json")[0])[0]
        row[label] = {
            "push_s": push["s"], "push_peak_rss_bytes": push["peak_rss_bytes"],
            "push_written_bytes": push["written_bytes"],
            "expire_s": expire["s"], "expire_peak_rss_bytes": expire["peak_rss_bytes"],
            "expire_copied_bytes": sum(r["bytes_copied"] for r in reports),
            "expired": sum(len(r["expired"]) for r in reports),
            # The store: packs and indexes (catalogs add a few KiB).
            "stored_bytes": listing["stored_bytes"] + listing["index_bytes"],
            "pack_bytes": listing["stored_bytes"], "index_bytes": listing["index_bytes"],
            "needed_bytes": listing["needed_bytes"],
            "kept": len(listing["snapshots"]), "totals": listing["totals"],
        }
    g.cli(pool, "prune", "--now", f"@{now}")
    return row


def configure(pool, location):
    """The bench's policy for vm (the pool keeps 2 dailies, the archive
    KEEP) and `location` as the pool's archive. The ranker counts the
    snapshots archived there when it decides which level is due, and the
    pool keeps only its last two: with no configured archive (pushes to
    --to locations only, and a prune that ignores the archive) it forgot
    the year's yearly after two days and ranked every third day yearly
    again, so the archive kept 36 days of "yearlies" and "monthlies"
    instead of a year, and copied the whole first snapshot out when the
    twelfth newer one pushed it out on day 33. Appended after the
    policy: archive_reads.py cuts grove.toml at the policy."""
    policy = ", ".join(f"{k} = {v}" for k, v in KEEP.items())
    with open(pool / "grove.toml", "a") as toml:
        toml.write(f"\n[retention.volumes]\nvm = {{ daily = 2, archive = {{ {policy} }} }}\n"
                   f'\n[archive]\nlocation = "{location}"\n')


def calendar_rank(day, now):
    """The level the scheduler must give the day's snapshot (one a day,
    from START): the highest whose period the day opens."""
    if day == 0:
        return "yearly"
    today = datetime.datetime.fromtimestamp(now, datetime.timezone.utc)
    before = datetime.datetime.fromtimestamp(now - DAY_S, datetime.timezone.utc)
    if today.year != before.year:
        return "yearly"
    if today.month != before.month:
        return "monthly"
    if today.isocalendar()[:2] != before.isocalendar()[:2]:
        return "weekly"
    return "daily"


def take_ranked(g, pool, day, now):
    """`grove snapshot --auto`, failing the run unless the snapshot got the
    calendar's rank (a ranker that cannot see the archive ranks wrongly,
    and every figure after it measures the wrong retention)."""
    out, _ = g.cli(pool, "snapshot", "--auto", "vm", "--now", f"@{now}")
    want = calendar_rank(day, now)
    if not out.rstrip().endswith(f"({want})"):
        raise RuntimeError(f"archive day {day}: grove snapshot --auto said {out.strip()!r}, "
                           f"the calendar ranks it {want}")
    return want


def restic_day(repo, image, now, env):
    date = datetime.datetime.fromtimestamp(now, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    backup = run_measured(["restic", "-r", repo, "backup", "--time", date, "--json", "--quiet",
                           image], env=env)
    keep = [a for level, n in KEEP.items() for a in (f"--keep-{level}", str(n))]
    prune = run_measured(["restic", "-r", repo, "forget", "--prune", *keep], env=env)
    snapshots = json.loads(run_measured(["restic", "-r", repo, "snapshots", "--json"], env=env)["out"])
    return {"backup_s": backup["s"], "backup_peak_rss_bytes": backup["peak_rss_bytes"],
            "backup_written_bytes": backup["written_bytes"],
            "prune_s": prune["s"], "prune_peak_rss_bytes": prune["peak_rss_bytes"],
            "prune_written_bytes": prune["written_bytes"],
            "repacked": "repacking" in prune["out"] or "rewrite" in prune["out"],
            "store_bytes": dir_bytes(repo), "kept": len(snapshots)}


def summary(days, peer, field_s, field_rss, store_field, need):
    rows = [d[peer] for d in days]
    return {
        "median_s": statistics.median(r[field_s] for r in rows),
        "worst_s": max(r[field_s] for r in rows),
        "peak_rss_bytes": max(r[field_rss] or 0 for r in rows),
        "store_over_need_worst": max(r[store_field] / need(d) for r, d in zip(rows, days) if need(d)),
        "store_over_need_end": rows[-1][store_field] / need(days[-1]) if need(days[-1]) else None,
    }


def run(ctx):
    p = ctx.profile
    g = ctx.grove
    work = ctx.dir("archive")
    pool = work / "pool"
    image = work / "image.raw"
    g.init(pool)
    urls = {"file": f"file://{work / 'archive'}"}
    if s3_url():
        urls["s3"] = s3_url()
    else:
        ctx.log("archive: no S3 gateway (GROVE_TEST_S3_BUCKET unset): file:// only")
    # Both archives get the same pushes: the file:// one is the pool's.
    configure(pool, urls["file"])
    g.bench_json("scribble", "--pool", pool, "--volume", "vm", "--image", image,
                 "--create-bytes", str(p.archive_bytes))
    repo = work / "restic"
    env = dict(os.environ, RESTIC_PASSWORD="bench")
    run_measured(["restic", "init", "-r", repo], env=env)
    days = []
    for day in range(p.archive_days):
        now = START + day * DAY_S
        if day > 0:
            fraction = p.archive_weekly_fraction if day % 7 == 0 else p.archive_daily_fraction
            g.bench_json("scribble", "--pool", pool, "--volume", "vm", "--image", image,
                         "--fraction", str(fraction), "--seed", str(day + 1))
        row = {"day": day}
        row.update(grove_day(ctx, pool, day, now, urls))
        row["restic"] = restic_day(repo, image, now, env)
        days.append(row)
        if day % 30 == 0:
            ctx.log(f"archive: day {day}/{p.archive_days}")
    metadata = g.metadata(pool, "archive")
    shutil.rmtree(repo, ignore_errors=True)
    image.unlink()
    out = result(p, days, urls, metadata)
    out["reads"] = archive_reads.run(ctx, pool, urls, p.archive_bytes, run_measured)
    return out


def result(p, days, urls, metadata):
    need = lambda d: d["file"]["needed_bytes"]  # noqa: E731 (the same blocks for both)
    out = {"volume_bytes": p.archive_bytes, "days": len(days), "keep": KEEP,
           "daily_fraction": p.archive_daily_fraction,
           "weekly_fraction": p.archive_weekly_fraction, "metadata": metadata}
    for label in urls:
        last = days[-1][label]["totals"]
        out[f"grove_{label}"] = {
            "push": summary(days, label, "push_s", "push_peak_rss_bytes", "stored_bytes", need),
            "expire": summary(days, label, "expire_s", "expire_peak_rss_bytes", "stored_bytes", need),
            "written_bytes": last["pushed_bytes"] + last["copied_bytes"] + last["index_bytes"],
            "copied_by_expiry_bytes": last["copied_bytes"],
            "process_written_bytes": sum((d[label]["push_written_bytes"] or 0) for d in days),
        }
    out["restic"] = {
        "backup": summary(days, "restic", "backup_s", "backup_peak_rss_bytes", "store_bytes", need),
        "prune": summary(days, "restic", "prune_s", "prune_peak_rss_bytes", "store_bytes", need),
        "written_bytes": sum((d["restic"]["backup_written_bytes"] or 0)
                             + (d["restic"]["prune_written_bytes"] or 0) for d in days),
        "prune_written_bytes": sum(d["restic"]["prune_written_bytes"] or 0 for d in days),
        "days_repacked": sum(1 for d in days if d["restic"]["repacked"]),
    }
    out["per_day"] = days
    return out
