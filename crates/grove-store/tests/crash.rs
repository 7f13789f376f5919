//! The crash simulator: runs random workloads on a device that records every
//! write and flush, rebuilds the device as a power cut would leave it at
//! every point of the log (any subset of the writes since the last flush,
//! some torn at 512-byte sectors), and checks the consistency contract on
//! each image:
//!
//! - the pool opens without repair, and `check` finds no error;
//! - every volume that existed at the last durable point exists;
//! - every sector of every volume holds a value it legitimately had: its
//!   value at the last durable point, or one written after it.
//!
//! The scenarios run twice: on a disk's semantics (any subset of the writes
//! since the last flush, torn at 512-byte sectors), and in `on_objects` on
//! an object store's (grove-rados over RADOS: each write's share of one
//! object whole or absent, shares to different objects in any subset until
//! a flush, one object's in order; see `Tearing::Objects`).
//!
//! GROVE_CRASH_WORKLOADS sets how many workloads run (default 24 on a disk,
//! at least CRASH_STATES_MIN crash states, which the test asserts, and 8 on
//! objects); raise it for a soak run. GROVE_CRASH_SEED picks the first
//! workload's seed, to replay a failure.

mod common;

use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use grove_store::testing::{CrashDevice, CrashImages, DeviceOp, Tearing, WriteFate};
use grove_store::{MemDevice, Pool, PoolOptions, RemoveOptions};

const BLOCK_SIZE_BYTES: u32 = 1024;
const SECTOR_BYTES: usize = 512;
/// A 64-block journal checkpoints and wraps every few operations.
const JOURNAL_BYTES: u64 = 64 * 1024;
const OPS_PER_WORKLOAD: usize = 36;
/// Crash images built per crash point, besides "all lost" and "all landed".
const RANDOM_IMAGES_PER_POINT: usize = 2;
const WORKLOADS_DEFAULT: u64 = 24;
/// Crash states the default run must check: the README promises it, and
/// the test fails rather than let the promise go quietly untrue.
const CRASH_STATES_MIN: usize = 20_000;
/// Sector masks of the images that tear every volatile write: even
/// sectors land and odd ones are lost, then the other way round.
const TORN_EVERY_WRITE_MASKS: [u64; 2] = [0x5555_5555_5555_5555, 0xaaaa_aaaa_aaaa_aaaa];
/// Bytes of the ballast some workloads write and give back before they
/// start: it moves next-fit past the blocks whose states the first sector
/// of group 0's map holds (896 of them at 1 KiB blocks), so that later map
/// changes span both sectors of the map block and a torn map write is a
/// damaged map.
const BALLAST_BYTES: u64 = 1000 * 1024;
/// Volume sizes: multi-level trees at 1 KiB blocks (128 entries per node)
/// while the model stays small.
const VOLUME_SIZES: [u64; 3] = [64 * 1024, 200 * 1024, 1024 * 1024];

/// xorshift64*: deterministic, so a failing seed replays exactly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Volume contents are shared between model states until one changes them,
/// so keeping the model after every operation stays cheap.
#[derive(Clone, Debug, PartialEq)]
struct VolumeModel {
    data: Arc<Vec<u8>>,
    writable: bool,
}

type Model = BTreeMap<String, VolumeModel>;

/// The model after one operation, and where the device log stood then.
struct ModelState {
    log_position: usize,
    /// The operation ended with everything durable (flush, or an admin
    /// command, which is durable when it returns).
    durable: bool,
    model: Model,
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng(seed | 1);
    (0..len).map(|_| (rng.next() >> 32) as u8 | 1).collect()
}

thread_local! {
    /// What the running test's devices keep at a crash: a disk's rule, or
    /// an object store's in `on_objects`.
    static TEARING: Cell<Tearing> = const { Cell::new(Tearing::Sectors) };
}

fn tearing() -> Tearing {
    TEARING.with(Cell::get)
}

/// Crash images of a log recorded on a device that started with `base`,
/// torn by the running test's rule.
fn crash_images(base: Vec<u8>, ops: Vec<DeviceOp>) -> CrashImages {
    CrashImages::with_base(base, ops).with_tearing(tearing())
}

/// The name every simulated pool is formatted and opened under.
const CRASH_DIR: &str = "crash-sim";

/// A fresh pool at the simulator's block size, on a device that logs every
/// write and flush.
fn format_crash_pool(capacity_bytes: Option<u64>, journal_bytes: u64) -> (Arc<CrashDevice>, Pool) {
    let device = Arc::new(CrashDevice::new().with_tearing(tearing()));
    let options = PoolOptions {
        block_size_bytes: BLOCK_SIZE_BYTES,
        capacity_bytes,
        journal_bytes: Some(journal_bytes),
    };
    let pool = Pool::format(device.clone(), &options, Path::new(CRASH_DIR), None).unwrap();
    (device, pool)
}

/// A new volume as the model sees it: zeros, writable.
fn zeroed_volume(size: usize) -> VolumeModel {
    VolumeModel {
        data: Arc::new(vec![0; size]),
        writable: true,
    }
}

/// What a write of `data` at `offset` leaves in the model's volume.
fn model_write(volume: &mut VolumeModel, offset: usize, data: &[u8]) {
    Arc::make_mut(&mut volume.data)[offset..offset + data.len()].copy_from_slice(data);
}

/// A scripted workload: the model beside the pool, and the model state
/// after each step with where the device log stood then.
struct Script<'a> {
    device: &'a CrashDevice,
    model: Model,
    states: Vec<ModelState>,
}

impl<'a> Script<'a> {
    /// Starts with the empty model as the first durable state.
    fn new(device: &'a CrashDevice) -> Self {
        let mut script = Script {
            device,
            model: Model::new(),
            states: Vec::new(),
        };
        script.record(true);
        script
    }

    fn record(&mut self, durable: bool) {
        self.states.push(ModelState {
            log_position: self.device.op_count(),
            durable,
            model: self.model.clone(),
        });
    }

    fn create_volume(&mut self, pool: &Pool, name: &str, size: u64) {
        pool.create_volume(name, size).unwrap();
        self.model.insert(name.into(), zeroed_volume(size as usize));
    }

