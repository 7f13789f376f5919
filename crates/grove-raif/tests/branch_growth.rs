//! Growth of a branch pool: `add_branches` lays new space over every
//! branch, `restripe` copies the narrow segments onto all of them while
//! writes go on, and a crash anywhere in either (every file a crash
//! device in one global order) opens to old-or-new data, with a branch
//! lost too, and a restripe cut short resumes to the same bytes.

mod common;

use std::cell::RefCell;
use std::sync::Arc;

use common::recorded::{
    allowed, check_sectors, ImageFiles, LoggedFlush, LoggedWrite, RecordedFiles, SECTOR,
};
use common::Rng;
use grove_raif::branch_pool::{BranchDevice, BranchFiles, BranchSpec, Health};
use grove_raif::Level;
use grove_store::BlockDevice;

const UNIT: u64 = 1024;

fn place(b: usize) -> String {
    format!("branch{b}")
}

fn specs(width: usize, lost: &[usize]) -> Vec<BranchSpec> {
    (0..width)
        .map(|b| BranchSpec {
            label: format!("b{b}"),
            place: place(b),
            usable: !lost.contains(&b),
        })
        .collect()
}

/// A new pool over `width` recorded branches, committing on its own every
/// 8 KiB staged and restriping 4 KiB a batch.
fn new_pool(level: Level, width: usize, files: &Arc<RecordedFiles>) -> BranchDevice {
    for b in 0..width {
        files.segment(&place(b), 0, true).unwrap();
    }
    BranchDevice::open(level, UNIT, specs(width, &[]), files.clone(), None)
        .unwrap()
        .with_staging_limit(8 * 1024)
        .with_restripe_batch(4 * 1024)
}

/// Branches to add to grow a pool of `level` once.
fn added(level: Level, width: usize) -> Vec<(String, String)> {
    let count = if level == Level::Raif10 { 2 } else { 1 };
    (width..width + count)
        .map(|b| (format!("b{b}"), place(b)))
        .collect()
}

/// Random writes over `0..size`, the bytes expected, and flushes.
struct Writer {
    expected: Vec<u8>,
    rng: Rng,
}

impl Writer {
    fn write(&mut self, device: &BranchDevice, size: usize) {
        let sectors = 1 + self.rng.below(8) as usize;
        let offset = self.rng.below((size / SECTOR - sectors) as u64) as usize * SECTOR;
        let data: Vec<u8> = (0..sectors * SECTOR)
            .map(|_| self.rng.next() as u8)
            .collect();
        device.write_at(&data, offset as u64).unwrap();
        self.expected[offset..offset + data.len()].copy_from_slice(&data);
        if self.rng.below(4) == 0 {
            device.flush().unwrap();
        }
    }

    fn verify(&self, device: &BranchDevice, context: &str) {
        let mut got = vec![0u8; self.expected.len()];
        device.read_at(&mut got, 0).unwrap();
        assert!(got == self.expected, "{context}: the bytes differ");
    }
}

