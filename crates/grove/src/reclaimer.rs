//! The background reclaimer of `grove serve` and `grove mount`: gives back
//! the space of removed volumes and rollbacks, one bounded batch at a time
//! (each batch holds the pool lock briefly and commits on its own, so a
//! crash resumes where it left off), and gives way to foreground I/O.
//!
//! Giving way (issue 25 point 5, Thresher's λ): while clients are busy (a
//! request began since the last batch, or one is running), each batch is
//! followed by a pause [`BUSY_PAUSE_PER_BATCH`] times as long as the batch
//! took, so reclaim takes at most about a tenth of the time and of the
//! commits (each of which flushes the clients' unflushed writes) and
//! leaves the rest to them. A pool nobody uses is reclaimed at full speed,
//! and so is one past its pruning level (`grove space`): then the space
//! matters more than the clients' pace, and the writes that would fail at
//! the hard limit are theirs.
//! `grove gc --wait` in the daemon goes through the same pacing, and so
//! does pruning's removal of snapshots in the daemons (`grove prune`
//! through the control socket, the scheduler): only one of them runs a
//! batch (with its pause) at a time.
//!
//! Punching freed blocks out of the store (space back to the host, not to
//! the pool) is the reclaimer's too: the pool defers it to this worker
//! (`Pool::defer_punching`), which punches while the clients are idle,
//! and while they are busy only once the backlog passes
//! [`PUNCH_BACKLOG_BUSY_BLOCKS`] or the pool is past its warning level,
//! then paced as reclaim. Every punch holds the store file's inode lock,
//! which each client write waits for (5 to 60 ms a punch under random
//! writes on ext4 on the test machine).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use grove_store::{
    Error, ErrorKind, ForegroundLoad, Pool, RemovalSummary, RemoveOptions, SpaceLevel, VolumeKind,
};
use serde::{Deserialize, Serialize};

use crate::worker::{is_stopping, sleep_unless_stopping, Worker};

/// Debug builds only: a pause between reclaim batches (the background
/// reclaimer's and gc's), so tests can catch a gc in the middle.
const RECLAIM_DELAY_FOR_TESTS_ENV: &str = "GROVE_TEST_RECLAIM_BATCH_DELAY_MS";

/// Pause between batches while work remains and clients are idle.
const BATCH_PAUSE_MS: u64 = 2;
/// While clients are busy, the pause after a batch is this many times as
/// long as the batch took: reclaim gets at most 1 / (1 + this) of the time.
const BUSY_PAUSE_PER_BATCH: u32 = 9;
/// Bounds of the pause after a batch while clients are busy.
const BUSY_PAUSE_MIN_MS: u64 = 10;
const BUSY_PAUSE_MAX_MS: u64 = 1_000;
/// Pause when nothing is left to reclaim, before looking again.
const IDLE_POLL_MS: u64 = 200;
/// Blocks one punch step takes off the backlog while clients are idle (a
/// client that arrives meanwhile waits for at most this step).
const PUNCH_STEP_IDLE_BLOCKS: usize = 1024;
/// Blocks one punch step takes while clients are busy (paced as reclaim).
const PUNCH_STEP_BUSY_BLOCKS: usize = 64;
/// A backlog this long (1 GiB of 4 KiB blocks, a quarter of what it may
/// hold) is punched even while clients are busy, so that under a load
/// that never pauses the host still gets its space back.
pub const PUNCH_BACKLOG_BUSY_BLOCKS: usize = 1 << 18;
/// Pause after a failed batch (a damaged removed tree, a failed commit),
/// so a persistent error is logged now and then, not in a loop.
const ERROR_PAUSE_MS: u64 = 30_000;

/// Whoever runs a batch (the reclaimer, a `gc --wait`, a prune) holds a
/// turn through the batch and its pause, so that two of them never add up
/// to more than the share left to background work. Turns are given in the
/// order asked for: with a plain mutex the reclaimer, asking again the
/// moment it let go, kept a prune waiting for its whole reclaim.
static TURNS: Turns = Turns::new();

struct Turns {
    tickets: Mutex<Tickets>,
    changed: Condvar,
}

struct Tickets {
    /// The ticket the next one to ask gets.
    next: u64,
    /// The ticket whose turn it is.
    serving: u64,
}

/// A turn, held until dropped.
struct Turn<'a>(&'a Turns);

impl Turns {
    const fn new() -> Turns {
        Turns {
            tickets: Mutex::new(Tickets {
                next: 0,
                serving: 0,
            }),
            changed: Condvar::new(),
        }
    }