    fn write(&mut self, pool: &Pool, name: &str, offset: u64, data: &[u8]) {
        pool.volume(name).unwrap().write_at(data, offset).unwrap();
        model_write(self.model.get_mut(name).unwrap(), offset as usize, data);
    }

    /// The model's bytes of a volume, to change beside the pool.
    fn data(&mut self, name: &str) -> &mut Vec<u8> {
        Arc::make_mut(&mut self.model.get_mut(name).unwrap().data)
    }
}

/// Opens the image a power cut at log position `position` left and checks
/// it finds no error.
fn open_clean_image(image: Vec<u8>, position: usize) -> Pool {
    let device = Arc::new(MemDevice::from_bytes(image));
    let pool = Pool::open_device(device, Path::new(CRASH_DIR), None)
        .unwrap_or_else(|e| panic!("op {position}: the pool does not open: {e}"));
    let report = pool.check(false).unwrap();
    assert!(report.is_clean(), "op {position}: {:?}", report.errors);
    pool
}

/// A volume's whole contents.
fn read_volume(pool: &Pool, name: &str, size: u64) -> Vec<u8> {
    let mut buf = vec![0u8; size as usize];
    pool.volume(name).unwrap().read_at(&mut buf, 0).unwrap();
    buf
}

/// A write somewhere in the volume: often block-aligned, often not.
fn random_range(rng: &mut Rng, size: u64) -> (u64, usize) {
    let max_len = 6000.min(size);
    let len = 1 + rng.below(max_len);
    let offset = rng.below(size - len + 1);
    if rng.below(2) == 0 {
        let aligned = offset / u64::from(BLOCK_SIZE_BYTES) * u64::from(BLOCK_SIZE_BYTES);
        let len = len.min(size - aligned);
        return (aligned, len as usize);
    }
    (offset, len as usize)
}

fn run_workload(seed: u64) -> Checked {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let (device, mut pool) = format_crash_pool(None, JOURNAL_BYTES);
    let dir = Path::new(CRASH_DIR);
    if !seed.is_multiple_of(3) {
        pool.create_volume("ballast", BALLAST_BYTES).unwrap();
        pool.volume("ballast")
            .unwrap()
            .write_at(&pattern(seed, BALLAST_BYTES as usize), 0)
            .unwrap();
        pool.remove_volume("ballast").unwrap();
        pool.reclaim_all(|_| {}).unwrap();
        pool.flush().unwrap();
    }
    // Every other workload runs with the smallest metadata cache, so that
    // nodes are evicted and read back between commits.
    let small_cache = seed.is_multiple_of(2);
    if small_cache {
        pool.set_cache_size(grove_store::CACHE_NODES_MIN as u64 * u64::from(BLOCK_SIZE_BYTES));
    }
    let mut model = Model::new();
    let mut states = vec![ModelState {
        log_position: device.op_count(),
        durable: true,
        model: model.clone(),
    }];
    let mut next_name = 0;

    for _ in 0..OPS_PER_WORKLOAD {
        let names: Vec<String> = model.keys().cloned().collect();
        let writable: Vec<String> = model
            .iter()
            .filter(|(_, v)| v.writable)
            .map(|(k, _)| k.clone())
            .collect();
        let choice = if names.is_empty() { 0 } else { rng.below(100) };
        let mut durable = false;
        let mut intermediate = Vec::new();
        match choice {
            0..=7 => {
                let name = format!("v{next_name}");
                next_name += 1;
                let size = VOLUME_SIZES[rng.below(VOLUME_SIZES.len() as u64) as usize];
                pool.create_volume(&name, size).unwrap();
                model.insert(name, zeroed_volume(size as usize));
                durable = true;
            }
            8..=44 if !writable.is_empty() => {
                let name = &writable[rng.below(writable.len() as u64) as usize];
                let volume = model.get_mut(name).unwrap();
                let (offset, len) = random_range(&mut rng, volume.data.len() as u64);
                let data = pattern(rng.next(), len);
                pool.volume(name).unwrap().write_at(&data, offset).unwrap();
                model_write(volume, offset as usize, &data);
            }
            45..=51 if !writable.is_empty() => {
                let name = &writable[rng.below(writable.len() as u64) as usize];
                let volume = model.get_mut(name).unwrap();
                let (offset, len) = random_range(&mut rng, volume.data.len() as u64);
                pool.volume(name)
                    .unwrap()
                    .discard(offset, len as u64)
                    .unwrap();
                Arc::make_mut(&mut volume.data)[offset as usize..offset as usize + len].fill(0);
            }
            81..=86 if !writable.is_empty() => {
                // A bulk write: enough allocation that next-fit wraps around
                // the store and reuses blocks freed moments ago.
                let name = &writable[rng.below(writable.len() as u64) as usize];
                let volume = model.get_mut(name).unwrap();
                let size = volume.data.len() as u64;
                let len = (32 * 1024 + rng.below(160 * 1024)).min(size);
                let offset = rng.below(size - len + 1) / 1024 * 1024;
                let data = pattern(rng.next(), len as usize);
                pool.volume(name).unwrap().write_at(&data, offset).unwrap();
                model_write(volume, offset as usize, &data);
            }
            87..=91 if !writable.is_empty() => {
                // A discard of whole leaf nodes (128 blocks of 1 KiB): frees
                // nodes as well as data.
                let name = &writable[rng.below(writable.len() as u64) as usize];
                let volume = model.get_mut(name).unwrap();
                let size = volume.data.len() as u64;
                let span = 128 * 1024;
                let offset = rng.below(size / span + 1) * span;
                let len = (span * (1 + rng.below(3))).min(size - offset.min(size));
                if len > 0 {
                    pool.volume(name).unwrap().discard(offset, len).unwrap();
                    Arc::make_mut(&mut volume.data)[offset as usize..(offset + len) as usize]
                        .fill(0);
                }
            }
            52..=61 => {
                let source = &names[rng.below(names.len() as u64) as usize];
                let name = format!("v{next_name}");
                next_name += 1;
                let writable = rng.below(2) == 0;
                if writable {
                    pool.clone_volume(source, &name).unwrap();
                } else {
                    pool.snapshot(source, &name).unwrap();
                }
                let data = model[source].data.clone();
                model.insert(name, VolumeModel { data, writable });
                durable = true;
            }
            62..=67 => {
                let name = names[rng.below(names.len() as u64) as usize].clone();
                pool.remove_volume(&name).unwrap();
                model.remove(&name);
                durable = true;
            }
            92..=97 => {
                // The reclaimer, a batch or all of it: each batch commits,
                // so a power cut can fall between batches or inside one.
                if rng.below(2) == 0 {
                    pool.reclaim_batch().unwrap();
                } else {
                    pool.reclaim_all(|_| {}).unwrap();
                }
                // A batch commits only when there is something to reclaim:
                // flush, so that this is a durable point either way.
                pool.flush().unwrap();
                durable = true;
            }
            68..=72 if !writable.is_empty() => {
                let name = &writable[rng.below(writable.len() as u64) as usize];
                let size = VOLUME_SIZES[rng.below(VOLUME_SIZES.len() as u64) as usize]
                    + 512 * rng.below(3);
                pool.resize_volume(name, size).unwrap();
                Arc::make_mut(&mut model.get_mut(name).unwrap().data).resize(size as usize, 0);
                durable = true;
            }
            73..=80 if writable.len() >= 2 => {
                // Concurrent writers on two volumes, and a third thread
                // flushing meanwhile (the tiny journal makes its commits
                // checkpoint often, with the state lock let go during
                // their I/O); every value either volume passes through is
                // a legitimate crash state.
                let a = writable[rng.below(writable.len() as u64) as usize].clone();
                let b = writable.iter().find(|n| **n != a).unwrap().clone();
                let mut plans = Vec::new();
                for name in [&a, &b] {
                    let size = model[name].data.len() as u64;
                    let writes: Vec<(u64, Vec<u8>)> = (0..4)
                        .map(|_| {
                            let (offset, len) = random_range(&mut rng, size);
                            (offset, pattern(rng.next(), len))
                        })
                        .collect();
                    plans.push((name.clone(), writes));
                }
                std::thread::scope(|scope| {
                    for (name, writes) in &plans {
                        let volume = pool.volume(name).unwrap();
                        scope.spawn(move || {
                            for (offset, data) in writes {
                                volume.write_at(data, *offset).unwrap();
                            }
                        });
                    }
                    let flusher = pool.clone();
                    scope.spawn(move || {
                        for _ in 0..2 {
                            flusher.flush().unwrap();
                        }
                    });
                });
                for (name, writes) in &plans {
                    for (offset, data) in writes {
                        model_write(model.get_mut(name).unwrap(), *offset as usize, data);
                        intermediate.push(model.clone());
                    }
                }
            }
            98 => {
                // Close (a checkpoint: maps and count blocks are rewritten
                // in place, so a power cut can tear them) and open again.
                pool.close().unwrap();
                pool = Pool::open_device(device.clone(), dir, None).unwrap();
                if small_cache {
                    pool.set_cache_size(
                        grove_store::CACHE_NODES_MIN as u64 * u64::from(BLOCK_SIZE_BYTES),
                    );
                }
                durable = true;
            }
            _ => {
                pool.flush().unwrap();
                durable = true;
            }
        }
        let log_position = device.op_count();
        for model in intermediate {
            states.push(ModelState {
                log_position,
                durable: false,
                model,
            });
        }
        states.push(ModelState {
            log_position,
            durable,
            model: model.clone(),
        });
    }
    // The engine agrees with the model before any crash is simulated.
    for (name, volume) in &model {
        let buf = read_volume(&pool, name, volume.data.len() as u64);
        assert!(
            buf == *volume.data,
            "seed {seed}: live volume {name} differs from the model"
        );
    }
    let ops = device.ops();
    drop(pool);
    let punches = ops
        .iter()
        .filter(|op| matches!(op, grove_store::testing::DeviceOp::Punch { .. }))
        .count();
    PUNCHES_LOGGED.fetch_add(punches, std::sync::atomic::Ordering::Relaxed);
    check_crash_points(seed, ops, &states)
}

