//! The crash simulator over a branch pool: every branch file is a crash
//! device, the operations of all of them are kept in one global order, and
//! a power cut at any point keeps, loses or tears each branch's unsynced
//! writes independently (writes torn across branches). Each image is then
//! opened whole, and again with each branch (for RAIF6, also two) lost in
//! the same crash, which is where the RAID write hole would show: a stripe
//! whose parity does not match its data rebuilds garbage.
//!
//! The device-level contract checked: every 512-byte sector reads as its
//! content at the last completed flush, or as one written after it.
//! The engine-level contract: the pool opens, `check` is clean, and every
//! block of a volume reads its last flushed content or a later write.

mod common;

use common::recorded::{allowed, check_sectors, fate, LoggedFlush, LoggedWrite, Ordered, SECTOR};
use common::Rng;
use std::sync::{Arc, Mutex};

use grove_raif::branch_pool::{BranchDevice, Health, MemberDevices, MemberSpec};
use grove_raif::Level;
use grove_store::testing::{CrashDevice, CrashImages};
use grove_store::{BlockDevice, MemDevice, Pool, PoolOptions};

/// Every file of every branch, recorded.
struct Recording {
    devices: Vec<Arc<Ordered>>,
    bases: Vec<Vec<u8>>,
    order: Arc<Mutex<Vec<usize>>>,
}

/// Devices per branch: data, journal, sums.
const FILES: usize = 3;

impl Recording {
    fn new(width: usize) -> Recording {
        let order = Arc::new(Mutex::new(Vec::new()));
        Recording {
            devices: (0..width * FILES)
                .map(|id| {
                    Arc::new(Ordered {
                        id,
                        inner: CrashDevice::new(),
                        order: order.clone(),
                    })
                })
                .collect(),
            bases: vec![Vec::new(); width * FILES],
            order,
        }
    }

    fn position(&self) -> usize {
        self.order.lock().unwrap().len()
    }

    /// A branch's worth of new recorded devices (a replacement), appended
    /// after the others: its files are devices `first..first + FILES`.
    fn add_branch(&mut self) -> (usize, MemberDevices) {
        let first = self.devices.len();
        for id in first..first + FILES {
            self.devices.push(Arc::new(Ordered {
                id,
                inner: CrashDevice::new(),
                order: self.order.clone(),
            }));
            self.bases.push(Vec::new());
        }
        let files = &self.devices[first..];
        let devices = MemberDevices {
            data: files[0].clone(),
            journal: files[1].clone(),
            sums: files[2].clone(),
        };
        (first, devices)
    }

    fn specs(&self) -> Vec<MemberSpec> {
        self.devices
            .chunks(FILES)
            .enumerate()
            .map(|(b, files)| MemberSpec {
                label: format!("b{b}"),
                place: format!("branch {b}"),
                devices: Some(MemberDevices {
                    data: files[0].clone(),
                    journal: files[1].clone(),
                    sums: files[2].clone(),
                }),
                health: Health::Healthy,
            })
            .collect()
    }

    /// Every device's bytes after a power cut once `position` operations
    /// had been issued, each unsynced write's fate drawn from `rng`
    /// (`mode` 0: all land, 1: all lost, else random and torn).
    fn images(&self, position: usize, mode: u64, rng: &mut Rng) -> Vec<Vec<u8>> {
        self.images_after(&vec![0; self.devices.len()], position, mode, rng)
    }

    /// Like `images`, for a run whose first `skip[id]` operations on each
    /// device put its base in and are not part of it.
    fn images_after(
        &self,
        skip: &[usize],
        position: usize,
        mode: u64,
        rng: &mut Rng,
    ) -> Vec<Vec<u8>> {
        let order = self.order.lock().unwrap();
        self.devices
            .iter()
            .enumerate()
            .map(|(id, device)| {
                let count = order[..position].iter().filter(|&&d| d == id).count();
                let ops = device.inner.ops()[skip[id]..skip[id] + count].to_vec();
                let mut images = CrashImages::with_base(self.bases[id].clone(), ops);
                images.image(count, |_| fate(mode, rng))
            })
            .collect()
    }
}

