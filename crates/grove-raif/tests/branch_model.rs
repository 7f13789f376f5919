//! The engine's model test (grove-store's tests/model.rs, included as it
//! is) run on a pool over branches: RAIF5 over four in-memory branches,
//! with a small staging limit so that writes commit on their own too.
//! Reopens lose a branch (the second reopen of a case: the pool runs
//! degraded from then on) and later replace and rebuild it (the fourth),
//! so the model referees degraded operation and rebuild as well.
//!
//! Including the file brings its own tests along, which run here on the
//! single-file pool again; `branch_pool_matches_the_model` and
//! `grown::a_growing_branch_pool_matches_the_model` are the ones this file
//! adds.

#[allow(dead_code)]
#[path = "../../grove-store/tests/model.rs"]
mod model;

#[allow(dead_code)]
mod common;

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use grove_raif::branch_pool::{BranchDevice, Health, MemberDevices, MemberSpec};
use grove_raif::Level;
use grove_store::{MemDevice, Pool, PoolOptions};

const WIDTH: usize = 4;
const LEVEL: Level = Level::Raif5;
const UNIT_BYTES: u64 = 1024;
/// The branch lost at the second reopen and rebuilt at the fourth.
const LOST_BRANCH: usize = 3;

/// The branches of one model pool, kept across its reopens.
struct Branches {
    devices: Vec<MemberDevices>,
    reopens: u32,
}

thread_local! {
    static POOLS: RefCell<HashMap<PathBuf, Branches>> = RefCell::new(HashMap::new());
}

fn memory_branch() -> MemberDevices {
    MemberDevices {
        data: Arc::new(MemDevice::new()),
        journal: Arc::new(MemDevice::new()),
        sums: Arc::new(MemDevice::new()),
    }
}

fn assemble(devices: &[MemberDevices], lost: Option<usize>) -> grove_store::Result<BranchDevice> {
    let specs = devices
        .iter()
        .enumerate()
        .map(|(b, d)| MemberSpec {
            label: format!("b{b}"),
            place: format!("memory {b}"),
            devices: (Some(b) != lost).then(|| d.clone()),
            health: Health::Healthy,
        })
        .collect();
    BranchDevice::assemble(LEVEL, UNIT_BYTES, specs, None)
        .map(|device| device.with_staging_limit(64 * 1024))
        .map_err(|e| grove_store::Error::io("assemble the branch pool", e))
}

fn create(path: &Path, options: &PoolOptions) -> grove_store::Result<Pool> {
    std::fs::create_dir_all(path).map_err(|e| grove_store::Error::io("pool dir", e))?;
    let devices: Vec<MemberDevices> = (0..WIDTH).map(|_| memory_branch()).collect();
    let device = Arc::new(assemble(&devices, None)?);
    POOLS.with(|pools| {
        pools.borrow_mut().insert(
            path.to_path_buf(),
            Branches {
                devices,
                reopens: 0,
            },
        )
    });
    Pool::format(device, options, path, None)
}

fn open(path: &Path) -> grove_store::Result<Pool> {
    let (devices, reopens) = POOLS.with(|pools| {
        let mut pools = pools.borrow_mut();
        let branches = pools.get_mut(path).expect("a pool this test made");
        branches.reopens += 1;
        (branches.devices.clone(), branches.reopens)
    });
    let device = match reopens {
        0 | 1 => assemble(&devices, None)?,
        2 | 3 => assemble(&devices, Some(LOST_BRANCH))?,
        4 => {
            let device = assemble(&devices, Some(LOST_BRANCH))?;
            let fresh = memory_branch();
            let label = format!("b{LOST_BRANCH}");
            device
                .replace(&label, "memory replacement".into(), fresh.clone())
                .and_then(|()| device.rebuild(&label, &mut |_, _| {}, &|| false))
                .map_err(|e| grove_store::Error::io("rebuild", e))?;
            POOLS.with(|pools| {
                pools.borrow_mut().get_mut(path).expect("known").devices[LOST_BRANCH] = fresh;
            });
            device
        }
        _ => assemble(&devices, None)?,
    };
    Pool::open_device(Arc::new(device), path, None)
}

#[test]
fn branch_pool_matches_the_model() {
    model::POOL_HOST.with(|host| host.set(model::PoolHost { create, open }));
    model::run_model();
}

/// The model test on a pool that grows: RAIF5 over three branches whose
/// files live in one `RecordedFiles` per pool, kept across reopens. The
/// second reopen adds a branch (new space over four), the third
/// restripes (every byte the engine stored is copied), the fourth loses
/// branch b1 (degraded from then on), and the fifth replaces and rebuilds
/// it, so the model referees growth and restripe under the engine.
mod grown {
    use super::*;