/// Punches the workloads logged: crash images keep, lose or tear them like
/// writes, and a punch that reached a live block would show as a sector
/// that reads zeros where the model has data.
static PUNCHES_LOGGED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// What the crash images of a log exercised.
#[derive(Default)]
struct Checked {
    states: usize,
    /// Images whose open rebuilt a torn allocation map.
    maps_rebuilt: usize,
    /// Images whose open rebuilt the share counts (a torn count block, or
    /// a torn map, which held the bits saying which count blocks exist).
    counts_rebuilt: usize,
}

impl std::ops::AddAssign for Checked {
    fn add_assign(&mut self, other: Checked) {
        self.states += other.states;
        self.maps_rebuilt += other.maps_rebuilt;
        self.counts_rebuilt += other.counts_rebuilt;
    }
}

fn check_crash_points(
    seed: u64,
    ops: Vec<grove_store::testing::DeviceOp>,
    states: &[ModelState],
) -> Checked {
    let mut rng = Rng(seed ^ 0x5151_5151);
    let first = states[0].log_position;
    let last = states.last().unwrap().log_position;
    let mut images = crash_images(Vec::new(), ops);
    let mut checked = Checked::default();
    for position in first..=last {
        // The last durable state at or before the cut, and every state the
        // operation in progress could have reached.
        let durable = states
            .iter()
            .rposition(|s| s.durable && s.log_position <= position)
            .unwrap();
        let in_progress = states
            .iter()
            .position(|s| s.log_position >= position)
            .unwrap_or(states.len() - 1);
        let end_position = states[in_progress].log_position;
        let candidates: Vec<&Model> = states[durable..]
            .iter()
            .take_while(|s| s.log_position <= end_position)
            .map(|s| &s.model)
            .collect();
        let volatile = images.volatile_writes(position);
        let mut fates: Vec<Box<dyn FnMut(usize) -> WriteFate>> = vec![
            Box::new(|_| WriteFate::Lost),
            Box::new(|_| WriteFate::Landed),
        ];
        // Every write torn, one half of its sectors landed and the other
        // half lost, both ways round: a block rewritten in place whose
        // changes span sectors (a map or share-count block at checkpoint)
        // is then surely torn whenever it is among the volatile writes.
        for mask in TORN_EVERY_WRITE_MASKS {
            fates.push(Box::new(move |_| WriteFate::Torn(mask)));
        }
        for _ in 0..RANDOM_IMAGES_PER_POINT {
            let mut fate_rng = Rng(rng.next() | 1);
            fates.push(Box::new(move |_| match fate_rng.below(4) {
                0 => WriteFate::Lost,
                1 => WriteFate::Torn(fate_rng.next()),
                _ => WriteFate::Landed,
            }));
        }
        if volatile == 0 {
            fates.truncate(1);
        }
        for (variant, fate) in fates.into_iter().enumerate() {
            let image = images.image(position, fate);
            let context =
                format!("seed {seed}, crash after op {position} of the log, variant {variant}");
            let warnings = check_image(image, &candidates, &context);
            checked.states += 1;
            if warnings
                .iter()
                .any(|w| w.contains("allocation maps of groups"))
            {
                checked.maps_rebuilt += 1;
            }
            if warnings
                .iter()
                .any(|w| w.contains("share counts were rebuilt"))
            {
                checked.counts_rebuilt += 1;
            }
        }
    }
    checked
}