    fn take(&self) -> Turn<'_> {
        let mut tickets = self.tickets.lock().unwrap_or_else(PoisonError::into_inner);
        let mine = tickets.next;
        tickets.next += 1;
        while tickets.serving != mine {
            tickets = self
                .changed
                .wait(tickets)
                .unwrap_or_else(PoisonError::into_inner);
        }
        Turn(self)
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let turns = self.0;
        let mut tickets = turns.tickets.lock().unwrap_or_else(PoisonError::into_inner);
        tickets.serving += 1;
        debug_assert!(tickets.serving <= tickets.next, "a turn given once");
        drop(tickets);
        turns.changed.notify_all();
    }
}

pub struct Reclaimer(Worker);

impl Reclaimer {
    /// Starts the worker, which from now on punches the pool's freed
    /// blocks too (see the module's notes).
    pub fn start(pool: Pool) -> std::io::Result<Reclaimer> {
        pool.defer_punching();
        Worker::start("grove-reclaimer", move |stopping| run(&pool, stopping)).map(Reclaimer)
    }

    /// Stops after the batch in progress; what is left resumes next time.
    pub fn stop(self) {
        self.0.stop();
    }
}

fn run(pool: &Pool, stopping: &AtomicBool) {
    let mut pacer = Pacer::new(pool);
    while !is_stopping(stopping) {
        let pause_ms = match pacer.batch_and_pause(pool, stopping) {
            Ok((_, false)) => reclaim_delay_for_tests_ms(),
            Ok((freed, true)) => {
                if freed > 0 {
                    tracing::info!("reclaimer: removed volumes' space is all given back");
                }
                IDLE_POLL_MS
            }
            Err(e) => {
                tracing::error!("reclaimer: {e}");
                ERROR_PAUSE_MS
            }
        };
        let punched = pacer.punch_and_pause(pool, stopping);
        sleep_unless_stopping(if punched { BATCH_PAUSE_MS } else { pause_ms }, stopping);
    }
}

/// What one batch did and the pause that should follow it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub freed_bytes: u64,
    pub done: bool,
    /// Clients were busy since the previous batch.
    pub busy: bool,
    /// The pool is past its pruning level: no giving way.
    pub space_pressed: bool,
    /// How long the batch (and its commit) took.
    pub took: Duration,
    pub pause: Duration,
}

/// Paces reclaim batches and punching by the clients' load (see the
/// module's notes).
pub struct Pacer {
    /// The load at the end of the last batch.
    seen: ForegroundLoad,
    /// The load at the last look before punching.
    punch_seen: ForegroundLoad,
}

impl Pacer {
    pub fn new(pool: &Pool) -> Pacer {
        let now = pool.foreground_load();
        Pacer {
            seen: now,
            punch_seen: now,
        }
    }

    /// One step of punching the pool's backlog, and its pause, in this
    /// process's turn, if the clients allow (see the module's notes).
    /// Returns whether it punched, so that the caller comes back soon.
    pub fn punch_and_pause(&mut self, pool: &Pool, stopping: &AtomicBool) -> bool {
        let backlog = pool.punch_backlog_blocks();
        if backlog == 0 {
            return false;
        }
        let _turn = TURNS.take();
        let now = pool.foreground_load();
        let busy = now.busy_since(&self.punch_seen);
        self.punch_seen = now;
        // The space status (a statvfs) is looked at only while clients
        // are busy: idle, the step is taken anyway.
        let pressed = || {
            backlog >= PUNCH_BACKLOG_BUSY_BLOCKS || pool.space_status().level >= SpaceLevel::Warn
        };
        if busy && !pressed() {
            return false;
        }
        let started = Instant::now();
        let step = if busy {
            PUNCH_STEP_BUSY_BLOCKS
        } else {
            PUNCH_STEP_IDLE_BLOCKS
        };
        let taken = pool.punch_some(step);
        let took = started.elapsed();
        tracing::debug!("punch: {taken} blocks off a backlog of {backlog} took {took:?}");
        if busy {
            let ms = u64::try_from(pause_after(took, true).as_millis()).unwrap_or(u64::MAX);
            sleep_unless_stopping(ms, stopping);
        }
        // The next look counts every request since this one: those that
        // began during this step and its pause make the clients busy.
        true
    }

