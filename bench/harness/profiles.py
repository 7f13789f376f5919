"""The three sizes of the suite: smoke (the `cargo test` check that the
harness works, seconds), quick (under 5 minutes) and full (under 45).
Every figure of a run comes from one profile, so peers always share it."""

from dataclasses import dataclass, field, asdict

MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class Profile:
    name: str
    # fio: every job runs this long, 4 jobs x iodepth 16, as in nbd-vs-qemu.sh.
    runtime_s: float
    numjobs: int = 4
    iodepth: int = 16
    # The limit and the NBD servers: image size, jobs, alternating rounds.
    servers_image_bytes: int = GIB
    servers_jobs: tuple = ("seq-read", "seq-write", "rand-read", "rand-write")
    servers_rounds: int = 1
    # Snapshot depth: grove chain depths, and how deep the qcow2 chain goes.
    depth_image_bytes: int = GIB
    depths: tuple = (0, 1, 8, 32, 128, 1000, 10_000)
    # qemu opens every layer of a chain as a file: 10,000 is past what it
    # is asked to do here, and grove's own depth-0 ratio is the goal.
    qcow2_max_depth: int = 1000
    depth_rounds: int = 3
    depth_writes_per_level: int = 16
    # Write after snapshot: volume size, number of snapshots, and seconds a
    # run. A job that comes back to a block it wrote is no longer measuring
    # first writes: at 50k IOPS a job of a 1 GiB volume does after ~5 s.
    nsnaps_image_bytes: int = GIB
    nsnaps_snapshots: int = 10
    nsnaps_runtime_s: float = 2.5
    # Memory: volume size, snapshots, and the small cache to try. Issue
    # 39's size: 1 TiB and 10,000 snapshots (a block every 64 MiB, 16
    # random writes after each snapshot: the pool builds in minutes).
    memory_volume_gib: int = 1024
    memory_snapshots: int = 10_000
    memory_stride_kib: int = 65536
    memory_writes_between: int = 16
    memory_small_cache: str = "64M"
    # Snapshot count: checkpoints, and how many snapshots each one times.
    snapcount_checkpoints: tuple = (1, 1000, 10_000, 100_000)
    # Single snapshot timings swing with fsync latency: a median of this many.
    snapcount_window: int = 25
    snapcount_budget_s: float = 720.0
    # Replication: the volume sent full then after 1% of its blocks changed;
    # a large sparse volume; a stream of snapshots with no change between.
    repl_bytes: int = GIB
    repl_rounds: int = 3
    repl_change_fraction: float = 0.01
    repl_big_volume_bytes: int = 1 << 40
    repl_big_data_bytes: int = 4 * GIB
    repl_big_extents: int = 300
    repl_snapshots: int = 1000
    repl_snapshot_data_bytes: int = 64 * MIB
    # Retention: snapshot counts pruned, each in a fio window of random 4K
    # writes into a volume of busy bytes (and an equal quiet window), prune
    # starting lead seconds in; then `grove list` on a pool of this many
    # volumes while one client reads, in a list window (and a quiet one).
    retention_counts: tuple = (1000, 10_000)
    # Rounds of each count (volumes of their own); targets take the median.
    retention_rounds: int = 3
    retention_busy_bytes: int = GIB
    # Prune and reclaim of 10,000 snapshots take about 32 s beside fio
    # (batches paced 1:9 while clients are busy); they took 50 to 125 s
    # while each commit was an fdatasync of the whole store.
    retention_window_s: float = 60.0
    retention_lead_s: float = 1.0
    # Pruning starts this far into its window: fio's IOPS in its first
    # seconds (page cache filling) are not those of the rest, and a span
    # of 3 s (1,000 snapshots) compared there measured that, not pruning.
    retention_prune_lead_s: float = 10.0
    # The latency probe's rounds (one request in flight) start pruning
    # this far in: only the worst request counts there, not the pace.
    retention_probe_lead_s: float = 3.0
    # `grove list` and the admin commands: pools of each count of volumes,
    # each as (volumes, read window in seconds); a list of 100,000 takes
    # about 3 s beside the reader, more while other work shares the cores.
    retention_list_counts: tuple = ((20_000, 6.0), (100_000, 12.0))
    # A pool over branches: the image each target holds, alternating
    # rounds, and the window of random reads a rebuild runs in.
    branches_image_bytes: int = GIB
    branches_rounds: int = 2
    branches_rebuild_window_s: float = 20.0
    # The archive tier: a simulated year of daily snapshots of a volume of
    # random data, pushed to the archive and backed up by restic beside it.
    archive_bytes: int = GIB
    archive_days: int = 365
    archive_daily_fraction: float = 0.01
    archive_weekly_fraction: float = 0.05
    # The archive at scale (issue 37 point 6): an archive of this many daily
    # snapshots of a volume this big, each rewriting this many random 4 KiB
    # blocks, made object by object; each archive command's peak RSS
    # against the read cache plus 64 MiB.
    archive_scale_snapshots: int = 10_000
    archive_scale_volume_bytes: int = 64 * GIB
    archive_scale_changes: int = 16
    archive_scale_cache: str = "64M"
    archive_scale_deep_check: bool = True
    archive_scale_read_s: float = 20.0
    # grove on RADOS against RBD (--only rados, with a Ceph cluster): the
    # image of each, fio's seconds a job, the snapshots taken then removed
    # under writes, and the gap between two of them.
    rados_image_bytes: int = GIB
    rados_runtime_s: float = 10.0
    rados_snapshots: int = 100
    rados_snapshot_gap_s: float = 0.2
    # The archive's year (3.5 to 4 hours at 1 GiB here, restic's backups most of it)
    # runs with --only archive, and in the smoke run; the archive at scale
    # likewise (--only archive_scale).
    workloads: tuple = ("servers", "depth", "nsnaps", "memory", "snapcount", "replication",
                        "retention", "branches")

    def as_dict(self):
        return asdict(self)