/// A branch device over images, with the branches in `lost` gone.
fn open_images(level: Level, unit: u64, images: &[Vec<u8>], lost: &[usize]) -> BranchDevice {
    let specs = images
        .chunks(FILES)
        .take(images.len() / FILES)
        .enumerate()
        .map(|(b, files)| MemberSpec {
            label: format!("b{b}"),
            place: format!("image {b}"),
            devices: (!lost.contains(&b)).then(|| MemberDevices {
                data: Arc::new(MemDevice::from_bytes(files[0].clone())),
                journal: Arc::new(MemDevice::from_bytes(files[1].clone())),
                sums: Arc::new(MemDevice::from_bytes(files[2].clone())),
            }),
            health: Health::Healthy,
        })
        .collect();
    BranchDevice::assemble(level, unit, specs, None).expect("a crash image opens")
}

/// The losses each crash image is also checked under.
fn losses(level: Level, width: usize) -> Vec<Vec<usize>> {
    let mut out = vec![vec![]];
    if level.tolerated_losses(width) >= 1 {
        out.extend((0..width).map(|b| vec![b]));
    }
    if level.tolerated_losses(width) >= 2 {
        out.push(vec![0, width - 1]);
        out.push(vec![1, 2]);
    }
    out
}

/// The logical writes and completed flushes of a run on a recorded
/// device, each with its global position.
struct History {
    size: usize,
    writes: Vec<LoggedWrite>,
    flushes: Vec<LoggedFlush>,
}

impl History {
    fn new(size: usize) -> History {
        History {
            size,
            writes: Vec::new(),
            flushes: Vec::new(),
        }
    }

    /// One write of 1 to 8 random sectors, then a flush one time in
    /// `flush_one_in`.
    fn step(
        &mut self,
        device: &BranchDevice,
        recording: &Recording,
        rng: &mut Rng,
        flush_one_in: u64,
    ) {
        let sectors = 1 + rng.below(8) as usize;
        let offset = rng.below((self.size / SECTOR - sectors) as u64) as usize * SECTOR;
        let data: Vec<u8> = (0..sectors * SECTOR).map(|_| rng.next() as u8).collect();
        self.writes.push(LoggedWrite {
            at: recording.position(),
            offset,
            data: data.clone(),
        });
        device.write_at(&data, offset as u64).unwrap();
        if rng.below(flush_one_in) == 0 {
            let started = recording.position();
            device.flush().unwrap();
            self.flushes.push(LoggedFlush {
                started,
                done: recording.position(),
            });
        }
    }

    /// Reads a crash image's whole device and checks every sector
    /// against what a crash at `position` may leave.
    fn check(&self, device: &BranchDevice, position: usize, context: &str) {
        let (durable, volatile) = allowed(self.size, &self.writes, &self.flushes, position);
        let mut got = vec![0u8; self.size];
        device.read_at(&mut got, 0).unwrap();
        check_sectors(&got, &durable, &volatile, context);
    }
}

/// The stripe unit of the device-level crash runs: small, so that a run
/// of a few dozen writes spans many stripes.
const CRASH_UNIT_BYTES: u64 = 1024;

/// A recorded device of 24 stripes that commits on its own every 8 KiB
/// staged, and an empty history of its run.
fn recorded_run(level: Level, width: usize) -> (Recording, BranchDevice, History) {
    let recording = Recording::new(width);
    let device = BranchDevice::assemble(level, CRASH_UNIT_BYTES, recording.specs(), None)
        .unwrap()
        .with_staging_limit(8 * 1024);
    let stripes = 24u64;
    let size = (stripes * CRASH_UNIT_BYTES * level.data_units(width) as u64) as usize;
    device.set_len_bytes(size as u64).unwrap();
    (recording, device, History::new(size))
}

/// Crash points per level, spread evenly over the run.
const DEVICE_CRASH_POINTS: usize = 90;