    /// Runs `batch` and decides the pause after it: busy if a request
    /// began since the previous step (or this pacer's start), or one is
    /// running now.
    pub fn step(
        &mut self,
        pool: &Pool,
        batch: impl FnOnce() -> grove_store::Result<(u64, bool)>,
    ) -> grove_store::Result<Step> {
        let started = Instant::now();
        let (freed_bytes, done) = batch()?;
        Ok(self.after(pool, started, freed_bytes, done))
    }

    /// The step of a batch that began at `started` and just ended.
    fn after(&mut self, pool: &Pool, started: Instant, freed_bytes: u64, done: bool) -> Step {
        let took = started.elapsed();
        let now = pool.foreground_load();
        let busy = now.busy_since(&self.seen);
        self.seen = now;
        let space_pressed = busy && pool.space_status().level >= SpaceLevel::Prune;
        Step {
            freed_bytes,
            done,
            busy,
            space_pressed,
            took,
            pause: pause_after(took, busy && !space_pressed),
        }
    }

    /// One reclaim batch, then (unless it was the last, or the caller is
    /// stopping) its pause, both in this process's turn. Returns the bytes
    /// freed and whether nothing is left.
    pub fn batch_and_pause(
        &mut self,
        pool: &Pool,
        stopping: &AtomicBool,
    ) -> grove_store::Result<(u64, bool)> {
        let _turn = TURNS.take();
        // Past the pruning level each batch commits, so that what it frees
        // is reusable (and punched) at once; else batches share commits,
        // whose flushes carry the clients' unflushed writes.
        let space_pressed = pool.space_status().level >= SpaceLevel::Prune;
        let step = self.step(pool, || {
            if space_pressed {
                pool.reclaim_batch()
            } else {
                pool.reclaim_batch_sharing_commits()
            }
        })?;
        tracing::debug!(
            "reclaim: a batch took {:?}, pause {:?}",
            step.took,
            step.pause
        );
        if !step.done {
            let ms = u64::try_from(step.pause.as_millis()).unwrap_or(u64::MAX);
            sleep_unless_stopping(ms.max(1), stopping);
        }
        Ok((step.freed_bytes, step.done))
    }
}

/// Removes snapshots for pruning (`Pool::remove_snapshots`, checked whole
/// first) a batch at a time, each batch and its pause in this process's
/// turn, paced like reclaim: while clients are busy, a batch of removals
/// and its commit (which flushes their unflushed writes) are followed by a
/// pause nine times as long, the last batch included. Stopping only cuts
/// the pauses short: the batches left still run, each a short commit.
pub fn remove_snapshots_paced(
    pool: &Pool,
    names: &[String],
    stopping: &AtomicBool,
) -> grove_store::Result<RemovalSummary> {
    remove_snapshots_paced_with(pool, names, RemoveOptions::default(), stopping)
}

/// `grove rm` in a daemon. A snapshot goes as pruning removes one
/// (`remove_snapshots_paced`): a record marked under the state lock, its
/// commit's I/O without it, and no count of what it gives back (None).
/// That count walks every removed tree the reclaimer has not given back
/// yet under the lock, and beside busy clients, whom the reclaimer gives
/// way to, there are many: 100 removals under fio on RADOS held the
/// clients' requests 1 to 4 s each. Anything else goes as `Pool::remove`,
/// counted.
pub fn remove_served(
    pool: &Pool,
    name: &str,
    options: RemoveOptions,
    stopping: &AtomicBool,
) -> grove_store::Result<Option<u64>> {
    if pool.volume_summary(name)?.kind != VolumeKind::Snapshot {
        return pool.remove(name, options).map(Some);
    }
    remove_snapshots_paced_with(pool, &[name.to_string()], options, stopping)?;
    Ok(None)
}

/// `remove_snapshots_paced` with the options of `grove rm`.
fn remove_snapshots_paced_with(
    pool: &Pool,
    names: &[String],
    options: RemoveOptions,
    stopping: &AtomicBool,
) -> grove_store::Result<RemovalSummary> {
    let mut removal = pool.begin_snapshot_removal(names, options)?;
    let mut pacer = Pacer::new(pool);
    loop {
        let _turn = TURNS.take();
        let started = Instant::now();
        let done = pool.remove_next_batch(&mut removal)?;
        // The last batch too: a prune too long for one control request
        // is several, and their batches would otherwise meet back to back.
        let step = pacer.after(pool, started, 0, done);
        tracing::debug!(
            "prune: a batch of removals took {:?} (commits so far {}), pause {:?}",
            step.took,
            removal.summary().commits,
            step.pause
        );
        let ms = u64::try_from(step.pause.as_millis()).unwrap_or(u64::MAX);
        sleep_unless_stopping(ms.max(1), stopping);
        if done {
            return Ok(removal.into_summary());
        }
    }
}