/// Crash images whose check is repeated in windows of 1,000 blocks.
const WINDOWED_CHECK_EVERY: u64 = 50;

/// Checks one crash image; returns the warnings of its first check (what
/// opening it had to rebuild).
fn check_image(image: Vec<u8>, candidates: &[&Model], context: &str) -> Vec<String> {
    let pool = Pool::open_device(
        Arc::new(MemDevice::from_bytes(image)),
        Path::new("crash-sim"),
        None,
    )
    .unwrap_or_else(|e| panic!("{context}: the pool does not open: {e}"));
    let report = pool
        .check(false)
        .unwrap_or_else(|e| panic!("{context}: check failed to run: {e}"));
    assert!(
        report.is_clean(),
        "{context}: check found errors: {:?}",
        report.errors
    );
    let open_warnings = report.warnings.clone();
    // Now and then, the check in windows (as a pool too large for one pass
    // is checked) must find the same leftovers a crash leaves.
    static IMAGES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let image = IMAGES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if image.is_multiple_of(WINDOWED_CHECK_EVERY) {
        let windowed = pool.check_in_windows_for_tests(false, 1000).unwrap();
        assert_eq!(
            (
                &windowed.errors,
                &windowed.warnings,
                windowed.blocks_checked
            ),
            (&report.errors, &report.warnings, report.blocks_checked),
            "{context}: a check in windows disagrees"
        );
    }
    // Whatever the cut interrupted, reclaiming to the end leaves exactly
    // the reachable blocks allocated: nothing leaked, no count held back.
    pool.reclaim_all(|_| {})
        .unwrap_or_else(|e| panic!("{context}: reclaim after the crash: {e}"));
    let report = pool.check(false).unwrap();
    assert!(
        report.is_clean()
            && !report
                .warnings
                .iter()
                .any(|w| w.contains("leaked") || w.contains("more references")),
        "{context}: after reclaim, check: {:?} {:?}",
        report.errors,
        report.warnings
    );
    let volumes = pool.volumes().unwrap();
    for name in candidates[0].keys() {
        if candidates.iter().all(|m| m.contains_key(name)) {
            assert!(
                volumes.iter().any(|v| &v.summary.name == name),
                "{context}: durable volume {name} is missing"
            );
        }
    }
    for info in &volumes {
        let versions: Vec<&VolumeModel> = candidates
            .iter()
            .filter_map(|m| m.get(&info.summary.name))
            .filter(|v| {
                v.data.len() as u64 == info.summary.size_bytes
                    && v.writable != info.summary.read_only
            })
            .collect();
        assert!(
            !versions.is_empty(),
            "{context}: volume {} ({} bytes) never existed like this",
            info.summary.name,
            info.summary.size_bytes
        );
        let mut data = vec![0u8; info.summary.size_bytes as usize];
        pool.volume(&info.summary.name)
            .unwrap()
            .read_at(&mut data, 0)
            .unwrap();
        for (sector, got) in data.chunks(SECTOR_BYTES).enumerate() {
            let range = sector * SECTOR_BYTES..sector * SECTOR_BYTES + got.len();
            if !versions.iter().any(|v| v.data[range.clone()] == *got) {
                let heads: Vec<&[u8]> = versions
                    .iter()
                    .map(|v| &v.data[range.start..range.start + 8])
                    .collect();
                let elsewhere: Vec<String> = candidates
                    .iter()
                    .flat_map(|m| m.iter())
                    .filter(|(_, v)| v.data.chunks(SECTOR_BYTES).any(|c| c == got))
                    .map(|(n, _)| n.clone())
                    .collect();
                panic!(
                    "{context}: volume {} sector {sector} holds data it never had: {:?}, legitimate: {heads:?}; that data belongs to {elsewhere:?}",
                    info.summary.name,
                    &got[..8]
                );
            }
        }
    }
    open_warnings
}

/// Regression (found by seed 247 of an earlier workload generator): a
/// shrink used to zero the tail of the new last block in place before the
/// commit that changed the size, so a crash in between showed the old size
/// with part of its data zeroed. Crashes at every point of a shrink and a
/// grow back must show either size with legitimate contents.
#[test]
fn crash_during_shrink_and_grow_shows_old_or_new_volume() {
    let (device, pool) = format_crash_pool(None, JOURNAL_BYTES);
    let mut script = Script::new(&device);
    script.create_volume(&pool, "v", 200 * 1024);
    script.record(true);
    script.write(&pool, "v", 60 * 1024, &pattern(7, 20 * 1024));
    pool.flush().unwrap();
    script.record(true);
    // Shrink to a size that ends in the middle of a block, then grow back.
    for size in [64 * 1024 + 512, 200 * 1024] {
        pool.resize_volume("v", size).unwrap();
        script.data("v").resize(size as usize, 0);
        script.record(true);
    }
    let ops = device.ops();
    drop(pool);
    assert!(check_crash_points(247, ops, &script.states).states > 20);
}

