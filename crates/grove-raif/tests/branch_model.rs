//! The engine's model test (grove-store's tests/model.rs, included as it
//! is) run on a pool over branches: RAIF5 over four in-memory branches,
//! with a small staging limit so that writes commit on their own too.
//! Reopens lose a branch (the second reopen of a case: the pool runs
//! degraded from then on) and later replace and rebuild it (the fourth),
//! so the model referees degraded operation and rebuild as well.
//!
//! Including the file brings its own tests along, which run here on the
//! single-file pool again; `branch_pool_matches_the_model` is the one
//! this file adds.

#[allow(dead_code)]
#[path = "../../grove-store/tests/model.rs"]
mod model;

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