/// The pause after a batch that took `took`: short while clients are idle;
/// while they are busy, `BUSY_PAUSE_PER_BATCH` times the batch, within
/// bounds.
pub fn pause_after(took: Duration, busy: bool) -> Duration {
    if !busy {
        return Duration::from_millis(BATCH_PAUSE_MS);
    }
    took.saturating_mul(BUSY_PAUSE_PER_BATCH).clamp(
        Duration::from_millis(BUSY_PAUSE_MIN_MS),
        Duration::from_millis(BUSY_PAUSE_MAX_MS),
    )
}

/// What `gc` did.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct GcReport {
    pub freed_bytes: u64,
    /// What is still left to reclaim.
    pub pending_free_bytes: u64,
}

/// `gc` in the daemon: one batch, or (with `wait`) batches until nothing
/// is left or the daemon stops; a batch is committed whole, so stopping
/// between two is safe, and the client is told how far it got.
pub fn gc_until_stopped(
    pool: &Pool,
    wait: bool,
    stopping: &AtomicBool,
) -> grove_store::Result<GcReport> {
    let mut freed_bytes = 0;
    // Batches paced like the background reclaimer's, which it takes turns
    // with: clients keep most of the time (`reclaimer.rs`).
    let mut pacer = Pacer::new(pool);
    loop {
        let (bytes, done) = if wait {
            pacer.batch_and_pause(pool, stopping)?
        } else {
            pool.reclaim_batch()?
        };
        freed_bytes += bytes;
        if done || !wait {
            break;
        }
        if stopping.load(Ordering::SeqCst) {
            let left = pool.pending_free_bytes()?;
            return Err(Error::new(
                ErrorKind::Busy,
                format!(
                    "the daemon is shutting down: gc stopped between two batches after freeing {freed_bytes} bytes; {left} bytes are left to reclaim (run grove gc again once it is back)"
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(reclaim_delay_for_tests_ms()));
    }
    Ok(GcReport {
        freed_bytes,
        pending_free_bytes: pool.pending_free_bytes()?,
    })
}

/// The pause between reclaim batches that tests ask for (0 otherwise, and
/// always 0 in release builds).
pub fn reclaim_delay_for_tests_ms() -> u64 {
    if !cfg!(debug_assertions) {
        return 0;
    }
    std::env::var(RECLAIM_DELAY_FOR_TESTS_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use grove_store::{PoolOptions, RemoveOptions};

    /// A pool whose removed snapshot leaves entries to reclaim, batch by
    /// batch (the tests reclaim one entry a batch).
    fn pool_with_reclaim() -> (tempfile::TempDir, Pool) {
        pool_of(PoolOptions::default())
    }

    fn pool_of(options: PoolOptions) -> (tempfile::TempDir, Pool) {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::create(&dir.path().join("pool"), &options).unwrap();
        pool.create_volume("v", 1 << 20).unwrap();
        let volume = pool.volume("v").unwrap();
        volume.write_at(&[7u8; 64 * 1024], 0).unwrap();
        pool.snapshot("v", "v@1").unwrap();
        volume.write_at(&[8u8; 64 * 1024], 0).unwrap();
        pool.remove("v@1", RemoveOptions::default()).unwrap();
        (dir, pool)
    }

    #[test]
    fn busy_clients_get_nine_tenths_of_the_time() {
        let idle = pause_after(Duration::from_millis(5), false);
        assert_eq!(idle, Duration::from_millis(BATCH_PAUSE_MS));
        assert_eq!(
            pause_after(Duration::from_millis(5), true),
            Duration::from_millis(45)
        );
        assert_eq!(
            pause_after(Duration::from_micros(10), true),
            Duration::from_millis(BUSY_PAUSE_MIN_MS)
        );
        assert_eq!(
            pause_after(Duration::from_secs(10), true),
            Duration::from_millis(BUSY_PAUSE_MAX_MS)
        );
    }

    #[test]
    fn the_reclaimer_gives_way_while_requests_run_or_began() {
        let (_dir, pool) = pool_with_reclaim();
        let volume = pool.volume("v").unwrap();
        let mut pacer = Pacer::new(&pool);
        let batch = || pool.reclaim_batch_for_tests(1);

        // A request in flight through the batch: pause long.
        let request = pool.begin_foreground_request();
        let step = pacer.step(&pool, batch).unwrap();
        assert!(!step.done, "the test wants several batches");
        assert!(step.busy, "a request was running");
        assert_eq!(step.pause, pause_after(step.took, true));
        assert!(step.pause >= Duration::from_millis(BUSY_PAUSE_MIN_MS));
        assert!(step.pause >= step.took * BUSY_PAUSE_PER_BATCH);
        drop(request);

        // That request has ended and none began since: full speed.
        let step = pacer.step(&pool, batch).unwrap();
        assert!(!step.busy, "no client since the last batch");
        assert_eq!(step.pause, Duration::from_millis(BATCH_PAUSE_MS));

        // A read between two batches (in their pause) counts too.
        let mut buf = [0u8; 4096];
        volume.read_at(&mut buf, 0).unwrap();
        let step = pacer.step(&pool, batch).unwrap();
        assert!(step.busy, "a read began since the last batch");
        let step = pacer.step(&pool, batch).unwrap();
        assert!(!step.busy);

        // So do a write and a flush.
        volume.write_at(&[9u8; 4096], 8192).unwrap();
        assert!(pacer.step(&pool, batch).unwrap().busy);
        volume.flush().unwrap();
        assert!(pacer.step(&pool, batch).unwrap().busy);
        assert_eq!(pool.foreground_load().in_flight, 0);

        // Paced batches still give everything back.
        let stopping = AtomicBool::new(false);
        while !pacer.batch_and_pause(&pool, &stopping).unwrap().1 {}
        assert_eq!(pool.pending_free_bytes().unwrap(), 0);
    }

    #[test]
    fn punching_waits_for_idle_clients() {
        let (_dir, pool) = pool_with_reclaim();
        pool.defer_punching();
        let stopping = AtomicBool::new(false);
        let mut pacer = Pacer::new(&pool);
        while !pacer.batch_and_pause(&pool, &stopping).unwrap().1 {}
        let backlog = pool.punch_backlog_blocks();
        assert!(backlog > 0, "the reclaimed blocks wait to be punched");

        // A request in flight, or one begun since the last look: no punch.
        let request = pool.begin_foreground_request();
        assert!(!pacer.punch_and_pause(&pool, &stopping));
        drop(request);
        let mut buf = [0u8; 4096];
        pool.volume("v").unwrap().read_at(&mut buf, 0).unwrap();
        assert!(!pacer.punch_and_pause(&pool, &stopping));
        assert_eq!(pool.punch_backlog_blocks(), backlog);
        assert_eq!(pool.punch_stats().blocks, 0);

        // Idle since the last look: a step at a time, until none is left.
        while pacer.punch_and_pause(&pool, &stopping) {}
        assert_eq!(pool.punch_backlog_blocks(), 0);
        assert_eq!(pool.punch_stats().blocks as usize, backlog);
        assert!(pool.check(false).unwrap().is_clean());
    }

    #[test]
    fn turns_are_given_in_the_order_asked_for() {
        static LOCAL: Turns = Turns::new();
        let order = std::sync::Arc::new(Mutex::new(Vec::new()));
        let first = LOCAL.take();
        let asked = |n: u64| {
            let tickets = LOCAL.tickets.lock().unwrap();
            tickets.next - tickets.serving == n
        };
        let mut waiters = Vec::new();
        for who in 1..=3 {
            let order = order.clone();
            waiters.push(std::thread::spawn(move || {
                let _turn = LOCAL.take();
                order.lock().unwrap().push(who);
            }));
            // Each asks only once the one before is waiting.
            while !asked(who + 1) {
                std::thread::yield_now();
            }
        }
        drop(first);
        for waiter in waiters {
            waiter.join().unwrap();
        }
        assert_eq!(*order.lock().unwrap(), [1, 2, 3]);
    }

    #[test]
    fn a_paced_prune_removes_what_it_is_asked_and_refuses_a_held_snapshot() {
        let (_dir, pool) = pool_with_reclaim();
        for i in 0..5 {
            pool.snapshot("v", &format!("v@p{i}")).unwrap();
        }
        pool.hold("v@p4", "legal", None).unwrap();
        let stopping = AtomicBool::new(false);
        let request = pool.begin_foreground_request();
        let names: Vec<String> = (0..4).map(|i| format!("v@p{i}")).collect();
        let summary = remove_snapshots_paced(&pool, &names, &stopping).unwrap();
        assert_eq!(summary.removed, names);
        assert_eq!((summary.batches, summary.commits), (1, 1));
        let e = remove_snapshots_paced(&pool, &["v@p4".to_string()], &stopping).unwrap_err();
        assert!(e.message().contains("held"), "{e}");
        drop(request);
        let left: Vec<String> = pool
            .volume_summaries()
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(left, ["v", "v@p4"]);
    }

    /// A daemon's `grove rm` removes a snapshot uncounted (no walk of the
    /// removed trees) and anything else counted, as `Pool::remove` does.
    #[test]
    fn a_served_rm_counts_what_a_snapshot_gives_back_only_for_other_kinds() {
        let (_dir, pool) = pool_with_reclaim();
        let stopping = AtomicBool::new(false);
        pool.snapshot("v", "v@2").unwrap();
        pool.clone_volume("v@2", "c").unwrap();
        let options = RemoveOptions::default();
        assert_eq!(
            remove_served(&pool, "c", options, &stopping).unwrap(),
            Some(0)
        );
        assert_eq!(
            remove_served(&pool, "v@2", options, &stopping).unwrap(),
            None
        );
        let left: Vec<String> = pool
            .volume_summaries()
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(left, ["v"]);
        let e = remove_served(&pool, "v@2", options, &stopping).unwrap_err();
        assert!(e.message().contains("v@2"), "{e}");
        while !Pacer::new(&pool)
            .batch_and_pause(&pool, &stopping)
            .unwrap()
            .1
        {}
        assert!(pool.check(false).unwrap().is_clean());
    }

    const CAPACITY_BYTES: u64 = 256 << 20;

    /// Writes 4 MiB and sets the warning level (and the pruning level,
    /// for `Prune`) to 1% of the pool's capacity, so its use is past it.
    fn fill_past(pool: &Pool, level: SpaceLevel) {
        pool.create_volume("fill", 8 << 20).unwrap();
        let fill = pool.volume("fill").unwrap();
        fill.write_at(&vec![1u8; 4 << 20], 0).unwrap();
        let mut settings = pool.space_settings();
        settings.auto_extend = false;
        settings.warn_percent = 1;
        if level == SpaceLevel::Prune {
            settings.prune_percent = 1;
        }
        pool.set_space_settings(&settings).unwrap();
        let status = pool.space_status();
        assert!(status.level >= level, "{status:?}");
    }

    #[test]
    fn past_the_pruning_level_the_reclaimer_does_not_give_way() {
        let (_dir, pool) = pool_of(PoolOptions {
            capacity_bytes: Some(CAPACITY_BYTES),
            ..PoolOptions::default()
        });
        let mut pacer = Pacer::new(&pool);
        let batch = || pool.reclaim_batch_for_tests(1);
        let request = pool.begin_foreground_request();
        let step = pacer.step(&pool, batch).unwrap();
        assert!(
            step.busy && !step.space_pressed,
            "{:?}",
            pool.space_status()
        );
        assert_eq!(step.pause, pause_after(step.took, true));

        fill_past(&pool, SpaceLevel::Prune);
        let step = pacer.step(&pool, batch).unwrap();
        assert!(step.busy && step.space_pressed);
        assert_eq!(step.pause, Duration::from_millis(BATCH_PAUSE_MS));
        drop(request);
    }

    #[test]
    fn past_the_warning_level_busy_clients_do_not_hold_punching_off() {
        let (_dir, pool) = pool_of(PoolOptions {
            capacity_bytes: Some(CAPACITY_BYTES),
            ..PoolOptions::default()
        });
        pool.defer_punching();
        let stopping = AtomicBool::new(false);
        let mut pacer = Pacer::new(&pool);
        while !pacer.batch_and_pause(&pool, &stopping).unwrap().1 {}
        let backlog = pool.punch_backlog_blocks();
        assert!(backlog > 0);
        let request = pool.begin_foreground_request();
        assert!(
            !pacer.punch_and_pause(&pool, &stopping),
            "busy, below the level"
        );

        fill_past(&pool, SpaceLevel::Warn);
        assert!(pool.space_status().level < SpaceLevel::Prune);
        // Busy still, so a small step at a time, each with its pause.
        let started = Instant::now();
        assert!(pacer.punch_and_pause(&pool, &stopping));
        assert!(started.elapsed() >= Duration::from_millis(BUSY_PAUSE_MIN_MS));
        assert_eq!(
            pool.punch_backlog_blocks(),
            backlog.saturating_sub(PUNCH_STEP_BUSY_BLOCKS)
        );
        while pacer.punch_and_pause(&pool, &stopping) {}
        assert_eq!(pool.punch_backlog_blocks(), 0);
        drop(request);
    }
}