/// A node's block that is freed and then reused for data, all inside one
/// journal lap, must not get the node's old image back at replay (the
/// journal's revoke rule), and a block must not be reused before the
/// transaction that frees it is durable. A one-group pool makes next-fit
/// wrap around and reuse the freed blocks at once.
#[test]
fn freed_node_blocks_reused_for_data_survive_replay() {
    // (flush between the free and the reuse, bytes freed): a small free
    // stays below the auto-commit size, so its blocks would be reused while
    // the free is not yet durable unless the allocator holds them back.
    for (flush_between, discard_bytes) in
        [(true, 128 * 1024), (false, 128 * 1024), (false, 32 * 1024)]
    {
        let (device, pool) = format_crash_pool(Some(1920 * 1024), 1024 * 1024);
        let mut script = Script::new(&device);
        for name in ["v", "w"] {
            script.create_volume(&pool, name, 2 << 20);
        }
        script.record(true);
        // v gets a whole leaf node of data; w fills most of the group.
        script.write(&pool, "v", 0, &pattern(1, 128 * 1024));
        script.write(&pool, "w", 0, &pattern(2, 1700 * 1024));
        pool.flush().unwrap();
        script.record(true);
        // Free v's leaf node and its data, then make w allocate past the
        // end of the group (about 73 blocks are left there), so next-fit
        // wraps onto the freed blocks before any automatic commit.
        pool.volume("v")
            .unwrap()
            .discard(0, discard_bytes as u64)
            .unwrap();
        script.data("v")[..discard_bytes].fill(0);
        if flush_between {
            pool.flush().unwrap();
        }
        script.record(flush_between);
        script.write(&pool, "w", 1700 * 1024, &pattern(3, 90 * 1024));
        script.record(false);
        pool.flush().unwrap();
        script.record(true);
        let ops = device.ops();
        drop(pool);
        // Crash points from the flush after the filler on: the free, the
        // reuse and the flush that follows are what this test is about.
        let states = &script.states[2..];
        assert!(check_crash_points(discard_bytes as u64, ops, states).states > 20);
    }
}

/// A capacity raise (auto-extension during a write, and an explicit one)
/// grows the store file and checkpoints a superblock with the new capacity
/// before any block past the old one is allocated: a crash anywhere in it
/// opens with the old capacity or the new one, never with a journaled
/// allocation past the capacity its superblock names, and every write
/// acknowledged before the last durable point reads back.
#[test]
fn a_crash_anywhere_in_a_capacity_raise_keeps_the_contract() {
    let (device, pool) = format_crash_pool(Some(600 * 1024), JOURNAL_BYTES);
    // The host is unknown in memory: max_capacity alone bounds growth,
    // across the end of the first allocation group.
    pool.set_space_settings(&grove_store::SpaceSettings {
        max_capacity_bytes: Some(4 << 20),
        extend_step: grove_store::Amount::Bytes(300 * 1024),
        ..Default::default()
    })
    .unwrap();
    let mut script = Script::new(&device);
    script.create_volume(&pool, "v", 4 << 20);
    script.record(true);
    let capacity = || pool.info().unwrap().capacity_bytes.unwrap();
    // Writes that fill the capacity several times over: each raise
    // happens inside a write, between flushes.
    for (i, offset) in (0..2600 * 1024).step_by(100 * 1024).enumerate() {
        script.write(&pool, "v", offset, &pattern(i as u64 + 11, 100 * 1024));
        let durable = i % 3 == 2;
        if durable {
            pool.flush().unwrap();
        }
        script.record(durable);
    }
    let extended = capacity();
    assert!(
        extended > 2600 * 1024,
        "the capacity did not grow: {extended}"
    );
    // An explicit raise is durable when it returns.
    pool.raise_capacity(extended + 512 * 1024).unwrap();
    script.record(true);
    let ops = device.ops();
    drop(pool);
    assert!(check_crash_points(600, ops, &script.states).states > 100);
}

/// Runs GROVE_CRASH_WORKLOADS workloads (`default` if unset) from
/// GROVE_CRASH_SEED on; `before` prepares each seed's run. Returns what
/// they checked, how many ran, and whether the count was asked for.
fn run_workloads(default: u64, before: impl Fn(u64)) -> (Checked, u64, bool) {
    let workloads_asked: Option<u64> = std::env::var("GROVE_CRASH_WORKLOADS")
        .ok()
        .and_then(|v| v.parse().ok());
    let workloads = workloads_asked.unwrap_or(default);
    let first_seed: u64 = std::env::var("GROVE_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    assert!(workloads > 0, "GROVE_CRASH_WORKLOADS=0 would check nothing");
    let mut checked = Checked::default();
    for seed in first_seed..first_seed + workloads {
        before(seed);
        checked += run_workload(seed);
    }
    let states = checked.states;
    println!(
        "checked {states} crash states over {workloads} workloads on {:?}; {} rebuilt a torn allocation map, {} the share counts",
        tearing(),
        checked.maps_rebuilt,
        checked.counts_rebuilt
    );
    assert!(
        states >= 1000 * workloads as usize / 2,
        "too few crash states: {states}"
    );
    (checked, workloads, workloads_asked.is_some())
}

#[test]
fn every_crash_state_keeps_the_consistency_contract() {
    let (checked, _, asked) = run_workloads(WORKLOADS_DEFAULT, |_| {});
    let states = checked.states;
    let punches = PUNCHES_LOGGED.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        punches > 0,
        "no workload freed a block: punches went untested"
    );
    if !asked {
        assert!(
            states >= CRASH_STATES_MIN,
            "the default run checked {states} crash states, fewer than the {CRASH_STATES_MIN} promised"
        );
        // Torn maps and count blocks must stay among the states checked:
        // a change in the workloads could make every map change fit one
        // sector again, and the rebuild would go untested.
        assert!(
            checked.maps_rebuilt > 0 && checked.counts_rebuilt > 0,
            "no crash state tore a map ({}) or a count block ({})",
            checked.maps_rebuilt,
            checked.counts_rebuilt
        );
    }
}

