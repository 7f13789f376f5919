"""bench/run's harness: runs the suite's workloads in one run with one
profile, then writes <date>-<profile>.json, latest.md and PNG plots.

  main.py --grove BIN --grove-bench BIN [--quick | --smoke] [--out DIR]
          [--only servers,depth,nsnaps,memory,snapcount,replication,retention,branches,archive,
                  archive_scale,rados]
          [--keep-work] [--grove-before BIN] [--set FIELD=VALUE ...]
"""

import argparse
import ast
import dataclasses
import datetime
import json
import os
import pathlib
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import plots  # noqa: E402
import procs  # noqa: E402
import report  # noqa: E402
import targets  # noqa: E402
from grovecli import Grove  # noqa: E402
from profiles import PROFILES  # noqa: E402
from workloads import (  # noqa: E402
    archive, archive_scale, branches, depth, memory, nsnaps, rados, replication, retention,
    servers, snapcount)

WORKLOADS = {
    "servers": servers.run,
    "depth": depth.run,
    "nsnaps": nsnaps.run,
    "memory": memory.run,
    "snapcount": snapcount.run,
    "replication": replication.run,
    "retention": retention.run,
    "branches": branches.run,
    "archive": archive.run,
    "archive_scale": archive_scale.run,
    "rados": rados.run,
}


class Context:
    def __init__(self, profile, grove, work, grove_before=None):
        self.profile = profile
        self.grove = grove
        # An older grove binary, for the figures a workload gives "before".
        self.grove_before = grove_before
        self.work = work
        self.started = time.monotonic()

    def dir(self, name):
        path = self.work / name
        path.mkdir()
        return path

    def log(self, message):
        print(f"[{time.monotonic() - self.started:6.0f} s] {message}", file=sys.stderr, flush=True)


def first_line(args):
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=30).stdout
        return out.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return f"{args[0]} missing"


def machine(repo):
    cpu = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    commit = first_line(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"])
    return {"cpus": os.cpu_count(), "cpu": cpu, "kernel": platform.release(),
            "grove_commit": commit, "fio": first_line(["fio", "--version"]),
            "qemu_nbd": first_line(["qemu-nbd", "--version"]),
            "nbdkit": first_line(["nbdkit", "--version"]),
            "btrfs": first_line(["btrfs", "--version"])}


def parse_args(argv):
    parser = argparse.ArgumentParser(description="grove's benchmark suite (bench/run)")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="the suite in under 5 minutes")
    size.add_argument("--smoke", action="store_true", help="a tiny run that checks the harness")
    parser.add_argument("--grove", help="the grove binary (bench/run passes it)")
    parser.add_argument("--grove-bench", help="the grove-bench binary (bench/run passes it)")
    parser.add_argument("--grove-before", default=None,
                        help="an older grove binary: retention also measures the "
                             "`grove list` stall with it, on the same pool")
    parser.add_argument("--out", default=None, help="results directory [bench/results]")
    parser.add_argument("--only", default=None, help="comma-separated workloads to run")
    parser.add_argument("--work-dir", default=os.environ.get("TMPDIR", "/var/tmp"))
    parser.add_argument("--keep-work", action="store_true")
    parser.add_argument("--rerun-because", default=None,
                        help="with --only: put these workloads' new figures into today's "
                             "JSON of the same profile, noting why they were run again")
    parser.add_argument("--report-only", metavar="JSON", default=None,
                        help="rewrite latest.md and the plots from a results JSON; run nothing")
    parser.add_argument("--set", metavar="FIELD=VALUE", action="append", default=[],
                        help="override one field of the profile (repeatable), e.g. "
                             "archive_days=30; the fields are in bench/harness/profiles.py")
    return parser.parse_args(argv)


def with_overrides(profile, settings):
    """The profile with --set FIELD=VALUE applied, each value read as the
    field's own type; an unknown field or a bad value stops the run."""
    changes = {}
    for setting in settings:
        field, sep, text = setting.partition("=")
        if not sep or not hasattr(profile, field) or field == "name":
            sys.exit(f"bench/run: --set {setting}: not FIELD=VALUE with a field of "
                     "bench/harness/profiles.py's Profile")
        current = getattr(profile, field)
        try:
            if isinstance(current, bool):
                if text not in ("true", "false"):
                    raise ValueError("not true or false")
                changes[field] = text == "true"
            elif isinstance(current, (int, float, str)):
                changes[field] = type(current)(text)
            else:
                changes[field] = type(current)(ast.literal_eval(text))
        except (ValueError, SyntaxError) as e:
            sys.exit(f"bench/run: --set {setting}: {field} takes a {type(current).__name__}: {e}")
    return dataclasses.replace(profile, **changes)