#[test]
fn a_pool_grows_by_a_branch_and_restripes_online_with_every_byte_kept() {
    for (level, width) in [
        (Level::Raif0, 2),
        (Level::Raif1, 2),
        (Level::Raif5, 3),
        (Level::Raif6, 4),
        (Level::Raif10, 4),
    ] {
        let files = Arc::new(RecordedFiles::new());
        let device = new_pool(level, width, &files);
        let first = 40 * UNIT as usize * level.data_units(width);
        device.set_len_bytes(first as u64).unwrap();
        let mut writer = Writer {
            expected: vec![0u8; first],
            rng: Rng(0x5eed + width as u64),
        };
        for _ in 0..40 {
            writer.write(&device, first);
        }
        let grown = added(level, width);
        device.add_branches(&grown).unwrap();
        let wide = width + grown.len();
        assert_eq!(device.width(), wide);
        assert_eq!(
            device.shape().segments.len(),
            2,
            "{level}: a segment per add"
        );
        assert!(device.needs_restripe());
        // The store grows past the old end: onto the new branches.
        let size = first + 40 * UNIT as usize * level.data_units(wide);
        device.set_len_bytes(size as u64).unwrap();
        writer.expected.resize(size, 0);
        for _ in 0..60 {
            writer.write(&device, size);
        }
        device.flush().unwrap();
        writer.verify(&device, &format!("{level} after the add"));
        let new_segment = device.shape().segments[1].id;
        let on_new_branch = files.segment(&place(width), new_segment, false).unwrap();
        assert!(
            on_new_branch.data.len_bytes().unwrap() > 0,
            "{level}: the new space lies on the new branch"
        );
        // A restripe with writes between its batches.
        let between = RefCell::new(&mut writer);
        let report = device
            .restripe(&mut |_, _| {}, &|| {
                between.borrow_mut().write(&device, size);
                false
            })
            .unwrap();
        assert_eq!(report.segments, 1, "{level}");
        assert_eq!(report.bytes_copied, first as u64, "{level}");
        assert!(!device.needs_restripe());
        let shape = device.shape();
        assert_eq!(shape.segments.len(), 2);
        assert!(shape.segments.iter().all(|s| s.width as usize == wide));
        assert!(
            files.segment(&place(0), 0, false).is_err(),
            "{level}: the narrow segment's files are gone"
        );
        writer.verify(&device, &format!("{level} after the restripe"));
        device.flush().unwrap();
        drop(device);
        // Reopened from its files, and without each branch it can spare.
        let mut variants = vec![vec![]];
        if level.tolerated_losses(wide) >= 1 {
            variants.extend((0..wide).map(|b| vec![b]));
        }
        for lost in variants {
            let device =
                BranchDevice::open(level, UNIT, specs(wide, &lost), files.clone(), None).unwrap();
            writer.verify(&device, &format!("{level} reopened, lost {lost:?}"));
        }
    }
}

#[test]
fn growth_is_refused_while_degraded_or_by_a_width_the_level_cannot_take() {
    let files = Arc::new(RecordedFiles::new());
    let device = new_pool(Level::Raif10, 4, &files);
    let error = device
        .add_branches(&[("b4".into(), place(4))])
        .unwrap_err()
        .to_string();
    assert!(error.contains("raif10 over 5 branches"), "{error}");
    let files = Arc::new(RecordedFiles::new());
    let device = new_pool(Level::Raif5, 3, &files);
    device.fail_branch("b1", "the test").unwrap();
    let error = device
        .add_branches(&[("b3".into(), place(3))])
        .unwrap_err()
        .to_string();
    assert!(error.contains("branch b1 is failed"), "{error}");
    assert_eq!(device.width(), 3);
    assert_eq!(device.health_of("b1"), Some(Health::Failed));
}

/// What a run did: its writes and completed flushes (started, done).
struct History {
    writes: Vec<LoggedWrite>,
    flushes: Vec<LoggedFlush>,
    rng: Rng,
}

impl History {
    fn step(&mut self, device: &BranchDevice, files: &RecordedFiles, size: usize) {
        let sectors = 1 + self.rng.below(8) as usize;
        let offset = self.rng.below((size / SECTOR - sectors) as u64) as usize * SECTOR;
        let data: Vec<u8> = (0..sectors * SECTOR)
            .map(|_| self.rng.next() as u8)
            .collect();
        self.writes.push(LoggedWrite {
            at: files.position(),
            offset,
            data: data.clone(),
        });
        device.write_at(&data, offset as u64).unwrap();
        if self.rng.below(3) == 0 {
            let started = files.position();
            device.flush().unwrap();
            self.flushes.push(LoggedFlush {
                started,
                done: files.position(),
            });
        }
    }

    /// Checks every sector of `got` (zeros past the device's end) against
    /// what a crash at `position` may leave.
    fn check(&self, got: &[u8], position: usize, context: &str) {
        let (durable, volatile) = allowed(got.len(), &self.writes, &self.flushes, position);
        check_sectors(got, &durable, &volatile, context);
    }
}

fn read_all(device: &BranchDevice, size: usize) -> Vec<u8> {
    let len = (device.len_bytes().unwrap() as usize).min(size);
    let mut got = vec![0u8; size];
    device.read_at(&mut got[..len], 0).unwrap();
    got
}

