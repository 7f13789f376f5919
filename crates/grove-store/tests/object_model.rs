//! The engine's model test (tests/model.rs, included as it is) run on the
//! crash simulator with an object store's semantics, as grove-rados stores
//! a pool in RADOS (`Tearing::Objects`, 64 KiB objects so that requests
//! span them). Every reopen, after a close or a plain drop, cuts the power
//! first: the pool opens on the crash image the log leaves, each write since
//! the last flush kept, lost, or kept in some of its objects only (an
//! object's writes in order). What the model expects is what the engine
//! made durable, so it must agree with every such image exactly.
//!
//! Before it does, a power cut at a random point of the log since the last
//! reopen (in the middle of any of the model's operations, the rolling
//! lines, receives and holds included) must leave a pool that opens and
//! checks clean.
//!
//! Including the file brings its own tests along, which run here on the
//! file pool again; `object_store_pool_matches_the_model` is the one this
//! file adds.

#[allow(dead_code)]
mod model;

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use grove_store::testing::{CrashDevice, CrashImages, Tearing, WriteFate};
use grove_store::{Pool, PoolOptions};

const TEARING: Tearing = Tearing::Objects {
    object_bytes: 64 * 1024,
};

/// One model pool's device, and the image it started from (its log holds
/// only what came after).
struct Recorded {
    base: Vec<u8>,
    device: Arc<CrashDevice>,
    /// Power cuts so far: they seed the fates.
    cuts: u64,
    /// Where in the log the store is first whole (after format).
    first_position: usize,
}

thread_local! {
    static POOLS: RefCell<HashMap<PathBuf, Recorded>> = RefCell::new(HashMap::new());
}

/// Reopens that found writes since the last flush, and the writes they
/// did not keep whole.
static CUTS_WITH_VOLATILE_WRITES: AtomicU64 = AtomicU64::new(0);
static VOLATILE_WRITES_NOT_KEPT: AtomicU64 = AtomicU64::new(0);
/// Power cuts in the middle of the log that opened and checked clean.
static CUTS_MIDWAY: AtomicU64 = AtomicU64::new(0);

fn create(path: &Path, options: &PoolOptions) -> grove_store::Result<Pool> {
    std::fs::create_dir_all(path).map_err(|e| grove_store::Error::io("pool dir", e))?;
    let device = Arc::new(CrashDevice::new().with_tearing(TEARING));
    let pool = Pool::format(device.clone(), options, path, None)?;
    let recorded = Recorded {
        base: Vec::new(),
        first_position: device.op_count(),
        device,
        cuts: 0,
    };
    POOLS.with(|pools| pools.borrow_mut().insert(path.to_path_buf(), recorded));
    Ok(pool)
}

/// xorshift64*: the fates replay exactly.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// A fate per write since the last flush: kept, lost, or kept in some of
/// its objects, at random.
fn random_fate(state: &mut u64) -> WriteFate {
    match next(state) % 3 {
        0 => WriteFate::Lost,
        1 => WriteFate::Torn(next(state)),
        _ => WriteFate::Landed,
    }
}

fn open(path: &Path) -> grove_store::Result<Pool> {
    let image = POOLS.with(|pools| {
        let mut pools = pools.borrow_mut();
        let recorded = pools.get_mut(path).expect("a pool this test made");
        recorded.cuts += 1;
        let ops = recorded.device.ops();
        let mut images =
            CrashImages::with_base(recorded.base.clone(), ops.clone()).with_tearing(TEARING);
        let mut seed = (recorded.cuts << 32 | ops.len() as u64) | 1;
        let first = recorded.first_position;
        if ops.len() > first {
            let position = first + 1 + (next(&mut seed) % (ops.len() - first) as u64) as usize;
            let image = images.image(position, |_| random_fate(&mut seed));
            check_midway(image, path, position);
        }
        recorded.first_position = 0;
        let volatile = images.volatile_writes(ops.len());
        let mut not_kept = 0;
        let image = images.image(ops.len(), |_| {
            let fate = random_fate(&mut seed);
            not_kept += u64::from(fate != WriteFate::Landed);
            fate
        });
        if volatile > 0 {
            CUTS_WITH_VOLATILE_WRITES.fetch_add(1, Ordering::Relaxed);
            VOLATILE_WRITES_NOT_KEPT.fetch_add(not_kept, Ordering::Relaxed);
        }
        recorded.base = image.clone();
        recorded.device = Arc::new(CrashDevice::from_bytes(image).with_tearing(TEARING));
        recorded.device.clone()
    });
    Pool::open_device(image, path, None)
}

/// A power cut in the middle of the log leaves a pool that opens and
/// checks clean.
fn check_midway(image: Vec<u8>, path: &Path, position: usize) {
    let device = Arc::new(grove_store::MemDevice::from_bytes(image));
    let pool = Pool::open_device(device, path, None)
        .unwrap_or_else(|e| panic!("a power cut after op {position} of the log: {e}"));
    let report = pool.check(false).unwrap_or_else(|e| {
        panic!("a power cut after op {position} of the log: check failed to run: {e}")
    });
    assert!(
        report.is_clean(),
        "a power cut after op {position} of the log: {:?}",
        report.errors
    );
    drop(pool);
    CUTS_MIDWAY.fetch_add(1, Ordering::Relaxed);
}

#[test]
fn object_store_pool_matches_the_model() {
    model::POOL_HOST.with(|host| host.set(model::PoolHost { create, open }));
    model::run_model();
    println!(
        "{} power cuts in the middle of the log checked clean; {} at a reopen found writes since the last flush, {} of which were not kept whole",
        CUTS_MIDWAY.load(Ordering::Relaxed),
        CUTS_WITH_VOLATILE_WRITES.load(Ordering::Relaxed),
        VOLATILE_WRITES_NOT_KEPT.load(Ordering::Relaxed)
    );
    assert!(
        CUTS_MIDWAY.load(Ordering::Relaxed) > 0,
        "no power cut fell in the middle of the log"
    );
}