FULL = Profile(name="full", runtime_s=10, servers_rounds=3)

QUICK = Profile(
    name="quick",
    runtime_s=2.5,
    servers_image_bytes=512 * MIB,
    depth_image_bytes=256 * MIB,
    depths=(0, 1, 8, 32, 128, 1000),
    # Building a 1,000-deep qcow2 chain takes about 30 s (a qemu-img process
    # per layer), and qemu-nbd dies of SIGSEGV reading through it anyway (the
    # full run records that), so the quick run stops qcow2 at 128.
    qcow2_max_depth=128,
    depth_rounds=1,
    # 64 GiB, a block every MiB, 16 writes after each of 1,000 snapshots:
    # built in ~7 s (64 writes take ~40 s; the full run's 1 TiB, minutes).
    memory_volume_gib=64,
    memory_snapshots=1000,
    memory_stride_kib=1024,
    memory_writes_between=16,
    snapcount_checkpoints=(1, 1000, 10_000),
    snapcount_budget_s=120.0,
    # Replication scaled down: 64 MiB sent, a 64 GiB volume holding 256 MiB,
    # 100 snapshots.
    repl_bytes=64 * MIB,
    repl_rounds=2,
    repl_big_volume_bytes=64 * GIB,
    repl_big_data_bytes=256 * MIB,
    repl_big_extents=100,
    repl_snapshots=100,
    repl_snapshot_data_bytes=16 * MIB,
    # 10,000 snapshots take about 30 s to prune and reclaim beside fio.
    retention_counts=(1000, 3000),
    retention_rounds=1,
    # The year of peers-restic-rbd.md: a 256 MiB image.
    archive_bytes=256 * MIB,
    archive_scale_snapshots=1000,
    archive_scale_volume_bytes=8 * GIB,
    archive_scale_read_s=5.0,
    rados_image_bytes=256 * MIB,
    rados_runtime_s=5.0,
    rados_snapshot_gap_s=0.05,
    retention_busy_bytes=256 * MIB,
    retention_window_s=20.0,
    retention_prune_lead_s=5.0,
    # Both pool sizes, as in the full run (issue 39 point 6): 100,000
    # volumes build in about 30 s.
    retention_list_counts=((20_000, 6.0), (100_000, 12.0)),
    branches_image_bytes=256 * MIB,
    branches_rounds=1,
    branches_rebuild_window_s=10.0,
)

SMOKE = Profile(
    name="smoke",
    runtime_s=0.5,
    numjobs=2,
    iodepth=4,
    servers_image_bytes=16 * MIB,
    servers_jobs=("rand-read", "rand-write"),
    depth_image_bytes=16 * MIB,
    depths=(0, 2),
    qcow2_max_depth=2,
    depth_rounds=1,
    depth_writes_per_level=4,
    nsnaps_image_bytes=16 * MIB,
    nsnaps_snapshots=2,
    nsnaps_runtime_s=0.5,
    memory_volume_gib=1,
    memory_snapshots=4,
    memory_stride_kib=1024,
    memory_writes_between=4,
    snapcount_checkpoints=(1, 10),
    snapcount_window=2,
    snapcount_budget_s=30.0,
    repl_bytes=16 * MIB,
    repl_rounds=1,
    repl_big_volume_bytes=4 * GIB,
    repl_big_data_bytes=32 * MIB,
    repl_big_extents=16,
    repl_snapshots=10,
    repl_snapshot_data_bytes=1 * MIB,
    retention_counts=(20, 100),
    retention_rounds=1,
    retention_busy_bytes=16 * MIB,
    # The reclaimer gives way to fio's writes (9 parts in 10 of the time),
    # so reclaiming 100 snapshots takes about 2 s here: room to spare.
    retention_window_s=8.0,
    retention_lead_s=0.3,
    # fio logs its first row 100s of ms after it starts, more on a loaded
    # machine (CI runs tests side by side): pruning 0.3 s in once found no
    # row in its 0.1 s span, quiet or not.
    retention_prune_lead_s=1.5,
    retention_probe_lead_s=1.5,
    # Room for the four admin commands, ADMIN_GAP_S apart, after the lead.
    retention_list_counts=((200, 2.5),),
    branches_image_bytes=16 * MIB,
    branches_rounds=1,
    branches_rebuild_window_s=2.0,
    archive_bytes=8 * MIB,
    archive_days=9,
    archive_scale_snapshots=12,
    archive_scale_volume_bytes=256 * MIB,
    archive_scale_read_s=0.5,
    workloads=("servers", "depth", "nsnaps", "memory", "snapcount", "replication",
               "retention", "branches", "archive", "archive_scale"),
)

PROFILES = {p.name: p for p in (SMOKE, QUICK, FULL)}