/// A power cut while a checkpoint rewrites an allocation map in place tears
/// the map block (some sectors new, some old). The trees say what the map
/// must hold: the pool opens with a warning naming the rebuilt map, `check`
/// is clean, nothing is leaked, every acknowledged write reads back, and
/// the next checkpoint writes a good map again.
#[test]
fn a_map_block_torn_during_a_checkpoint_is_rebuilt_from_the_trees() {
    // A journal large enough that no checkpoint comes before the close:
    // the map it writes then differs from format's in both of its sectors.
    let (device, pool) = format_crash_pool(None, 1024 * 1024);
    let dir = Path::new(CRASH_DIR);
    // The ballast fills the blocks the map's first sector describes, so
    // that v's blocks are described by the second sector.
    pool.create_volume("ballast", BALLAST_BYTES).unwrap();
    pool.volume("ballast")
        .unwrap()
        .write_at(&pattern(1, BALLAST_BYTES as usize), 0)
        .unwrap();
    pool.create_volume("v", 200 * 1024).unwrap();
    let mut expected = vec![0u8; 200 * 1024];
    expected[..150 * 1024].copy_from_slice(&pattern(2, 150 * 1024));
    pool.volume("v")
        .unwrap()
        .write_at(&expected[..150 * 1024], 0)
        .unwrap();
    pool.snapshot("v", "snap").unwrap();
    let snap = expected.clone();
    // Some of the ballast given back: the first sector changes as well.
    pool.volume("ballast")
        .unwrap()
        .discard(0, 300 * 1024)
        .unwrap();
    let overwrite = pattern(3, 20 * 1024);
    pool.volume("v")
        .unwrap()
        .write_at(&overwrite, 10 * 1024)
        .unwrap();
    expected[10 * 1024..30 * 1024].copy_from_slice(&overwrite);
    let mut ballast = pattern(1, BALLAST_BYTES as usize);
    ballast[..300 * 1024].fill(0);
    pool.close().unwrap();

    let ops = device.ops();
    let superblock =
        grove_store::format::superblock::Superblock::decode(&device.to_bytes()[..512]).unwrap();
    let map_offset = superblock.data_start.0 * u64::from(BLOCK_SIZE_BYTES);
    let map_write = ops
        .iter()
        .rposition(|op| {
            matches!(op, grove_store::testing::DeviceOp::Write { offset, .. } if *offset == map_offset)
        })
        .expect("the close's checkpoint writes group 0's map");
    let mut images = CrashImages::new(ops);
    let mut torn = 0;
    for mask in TORN_EVERY_WRITE_MASKS {
        // The cut falls after the map write, before the flush that follows.
        let image = images.image(map_write + 1, |_| WriteFate::Torn(mask));
        let map = &image[map_offset as usize..map_offset as usize + BLOCK_SIZE_BYTES as usize];
        if grove_store::format::group::decode(0, map).is_ok() {
            continue;
        }
        torn += 1;
        let device = Arc::new(MemDevice::from_bytes(image));
        let pool = Pool::open_device(device.clone(), dir, None)
            .unwrap_or_else(|e| panic!("mask {mask:#x}: the pool does not open: {e}"));
        let report = pool.check(false).unwrap();
        assert!(report.is_clean(), "mask {mask:#x}: {:?}", report.errors);
        assert!(
            report
                .warnings
                .iter()
                .any(|w| w.contains("allocation maps of groups 0 were unusable")),
            "mask {mask:#x}: no warning names the rebuilt map: {:?}",
            report.warnings
        );
        assert!(
            !report.warnings.iter().any(|w| w.contains("leaked")
                || w.contains("more references")
                || w.contains("wrong kind")),
            "mask {mask:#x}: the rebuilt map disagrees with the trees: {:?}",
            report.warnings
        );
        let contents = common::contents(&pool);
        assert!(contents["v"] == expected, "mask {mask:#x}: v lost a write");
        assert!(contents["snap"] == snap, "mask {mask:#x}: snap changed");
        assert!(contents["ballast"] == ballast, "mask {mask:#x}: ballast");
        // Opening wrote the rebuilt map: the next open has nothing to say.
        pool.close().unwrap();
        let pool = Pool::open_device(device, dir, None).unwrap();
        let report = pool.check(false).unwrap();
        assert!(
            report.is_clean() && report.warnings.is_empty(),
            "mask {mask:#x}: after reopening: {report:?}"
        );
    }
    assert!(
        torn > 0,
        "neither mask tore the map: the test proves nothing"
    );
}