    use crate::common::recorded::RecordedFiles;
    use grove_raif::branch_pool::{BranchFiles, BranchSpec};

    const FIRST_WIDTH: usize = 3;
    const LOST: usize = 1;

    struct Grown {
        files: Arc<RecordedFiles>,
        places: Vec<String>,
        reopens: u32,
    }

    thread_local! {
        static GROWN: RefCell<HashMap<PathBuf, Grown>> = RefCell::new(HashMap::new());
        /// Adds, restripes and rebuilds done, and bytes restriped.
        static DONE: RefCell<[u64; 4]> = const { RefCell::new([0; 4]) };
    }

    fn count(what: usize, by: u64) {
        DONE.with(|done| done.borrow_mut()[what] += by);
    }

    fn io(what: &'static str) -> impl Fn(std::io::Error) -> grove_store::Error {
        move |e| grove_store::Error::io(what, e)
    }

    fn open_device(
        files: &Arc<RecordedFiles>,
        places: &[String],
        lost: Option<usize>,
    ) -> grove_store::Result<BranchDevice> {
        let specs = places
            .iter()
            .enumerate()
            .map(|(b, place)| BranchSpec {
                label: format!("b{b}"),
                place: place.clone(),
                usable: Some(b) != lost,
            })
            .collect();
        BranchDevice::open(LEVEL, UNIT_BYTES, specs, files.clone(), None)
            .map(|device| {
                device
                    .with_staging_limit(64 * 1024)
                    .with_restripe_batch(16 * 1024)
            })
            .map_err(io("open the branch pool"))
    }

    fn create(path: &Path, options: &PoolOptions) -> grove_store::Result<Pool> {
        std::fs::create_dir_all(path).map_err(|e| grove_store::Error::io("pool dir", e))?;
        let files = Arc::new(RecordedFiles::new());
        let places: Vec<String> = (0..FIRST_WIDTH).map(|b| format!("branch{b}")).collect();
        for place in &places {
            files.segment(place, 0, true).map_err(io("branch files"))?;
        }
        let device = Arc::new(open_device(&files, &places, None)?);
        GROWN.with(|pools| {
            pools.borrow_mut().insert(
                path.to_path_buf(),
                Grown {
                    files,
                    places,
                    reopens: 0,
                },
            )
        });
        Pool::format(device, options, path, None)
    }

    fn open(path: &Path) -> grove_store::Result<Pool> {
        let (files, mut places, reopens) = GROWN.with(|pools| {
            let mut pools = pools.borrow_mut();
            let grown = pools.get_mut(path).expect("a pool this test made");
            grown.reopens += 1;
            (grown.files.clone(), grown.places.clone(), grown.reopens)
        });
        let label = format!("b{LOST}");
        let device = match reopens {
            2 => {
                let device = open_device(&files, &places, None)?;
                let place = format!("branch{}", places.len());
                device
                    .add_branches(&[(format!("b{}", places.len()), place.clone())])
                    .map_err(io("add a branch"))?;
                places.push(place);
                count(0, 1);
                device
            }
            3 => {
                let device = open_device(&files, &places, None)?;
                let report = device
                    .restripe(&mut |_, _| {}, &|| false)
                    .map_err(io("restripe"))?;
                assert!(!device.needs_restripe());
                count(1, 1);
                count(3, report.bytes_copied);
                device
            }
            4 => open_device(&files, &places, Some(LOST))?,
            5 => {
                let device = open_device(&files, &places, Some(LOST))?;
                let place = format!("branch{LOST}-new");
                device
                    .replace_at(&label, place.clone())
                    .and_then(|()| device.rebuild(&label, &mut |_, _| {}, &|| false))
                    .map_err(io("rebuild"))?;
                places[LOST] = place;
                count(2, 1);
                device
            }
            _ => {
                let lost = (reopens == 4).then_some(LOST);
                open_device(&files, &places, lost)?
            }
        };
        GROWN.with(|pools| {
            pools.borrow_mut().get_mut(path).expect("known").places = places;
        });
        Pool::open_device(Arc::new(device), path, None)
    }

    #[test]
    fn a_growing_branch_pool_matches_the_model() {
        model::POOL_HOST.with(|host| host.set(model::PoolHost { create, open }));
        model::run_model();
        let [adds, restripes, rebuilds, bytes] = DONE.with(|done| *done.borrow());
        eprintln!(
            "grown pools: {adds} adds, {restripes} restripes ({bytes} bytes), {rebuilds} rebuilds"
        );
        assert!(adds > 0 && restripes > 0 && rebuilds > 0 && bytes > 0);
    }
}