fn device_crash_states(level: Level, width: usize, seed: u64) -> usize {
    let (recording, device, mut history) = recorded_run(level, width);
    let unit = CRASH_UNIT_BYTES;
    let mut rng = Rng(seed);
    let start = recording.position();
    for _ in 0..24 {
        history.step(&device, &recording, &mut rng, 4);
    }
    let end = recording.position();
    let mut checked = 0;
    let mut fates = Rng(seed ^ 0xc0ffee);
    let step = ((end - start) / DEVICE_CRASH_POINTS).max(1);
    for position in (start..=end).step_by(step) {
        for mode in 0..3 {
            let images = recording.images(position, mode, &mut fates);
            for lost in losses(level, width) {
                let device = open_images(level, unit, &images, &lost);
                let context =
                    format!("{level} crash at op {position} (fates {mode}, lost {lost:?})");
                history.check(&device, position, &context);
                checked += 1;
            }
        }
    }
    checked
}

/// The levels that survive a lost branch, each at the width its crash
/// tests run at.
const REDUNDANT_LEVELS: [(Level, usize); 4] = [
    (Level::Raif1, 2),
    (Level::Raif5, 4),
    (Level::Raif6, 5),
    (Level::Raif10, 4),
];

#[test]
fn every_crash_state_of_a_branch_pool_reads_old_or_new_even_with_a_branch_lost() {
    let mut total = 0;
    for (level, width) in REDUNDANT_LEVELS.into_iter().chain([(Level::Raif0, 3)]) {
        total += device_crash_states(level, width, 0x1234 + width as u64);
    }
    eprintln!("branch pool device: {total} crash states checked");
    assert!(total > 1_500, "only {total} crash states");
}

/// Crash points of the engine run, spread evenly over it.
const ENGINE_CRASH_POINTS: usize = 40;