def write_outputs(results, out, stem):
    """Targets, plots, <stem>.json and latest.md from a run's results."""
    checks = targets.evaluate({"workloads": {k: v for k, v in results["workloads"].items()
                                             if "error" not in v}})
    results["targets"] = checks
    made = plots.write_all(results, checks, out, stem)
    (out / f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "latest.md").write_text(report.render(results, checks, made) + "\n")
    return made


def on_signal(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv):
    args = parse_args(argv)
    repo = pathlib.Path(__file__).resolve().parents[2]
    profile = with_overrides(
        PROFILES["smoke" if args.smoke else "quick" if args.quick else "full"], args.set)
    out = pathlib.Path(args.out) if args.out else repo / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        results = json.loads(pathlib.Path(args.report_only).read_text())
        write_outputs(results, out, results["json_name"].removesuffix(".json"))
        return 0
    if not (args.grove and args.grove_bench):
        sys.exit("bench/run: --grove and --grove-bench are needed to run workloads")
    names = args.only.split(",") if args.only else list(profile.workloads)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        sys.exit(f"bench/run: unknown workload(s) {', '.join(unknown)}; "
                 f"known: {', '.join(WORKLOADS)}")
    signal.signal(signal.SIGTERM, on_signal)
    work = pathlib.Path(tempfile.mkdtemp(prefix="grove-bench.", dir=args.work_dir))
    if args.grove_before and not os.access(args.grove_before, os.X_OK):
        sys.exit(f"bench/run: --grove-before {args.grove_before}: not an executable file")
    ctx = Context(profile, Grove(args.grove, args.grove_bench, work), work,
                  args.grove_before and str(pathlib.Path(args.grove_before).resolve()))
    now = datetime.datetime.now(datetime.timezone.utc)
    stem = f"{now:%Y-%m-%d}-{profile.name}"
    results = {"date": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "profile": profile.as_dict(),
               "command": "bench/run" + {"full": "", "quick": " --quick",
                                         "smoke": " --smoke"}[profile.name]
               + (f" --only {args.only}" if args.only else "")
               + "".join(f" --set {setting}" for setting in args.set),
               "machine": machine(repo), "json_name": f"{stem}.json", "workloads": {}}
    failed = []
    try:
        for name in names:
            ctx.log(f"{name}: start")
            try:
                results["workloads"][name] = WORKLOADS[name](ctx)
            except (procs.CommandError, subprocess.SubprocessError, OSError, ValueError,
                    KeyError) as e:
                traceback.print_exc()
                ctx.log(f"{name}: FAILED: {e}")
                results["workloads"][name] = {"error": str(e)}
                failed.append(name)
            finally:
                procs.stop_all()
            ctx.log(f"{name}: done")
    except KeyboardInterrupt:
        ctx.log("interrupted: stopping servers")
        procs.stop_all()
        raise
    except Exception:
        traceback.print_exc()
        failed.append("harness")
    finally:
        procs.stop_all()
        if args.keep_work:
            ctx.log(f"work kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    results["elapsed_s"] = time.monotonic() - ctx.started
    previous = out / f"{stem}.json"
    if args.rerun_because and args.only and previous.exists():
        merged = json.loads(previous.read_text())
        for name in names:
            merged["workloads"][name] = results["workloads"][name]
            merged.setdefault("reruns", []).append(
                {"workload": name, "date": results["date"], "why": args.rerun_because,
                 "elapsed_s": results["elapsed_s"]})
        results = merged
    made = write_outputs(results, out, stem)
    if not plots.available():
        ctx.log("matplotlib is missing (apt-get install python3-matplotlib): no plots")
    ctx.log(f"wrote {out / (stem + '.json')}, {out / 'latest.md'} and {len(made)} plot(s)")
    if failed:
        ctx.log(f"failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