/// Crash points spread over each run, besides every point of each batch.
const CRASH_POINTS: usize = 60;

/// A run of writes, an add, more writes past the old end, and a restripe
/// with writes between batches; crashed at points all over it. Each image
/// opens (as grove.toml names every branch, the added ones too), reads
/// old-or-new, does so with each branch it can spare lost, and a
/// restripe the crash cut short finishes to the same bytes.
fn crash_states_of_growth(level: Level, width: usize, seed: u64) -> (usize, usize) {
    let files = Arc::new(RecordedFiles::new());
    let device = new_pool(level, width, &files);
    let first = 16 * UNIT as usize * level.data_units(width);
    device.set_len_bytes(first as u64).unwrap();
    device.flush().unwrap();
    let mut history = History {
        writes: Vec::new(),
        flushes: Vec::new(),
        rng: Rng(seed),
    };
    let start = files.position();
    for _ in 0..12 {
        history.step(&device, &files, first);
    }
    let grown = added(level, width);
    let wide = width + grown.len();
    let add_at = files.position();
    device.add_branches(&grown).unwrap();
    let size = first + 8 * UNIT as usize * level.data_units(wide);
    device.set_len_bytes(size as u64).unwrap();
    for _ in 0..12 {
        history.step(&device, &files, size);
    }
    let restripe_at = files.position();
    let history = RefCell::new(history);
    device
        .restripe(&mut |_, _| {}, &|| {
            history.borrow_mut().step(&device, &files, size);
            false
        })
        .unwrap();
    let mut history = history.into_inner();
    for _ in 0..8 {
        history.step(&device, &files, size);
    }
    let end = files.position();
    drop(device);

    let step = ((end - start) / CRASH_POINTS).max(1);
    let mut positions: Vec<usize> = (start..=end).step_by(step).collect();
    // Every point of the add, and of the restripe's first batches.
    positions.extend(add_at..(add_at + 40).min(end));
    positions.extend(restripe_at..(restripe_at + 120).min(end));
    positions.sort_unstable();
    positions.dedup();
    let mut fates = Rng(seed ^ 0xfade);
    let (mut checked, mut resumed) = (0, 0);
    for position in positions {
        for mode in 0..3 {
            let images: Arc<ImageFiles> = Arc::new(files.images(position, mode, &mut fates));
            let mut variants = vec![vec![]];
            if level.tolerated_losses(width) >= 1 {
                variants.extend((0..wide).map(|b| vec![b]));
            }
            for lost in variants {
                let context =
                    format!("{level} growth crash at op {position} (fates {mode}, lost {lost:?})");
                let device = BranchDevice::open(
                    level,
                    UNIT,
                    specs(wide, &lost),
                    images.clone() as Arc<dyn BranchFiles>,
                    None,
                )
                .unwrap_or_else(|e| panic!("{context}: {e}"))
                .with_restripe_batch(4 * 1024);
                let got = read_all(&device, size);
                history.check(&got, position, &context);
                checked += 1;
                if lost.is_empty() && device.needs_restripe() && device.width() == wide {
                    device.restripe(&mut |_, _| {}, &|| false).unwrap();
                    resumed += 1;
                    assert!(
                        read_all(&device, size) == got,
                        "{context}: the resumed restripe changed the bytes"
                    );
                }
            }
        }
    }
    (checked, resumed)
}

#[test]
fn a_crash_anywhere_in_growth_and_restripe_reads_old_or_new_and_resumes() {
    let (mut total, mut resumes) = (0, 0);
    for (level, width) in [
        (Level::Raif1, 2),
        (Level::Raif5, 3),
        (Level::Raif6, 4),
        (Level::Raif10, 4),
        (Level::Raif0, 2),
    ] {
        let (checked, resumed) = crash_states_of_growth(level, width, 0x6006 + width as u64);
        total += checked;
        resumes += resumed;
    }
    eprintln!("branch pool growth: {total} crash states checked, {resumes} cut restripes resumed");
    assert!(total > 2_000, "only {total} crash states");
    assert!(resumes > 100, "only {resumes} restripes resumed");
}