/// A recursive removal too large for one transaction commits in parts
/// (issue 23). A power cut anywhere in it, with the writes since the last
/// flush lost, landed or torn, leaves a pool that opens, checks clean,
/// keeps the volume outside the family whole, and holds every family
/// member that is still listed with exactly its data; once reclaim ends,
/// nothing is leaked or over-counted.
#[test]
fn a_crash_anywhere_in_a_removal_committed_in_parts_leaves_a_consistent_pool() {
    /// Enough records that the smallest journal needs several parts.
    const FAMILY: usize = 400;
    // The smallest journal: a transaction holds 16 blocks.
    let (device, pool) = format_crash_pool(None, 32 * 1024);
    let size = 64 * 1024;
    pool.create_volume("bystander", size).unwrap();
    let bystander = pattern(7, size as usize);
    pool.volume("bystander")
        .unwrap()
        .write_at(&bystander, 0)
        .unwrap();
    pool.create_volume("root", size).unwrap();
    let root = pattern(8, size as usize);
    pool.volume("root").unwrap().write_at(&root, 0).unwrap();
    let mut model: Model = BTreeMap::new();
    model.insert(
        "root".into(),
        VolumeModel {
            data: Arc::new(root),
            writable: true,
        },
    );
    let mut rng = Rng(0xdead);
    for i in 0..FAMILY {
        let names: Vec<String> = model.keys().cloned().collect();
        let source = names[names.len() - 1 - rng.below(names.len().min(6) as u64) as usize].clone();
        let name = format!("f{i:03}");
        let mut data = model[&source].data.clone();
        let writable = rng.below(3) == 0;
        if writable {
            pool.clone_volume(&source, &name).unwrap();
            let (offset, len) = random_range(&mut rng, size);
            let bytes = pattern(i as u64 + 100, len);
            pool.volume(&name)
                .unwrap()
                .write_at(&bytes, offset)
                .unwrap();
            Arc::make_mut(&mut data)[offset as usize..offset as usize + len]
                .copy_from_slice(&bytes);
        } else {
            pool.snapshot(&source, &name).unwrap();
        }
        model.insert(name, VolumeModel { data, writable });
    }
    pool.flush().unwrap();
    let base = device.to_bytes();
    let logged_before = device.op_count();
    pool.remove(
        "root",
        grove_store::RemoveOptions {
            recursive: true,
            force: false,
        },
    )
    .unwrap();
    drop(pool);
    let ops = device.ops()[logged_before..].to_vec();
    // Each commit ends in a flush, or in its journal write's own (ranged).
    let flushes = ops
        .iter()
        .filter(|op| {
            matches!(
                op,
                grove_store::testing::DeviceOp::Flush
                    | grove_store::testing::DeviceOp::FlushRange { .. }
            )
        })
        .count();
    assert!(
        flushes >= 6,
        "the removal committed in {flushes} flushes: not in parts"
    );
    let mut images = crash_images(base, ops.clone());
    let mut states = 0;
    let mut partly_removed = 0;
    for position in 1..=ops.len() {
        let volatile = images.volatile_writes(position);
        let fates: Vec<Box<dyn Fn(usize) -> WriteFate>> = if volatile == 0 {
            vec![Box::new(|_| WriteFate::Landed)]
        } else {
            vec![
                Box::new(|_| WriteFate::Lost),
                Box::new(|_| WriteFate::Landed),
                Box::new(|i| WriteFate::Torn(TORN_EVERY_WRITE_MASKS[i % 2])),
            ]
        };
        for fate in fates {
            let image = images.image(position, fate);
            states += 1;
            let pool = open_clean_image(image, position);
            let names = pool.volume_names();
            assert!(names.contains(&"bystander".to_string()), "op {position}");
            let buf = read_volume(&pool, "bystander", size);
            assert!(buf == bystander, "op {position}: bystander changed");
            let left = names.iter().filter(|n| model.contains_key(*n)).count();
            if left > 0 && left < model.len() {
                partly_removed += 1;
            }
            for name in names.iter().filter(|n| *n != "bystander") {
                let expected = model
                    .get(name)
                    .unwrap_or_else(|| panic!("op {position}: {name}?"));
                let buf = read_volume(&pool, name, size);
                assert!(buf == *expected.data, "op {position}: {name} differs");
            }
            pool.reclaim_all(|_| {}).unwrap();
            let report = pool.check(false).unwrap();
            assert!(
                report.is_clean(),
                "op {position} after reclaim: {:?}",
                report.errors
            );
            assert!(
                !report.loses_space(),
                "op {position} after reclaim: {:?}",
                report.warnings
            );
        }
    }
    assert!(partly_removed > 0, "no crash state fell between two parts");
    println!(
        "{states} crash states in a removal of {FAMILY} volumes; {partly_removed} between parts"
    );
}

/// A receive's life on disk: a partial receive made from a snapshot,
/// written in steps whose progress commits with their data, turned into a
/// snapshot, marked by a cursor. At every crash point the pool is clean,
/// a partial receive is never visible as a snapshot, the progress it
/// recorded never runs ahead of the data it holds, and the finished
/// snapshot is whole.
#[test]
fn a_crash_anywhere_in_a_receive_never_shows_a_partial_snapshot() {
    let (device, pool) = format_crash_pool(None, JOURNAL_BYTES);
    let size: u64 = 96 * 1024;
    pool.create_volume("v", size).unwrap();
    let old = pattern(3, size as usize);
    pool.volume("v").unwrap().write_at(&old, 0).unwrap();
    pool.snapshot("v", "v@1").unwrap();
    let base_guid = pool.identity("v@1").unwrap().guid;
    pool.flush().unwrap();
    let base = device.to_bytes();
    let logged_before = device.op_count();
    let new = pattern(4, size as usize);
    let target_guid = *b"received-target!";
    let volume = pool
        .begin_receive("r@1", Some(base_guid), target_guid, size)
        .unwrap();
    let steps = [32 * 1024u64, 64 * 1024, size];
    let mut at = 0u64;
    for end in steps {
        volume
            .write_at(&new[at as usize..end as usize], at)
            .unwrap();
        pool.record_receive_progress("r@1", end).unwrap();
        at = end;
    }
    drop(volume);
    pool.finish_receive("r@1", 1_700_000_000, true).unwrap();
    pool.set_cursor("offsite", "r@1").unwrap();
    // The cursor holds its snapshot: removing it takes --force, and the
    // cursor stays as a bookmark.
    assert!(pool.remove_volume("r@1").is_err());
    let forced = RemoveOptions {
        force: true,
        ..RemoveOptions::default()
    };
    pool.remove("r@1", forced).unwrap();
    drop(pool);
    let ops = device.ops()[logged_before..].to_vec();
    let mut images = crash_images(base, ops.clone());
    let (mut partial_states, mut finished_states) = (0, 0);
    for position in 1..=ops.len() {
        for fate in [WriteFate::Lost, WriteFate::Landed] {
            let image = images.image(position, |_| fate);
            let pool = open_clean_image(image, position);
            match (
                pool.partial_receive("r@1"),
                pool.snapshot_by_guid(&target_guid),
            ) {
                (Some(_), Some(_)) => panic!("op {position}: partial and finished at once"),
                (Some(partial), None) => {
                    partial_states += 1;
                    assert!(
                        !pool.volume_names().contains(&"r@1".to_string()),
                        "op {position}: a partial receive is listed"
                    );
                    let progress = partial.progress_bytes as usize;
                    let mut buf = vec![0u8; size as usize];
                    pool.receive_volume("r@1")
                        .unwrap()
                        .read_at(&mut buf, 0)
                        .unwrap();
                    assert!(
                        buf[..progress] == new[..progress],
                        "op {position}: progress {progress} runs ahead of the data"
                    );
                }
                (None, Some(snapshot)) => {
                    finished_states += 1;
                    let buf = read_volume(&pool, &snapshot.name, size);
                    assert!(
                        buf == new,
                        "op {position}: the received snapshot is not whole"
                    );
                }
                (None, None) => {
                    // Before the partial receive's first commit, or after
                    // the finished snapshot was removed: then the cursor
                    // still marks it.
                    if pool.cursors().is_empty() {
                        assert!(pool.partial_receives().is_empty());
                    } else {
                        assert_eq!(pool.cursors()[0].target, "offsite");
                    }
                }
            }
            let buf = read_volume(&pool, "v@1", size);
            assert!(buf == old, "op {position}: the base changed");
        }
    }
    assert!(partial_states > 0 && finished_states > 0);
    println!("{partial_states} partial, {finished_states} finished crash states checked");
}