/// The engine on a RAIF5 branch pool, crashed anywhere in a run of
/// writes, snapshots and removals: it opens (with a branch lost too),
/// `check` is clean, and the volume's blocks read old or new.
#[test]
fn the_engine_on_a_branch_pool_keeps_its_contract_through_crashes_and_a_lost_branch() {
    let (level, width, unit) = (Level::Raif5, 4, 4096u64);
    let recording = Recording::new(width);
    let device = Arc::new(BranchDevice::assemble(level, unit, recording.specs(), None).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let options = PoolOptions {
        journal_bytes: Some(256 * 1024),
        ..PoolOptions::default()
    };
    let pool = Pool::format(device.clone(), &options, dir.path(), None).unwrap();
    let block = 4096usize;
    let blocks = 48usize;
    pool.create_volume("v", (blocks * block) as u64).unwrap();
    pool.volume("v").unwrap().flush().unwrap();
    let start = recording.position();
    let mut rng = Rng(77);
    // Per block: its value at each flush, as (position the flush ended,
    // content), and the writes since.
    let mut writes: Vec<LoggedWrite> = Vec::new();
    let mut flushes: Vec<LoggedFlush> = Vec::new();
    for round in 0..12 {
        let volume = pool.volume("v").unwrap();
        for _ in 0..4 {
            let b = rng.below(blocks as u64) as usize;
            let data = vec![(round * 8 + rng.below(8) as usize) as u8 + 1; block];
            writes.push(LoggedWrite {
                at: recording.position(),
                offset: b * block,
                data: data.clone(),
            });
            volume.write_at(&data, (b * block) as u64).unwrap();
        }
        let started = recording.position();
        volume.flush().unwrap();
        flushes.push(LoggedFlush {
            started,
            done: recording.position(),
        });
        drop(volume);
        if round % 3 == 1 {
            pool.snapshot("v", &format!("v@{round}")).unwrap();
        }
        if round % 3 == 2 && round > 3 {
            pool.remove(&format!("v@{}", round - 4), Default::default())
                .unwrap();
        }
    }
    let end = recording.position();
    drop(pool);
    let size = blocks * block;
    let mut fates = Rng(99);
    let mut checked = 0;
    let step = ((end - start) / ENGINE_CRASH_POINTS).max(1);
    for position in (start..=end).step_by(step) {
        let (durable, volatile) = allowed(size, &writes, &flushes, position);
        for mode in [0, 1, 2] {
            let images = recording.images(position, mode, &mut fates);
            for lost in [vec![], vec![position % width]] {
                let device = Arc::new(open_images(level, unit, &images, &lost));
                let dir = tempfile::tempdir().unwrap();
                let context =
                    format!("engine crash at op {position} (fates {mode}, lost {lost:?})");
                let pool = Pool::open_device(device, dir.path(), None)
                    .unwrap_or_else(|e| panic!("{context}: {e}"));
                let report = pool.check(false).unwrap();
                assert!(report.is_clean(), "{context}: {report:?}");
                let mut got = vec![0u8; size];
                pool.volume("v").unwrap().read_at(&mut got, 0).unwrap();
                check_sectors(&got, &durable, &volatile, &context);
                checked += 1;
            }
        }
    }
    eprintln!("engine on a branch pool: {checked} crash states checked");
    assert!(checked >= 200, "only {checked}");
}

/// Operations after a change of the journal's branches whose every crash
/// point is checked.
const AFTER_A_CHANGE_OPS: usize = 24;

/// A crash anywhere around a branch's failure and its rebuild: branch 0
/// is failed after a third of the writes (the journals move to other
/// branches), replaced by a fresh branch and rebuilt after two thirds
/// (they move back), while writes and flushes go on. Each image is
/// opened as the identity files would have it: branch 0 lost from its
/// failure until the replacement's rebuild ended, then the replacement in
/// its place; and again with one more branch lost where the level allows.
fn crash_states_around_a_rebuild(level: Level, width: usize, seed: u64) -> usize {
    let (mut recording, device, mut history) = recorded_run(level, width);
    let unit = CRASH_UNIT_BYTES;
    let mut rng = Rng(seed);
    let start = recording.position();
    let (mut failed_at, mut rebuilt_at, mut replacement) = (usize::MAX, usize::MAX, 0);
    const WRITES: usize = 24;
    for i in 0..WRITES {
        if i == WRITES / 3 {
            device.fail_branch("b0", "taken out by the test").unwrap();
            failed_at = recording.position();
        }
        if i == 2 * WRITES / 3 {
            let (first, devices) = recording.add_branch();
            replacement = first;
            device.replace("b0", "replacement".into(), devices).unwrap();
            device.rebuild("b0", &mut |_, _| {}, &|| false).unwrap();
            rebuilt_at = recording.position();
        }
        history.step(&device, &recording, &mut rng, 3);
    }
    let end = recording.position();
    let mut checked = 0;
    let mut fates = Rng(seed ^ 0xbeef);
    let step = ((end - start) / DEVICE_CRASH_POINTS).max(1);
    // Every point of the first commits after a change of the journal's
    // branches (the failure, the rebuild), with more torn draws: where an
    // old journal left on a branch that no longer gets them would be
    // replayed if the change did not empty it.
    let mut positions: Vec<(usize, u64)> = (start..=end).step_by(step).map(|p| (p, 3)).collect();
    for changed in [failed_at, rebuilt_at] {
        positions.extend((changed..(changed + AFTER_A_CHANGE_OPS).min(end)).map(|p| (p, 4)));
    }
    positions.sort_unstable();
    for (position, modes) in positions {
        for mode in 0..modes {
            let mut images = recording.images(position, mode, &mut fates);
            let replaced = position > rebuilt_at;
            if replaced {
                let new_files: Vec<Vec<u8>> = images.drain(replacement..).collect();
                images.splice(0..FILES, new_files);
            }
            images.truncate(width * FILES);
            let branch0_lost = position > failed_at && !replaced;
            let mut variants: Vec<Vec<usize>> = vec![if branch0_lost { vec![0] } else { vec![] }];
            let spare = level.tolerated_losses(width) - usize::from(branch0_lost);
            if spare >= 1 {
                for b in 1..width {
                    let mut lost = variants[0].clone();
                    lost.push(b);
                    variants.push(lost);
                }
            }
            for lost in variants {
                let device = open_images(level, unit, &images, &lost);
                let context = format!(
                    "{level} crash at op {position} around a rebuild (fates {mode}, lost {lost:?})"
                );
                history.check(&device, position, &context);
                checked += 1;
            }
        }
    }
    checked
}

#[test]
fn a_crash_anywhere_around_a_branch_failure_and_its_rebuild_reads_old_or_new() {
    let mut total = 0;
    for (level, width) in REDUNDANT_LEVELS {
        total += crash_states_around_a_rebuild(level, width, 0x4242 + width as u64);
    }
    eprintln!("branch pool around a rebuild: {total} crash states checked");
    assert!(total > 1_000, "only {total} crash states");
}

/// A crash anywhere in a `scrub --repair` that mends a corrupt unit on one
/// branch: the image opens, a second scrub with repair mends whatever the
/// cut left, a third finds nothing, and every byte is what was written.
#[test]
fn a_crash_anywhere_in_a_scrub_repair_is_mended_by_the_next_scrub() {
    let mut checked = 0;
    for (level, width) in [(Level::Raif1, 2), (Level::Raif5, 4), (Level::Raif6, 5)] {
        let unit = 1024u64;
        let mut recording = Recording::new(width);
        let device = BranchDevice::assemble(level, unit, recording.specs(), None).unwrap();
        let size = (16 * unit * level.data_units(width) as u64) as usize;
        let model: Vec<u8> = (0..size).map(|i| (i * 7 / 5) as u8).collect();
        device.write_at(&model, 0).unwrap();
        device.flush().unwrap();
        drop(device);
        // What the run above left is the base; then one unit is corrupted
        // on branch 1 (data or parity, as the rotation has it).
        for (id, d) in recording.devices.iter().enumerate() {
            recording.bases[id] = d.inner.to_bytes();
        }
        let mut corrupted = recording.bases[FILES].clone();
        corrupted[5 * unit as usize + 3] ^= 0x5a;
        recording.bases[FILES] = corrupted;
        let fresh = Recording::new(width);
        for (id, d) in fresh.devices.iter().enumerate() {
            d.inner.write_at(&recording.bases[id], 0).unwrap();
        }
        let mut fresh = fresh;
        fresh.bases = recording.bases.clone();
        fresh.order.lock().unwrap().clear();
        for d in &fresh.devices {
            assert_eq!(d.inner.op_count(), 1, "the base went in as one write");
        }
        // The base write is not part of the recorded run.
        let skip: Vec<usize> = fresh.devices.iter().map(|_| 1).collect();
        let device = BranchDevice::assemble(level, unit, fresh.specs(), None).unwrap();
        let start = fresh.position();
        let report = device.scrub(true, &mut |_, _| {}, &|| false).unwrap();
        assert_eq!(report.repaired_units, 1, "{level}: {report:?}");
        let end = fresh.position();
        drop(device);
        let mut fates = Rng(0x5c7b ^ width as u64);
        for position in start..=end {
            for mode in 0..3 {
                let images = fresh.images_after(&skip, position, mode, &mut fates);
                let device = open_images(level, unit, &images, &[]);
                let context = format!("{level} crash at op {position} of a scrub (fates {mode})");
                device.scrub(true, &mut |_, _| {}, &|| false).unwrap();
                let again = device.scrub(false, &mut |_, _| {}, &|| false).unwrap();
                assert_eq!(again.stripes_with_errors, 0, "{context}: {again:?}");
                let mut got = vec![0u8; size];
                device.read_at(&mut got, 0).unwrap();
                assert!(
                    got == model,
                    "{context}: the data differs from what was written"
                );
                checked += 1;
            }
        }
    }
    eprintln!("crashes in a scrub repair: {checked} states checked");
    assert!(checked >= 30, "only {checked}");
}