/// A retained snapshot's life on disk: taken with a rank, ranked again,
/// held under two tags (one with a lease), one hold released, a forced
/// removal that takes the last hold with it. At every crash point the pool
/// is clean, the snapshot is either missing (not yet taken, or removed) or
/// whole with one of the ranks it was given, and a hold is only ever on it
/// with its own lease: nothing half-written shows.
#[test]
fn a_crash_anywhere_in_ranking_and_holding_shows_each_change_whole_or_not_at_all() {
    let (device, pool) = format_crash_pool(None, JOURNAL_BYTES);
    let size: u64 = 64 * 1024;
    pool.create_volume("v", size).unwrap();
    let data = pattern(5, size as usize);
    pool.volume("v").unwrap().write_at(&data, 0).unwrap();
    pool.flush().unwrap();
    let base = device.to_bytes();
    let logged_before = device.op_count();
    let lease = 1_900_000_000;
    pool.snapshot_ranked("v", "v@auto", 2, 1_800_000_000)
        .unwrap();
    pool.set_rank("v@auto", 4).unwrap();
    pool.hold("v@auto", "backup", None).unwrap();
    pool.hold("v@auto", "audit", Some(lease)).unwrap();
    pool.release("v@auto", "backup").unwrap();
    let forced = RemoveOptions {
        recursive: false,
        force: true,
    };
    pool.remove("v@auto", forced).unwrap();
    drop(pool);
    let ops = device.ops()[logged_before..].to_vec();
    let mut images = crash_images(base, ops.clone());
    let (mut held_states, mut taken_states) = (0, 0);
    for position in 1..=ops.len() {
        for fate in [WriteFate::Lost, WriteFate::Landed] {
            let image = images.image(position, |_| fate);
            let pool = open_clean_image(image, position);
            let holds = pool.holds();
            match pool.volume_summary("v@auto") {
                Ok(summary) => {
                    taken_states += 1;
                    assert!(
                        summary.rank == 2 || summary.rank == 4,
                        "op {position}: rank {}",
                        summary.rank
                    );
                    assert_eq!(summary.created_unix_secs, 1_800_000_000);
                    let buf = read_volume(&pool, "v@auto", size);
                    assert!(buf == data, "op {position}: the snapshot is not whole");
                    for hold in &holds {
                        assert_eq!(hold.snapshot, "v@auto", "op {position}");
                        let expected = (hold.tag == "audit").then_some(lease);
                        assert_eq!(hold.until_unix_secs, expected, "op {position}: {hold:?}");
                    }
                    if !holds.is_empty() {
                        held_states += 1;
                    }
                }
                Err(_) => assert!(
                    holds.is_empty(),
                    "op {position}: holds outlive their snapshot: {holds:?}"
                ),
            }
        }
    }
    assert!(taken_states > 0 && held_states > 0);
    println!("{taken_states} crash states with the snapshot, {held_states} of them held");
}

/// The crash scenarios again on an object store's semantics, as
/// grove-rados stores a pool in RADOS (`Tearing::Objects`), with objects
/// small enough that requests span them: 64 KiB, and for every other
/// workload 4 KiB, grove-rados's smallest, where a journal transaction or
/// a bulk write spans many. (The torn map block is a disk's case only: a
/// block never spans two objects.)
mod on_objects {
    use super::*;

    const OBJECT_BYTES: u64 = 64 * 1024;
    const SMALLEST_OBJECT_BYTES: u64 = 4096;
    const WORKLOADS_DEFAULT: u64 = 8;

    fn set_objects(object_bytes: u64) {
        TEARING.with(|t| t.set(Tearing::Objects { object_bytes }));
    }

    fn on_objects(test: fn()) {
        set_objects(OBJECT_BYTES);
        test();
    }

    #[test]
    fn every_crash_state_keeps_the_consistency_contract() {
        let object_bytes = |seed: u64| {
            if seed.is_multiple_of(2) {
                OBJECT_BYTES
            } else {
                SMALLEST_OBJECT_BYTES
            }
        };
        run_workloads(WORKLOADS_DEFAULT, |seed| set_objects(object_bytes(seed)));
    }

    #[test]
    fn crash_during_shrink_and_grow_shows_old_or_new_volume() {
        on_objects(super::crash_during_shrink_and_grow_shows_old_or_new_volume);
    }

    #[test]
    fn freed_node_blocks_reused_for_data_survive_replay() {
        on_objects(super::freed_node_blocks_reused_for_data_survive_replay);
    }

    #[test]
    fn a_crash_anywhere_in_a_capacity_raise_keeps_the_contract() {
        on_objects(super::a_crash_anywhere_in_a_capacity_raise_keeps_the_contract);
    }

    #[test]
    fn a_crash_anywhere_in_a_removal_committed_in_parts_leaves_a_consistent_pool() {
        on_objects(
            super::a_crash_anywhere_in_a_removal_committed_in_parts_leaves_a_consistent_pool,
        );
    }

    #[test]
    fn a_crash_anywhere_in_a_receive_never_shows_a_partial_snapshot() {
        on_objects(super::a_crash_anywhere_in_a_receive_never_shows_a_partial_snapshot);
    }

    #[test]
    fn a_crash_anywhere_in_ranking_and_holding_shows_each_change_whole_or_not_at_all() {
        on_objects(
            super::a_crash_anywhere_in_ranking_and_holding_shows_each_change_whole_or_not_at_all,
        );
    }
}
