//! Fault injection: EIO on read, write and flush, and ENOSPC on write, at
//! every point of a workload. The caller gets a clean error, nothing panics,
//! the pool stays consistent, and everything works again once the fault
//! clears. A full pool refuses allocations with ENOSPC but still reads,
//! deletes and frees space.

mod common;
use common::contents;
use std::path::Path;
use std::sync::Arc;

use grove_store::testing::{Fault, FaultyDevice};
use grove_store::{ErrorKind, MemDevice, Pool, PoolOptions};

const BLOCK_SIZE_BYTES: u32 = 1024;
const SECTOR_BYTES: usize = 512;
const VOLUME_BYTES: u64 = 256 * 1024;
/// Fault positions tried per kind; the workload has fewer operations of
/// each kind than this, so every position is covered.
const FAULT_POSITIONS_MAX: u64 = 400;

#[derive(Clone, Debug)]
enum Step {
    Create(&'static str),
    Write(&'static str, u64, usize, u8),
    Discard(&'static str, u64, u64),
    Snapshot(&'static str, &'static str),
    Clone(&'static str, &'static str),
    Remove(&'static str),
    Read(&'static str),
    Flush,
}

fn workload() -> Vec<Step> {
    use Step::*;
    vec![
        Create("a"),
        Write("a", 0, 5000, 1),
        Write("a", 70_000, 140_000, 2),
        Flush,
        Snapshot("a", "a1"),
        Write("a", 1000, 3000, 3),
        Clone("a1", "b"),
        Write("b", 128 * 1024, 20_000, 4),
        Discard("a", 64 * 1024, 130 * 1024),
        Read("a"),
        Flush,
        Remove("a1"),
        Write("b", 500, 100, 5),
        Create("c"),
        Write("c", 10_000, 60_000, 6),
        Read("b"),
        Flush,
    ]
}

type Model = std::collections::BTreeMap<String, Vec<u8>>;

fn run_step(pool: &Pool, step: &Step) -> grove_store::Result<()> {
    match step {
        Step::Create(name) => pool.create_volume(name, VOLUME_BYTES).map(drop),
        Step::Write(name, offset, len, fill) => {
            pool.volume(name)?.write_at(&vec![*fill; *len], *offset)
        }
        Step::Discard(name, offset, len) => pool.volume(name)?.discard(*offset, *len),
        Step::Snapshot(source, name) => pool.snapshot(source, name).map(drop),
        Step::Clone(source, name) => pool.clone_volume(source, name).map(drop),
        Step::Remove(name) => pool.remove_volume(name).map(drop),
        Step::Read(name) => {
            let mut buf = vec![0u8; VOLUME_BYTES as usize];
            pool.volume(name)?.read_at(&mut buf, 0)
        }
        Step::Flush => pool.flush(),
    }
}

/// The model after `step` succeeds.
fn apply(model: &mut Model, step: &Step) {
    match step {
        Step::Create(name) => {
            model.insert(name.to_string(), vec![0; VOLUME_BYTES as usize]);
        }
        Step::Write(name, offset, len, fill) => {
            model.get_mut(*name).unwrap()[*offset as usize..*offset as usize + len].fill(*fill);
        }
        Step::Discard(name, offset, len) => {
            model.get_mut(*name).unwrap()[*offset as usize..(*offset + *len) as usize].fill(0);
        }
        Step::Snapshot(source, name) | Step::Clone(source, name) => {
            let data = model[*source].clone();
            model.insert(name.to_string(), data);
        }
        Step::Remove(name) => {
            model.remove(*name);
        }
        Step::Read(_) | Step::Flush => {}
    }
}

impl Step {
    /// Steps that commit before they return: admin steps and flushes.
    fn commits(&self) -> bool {
        !matches!(self, Step::Write(..) | Step::Discard(..) | Step::Read(_))
    }
}

/// After a step failed, the pool must hold the state before the step or
/// after it, sector by sector (a failed write may have landed in part).
fn assert_old_or_new(actual: &Model, before: &Model, after: &Model, context: &str) {
    assert_one_of(actual, &[before.clone(), after.clone()], context)
}

/// Every sector of every volume holds its value in one of `states`; a
/// volume that all of them have is there, and none comes from nowhere.
fn assert_one_of(actual: &Model, states: &[Model], context: &str) {
    let before = &states[0];
    let after = states.last().expect("at least one state");
    for (name, data) in actual {
        let candidates: Vec<&Vec<u8>> = states.iter().filter_map(|s| s.get(name)).collect();
        assert!(
            !candidates.is_empty(),
            "{context}: volume {name} appeared from nowhere"
        );
        for (sector, got) in data.chunks(SECTOR_BYTES).enumerate() {
            let range = sector * SECTOR_BYTES..sector * SECTOR_BYTES + got.len();
            assert!(
                candidates.iter().any(|c| c[range.clone()] == *got),
                "{context}: volume {name} sector {sector} is neither its old nor its new value"
            );
        }
    }
    for name in before.keys() {
        if states.iter().all(|s| s.contains_key(name)) && after.contains_key(name) {
            assert!(
                actual.contains_key(name),
                "{context}: volume {name} vanished"
            );
        }
    }
}

/// Runs the workload with `fault` injected once, after `skip` matching
/// device operations. Returns false if the fault never fired.
fn run_with_fault(fault: Fault, skip: u64) -> bool {
    let memory = Arc::new(MemDevice::new());
    let device = Arc::new(FaultyDevice::new(memory.clone()));
    let options = PoolOptions {
        block_size_bytes: BLOCK_SIZE_BYTES,
        capacity_bytes: None,
        journal_bytes: Some(64 * 1024),
    };
    let dir = Path::new("faults");
    let mut pool = Pool::format(device.clone(), &options, dir, None).unwrap();
    device.arm(fault, skip, false);
    let mut model = Model::new();
    // Every state since the last commit that succeeded: after a failed
    // commit, what the device holds is one of them, sector by sector.
    let mut since_commit: Vec<Model> = vec![model.clone()];
    for (index, step) in workload().iter().enumerate() {
        let context = format!("{fault:?} after {skip} ops, step {index} {step:?}");
        let before = model.clone();
        match run_step(&pool, step) {
            Ok(()) => {
                apply(&mut model, step);
                if step.commits() {
                    since_commit.clear();
                }
                since_commit.push(model.clone());
            }
            Err(error) => {
                assert!(
                    matches!(error.kind(), ErrorKind::Io | ErrorKind::NoSpace),
                    "{context}: unexpected error kind {:?}: {error}",
                    error.kind()
                );
                assert!(
                    !error.to_string().contains('\n'),
                    "{context}: error is not one line"
                );
                let mut after = model.clone();
                apply(&mut after, step);
                if pool.failure().is_some() {
                    // A failed commit: the pool takes no more changes and
                    // says why, and opening it again recovers.
                    let refused = pool.create_volume("refused", VOLUME_BYTES).unwrap_err();
                    assert_eq!(refused.kind(), ErrorKind::ReadOnly, "{context}: {refused}");
                    assert!(refused.to_string().contains("commit failed"), "{refused}");
                    drop(pool);
                    device.clear();
                    pool = Pool::open_device(device.clone(), dir, None)
                        .unwrap_or_else(|e| panic!("{context}: reopen: {e}"));
                    since_commit.push(after);
                    let actual = contents(&pool);
                    assert_one_of(&actual, &since_commit, &context);
                    model = actual;
                    // Do the step again, so the rest of the workload finds
                    // what it expects; if it had taken effect before, redoing
                    // it is refused or changes nothing.
                    match run_step(&pool, step) {
                        Ok(()) => apply(&mut model, step),
                        Err(e)
                            if matches!(
                                e.kind(),
                                ErrorKind::AlreadyExists | ErrorKind::NotFound
                            ) => {}
                        Err(e) => panic!("{context}: step again after reopen: {e}"),
                    }
                    pool.flush().unwrap();
                    since_commit = vec![model.clone()];
                    continue;
                }
                // Not a commit: the fault was one-shot, flushing again must
                // now work, and the step left either the old or the new state.
                pool.flush()
                    .unwrap_or_else(|e| panic!("{context}: flush after the fault cleared: {e}"));
                let actual = contents(&pool);
                assert_old_or_new(&actual, &before, &after, &context);
                model = actual;
                since_commit = vec![model.clone()];
            }
        }
    }
    let fired = device.injected() > 0;
    device.clear();
    let context = format!("{fault:?} after {skip} ops");
    pool.flush().unwrap();
    let report = pool.check(false).unwrap();
    assert!(report.is_clean(), "{context}: check: {:?}", report.errors);
    assert_eq!(
        contents(&pool),
        model,
        "{context}: contents differ from the model"
    );
    pool.close().unwrap();
    let reopened = Pool::open_device(
        Arc::new(MemDevice::from_bytes(memory.to_bytes())),
        dir,
        None,
    )
    .unwrap();
    let report = reopened.check(false).unwrap();
    assert!(
        report.is_clean(),
        "{context}: check after reopen: {:?}",
        report.errors
    );
    assert_eq!(
        contents(&reopened),
        model,
        "{context}: contents differ after reopen"
    );
    fired
}

#[test]
fn every_single_fault_gives_a_clean_error_and_a_consistent_pool() {
    for fault in [
        Fault::ReadEio,
        Fault::WriteEio,
        Fault::WriteEnospc,
        Fault::FlushEio,
    ] {
        let mut fired = 0;
        for skip in 0..FAULT_POSITIONS_MAX {
            if !run_with_fault(fault, skip) {
                break;
            }
            fired += 1;
        }
        assert!(fired > 0, "{fault:?} never fired");
        assert!(
            fired < FAULT_POSITIONS_MAX,
            "{fault:?}: raise FAULT_POSITIONS_MAX"
        );
        println!("{fault:?}: injected at {fired} positions");
    }
}

#[test]
fn capacity_is_exact_to_the_block() {
    // 64 KiB blocks make 8 GiB groups; a 20 MiB capacity must still mean
    // 20 MiB, not a whole group.
    let options = PoolOptions {
        block_size_bytes: 64 * 1024,
        capacity_bytes: Some(20 << 20),
        journal_bytes: None,
    };
    let pool = Pool::format(Arc::new(MemDevice::new()), &options, Path::new("cap"), None).unwrap();
    let info = pool.info().unwrap();
    assert_eq!(info.capacity_bytes, Some(20 << 20));
    assert!(
        info.free_bytes < 20 << 20,
        "free {} exceeds the capacity",
        info.free_bytes
    );
    pool.create_volume("v", 1 << 30).unwrap();
    let volume = pool.volume("v").unwrap();
    let chunk = vec![9u8; 1 << 20];
    let mut written = 0u64;
    let error = loop {
        match volume.write_at(&chunk, written) {
            Ok(()) => written += chunk.len() as u64,
            Err(e) => break e,
        }
    };
    assert_eq!(error.kind(), ErrorKind::NoSpace, "{error}");
    assert!(
        (18 << 20..=20 << 20).contains(&written),
        "wrote {written} bytes into 20 MiB"
    );
    pool.flush().unwrap();
    assert!(pool.check(false).unwrap().is_clean());
}

#[test]
fn enospc_from_the_host_becomes_nospace() {
    let memory = Arc::new(MemDevice::new());
    let device = Arc::new(FaultyDevice::new(memory));
    let pool = Pool::format(
        device.clone(),
        &PoolOptions::default(),
        Path::new("faults"),
        None,
    )
    .unwrap();
    pool.create_volume("v", 1 << 20).unwrap();
    device.arm(Fault::WriteEnospc, 0, true);
    let error = pool
        .volume("v")
        .unwrap()
        .write_at(&[7u8; 4096], 0)
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::NoSpace, "{error}");
    device.clear();
    // If the failure hit a commit the pool went read-only: open it again.
    let pool = if pool.failure().is_some() {
        drop(pool);
        Pool::open_device(device.clone(), Path::new("faults"), None).unwrap()
    } else {
        pool
    };
    pool.volume("v").unwrap().write_at(&[7u8; 4096], 0).unwrap();
    pool.flush().unwrap();
}

#[test]
fn a_full_pool_refuses_allocation_but_reads_deletes_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    // 1.9 MiB of 1 KiB blocks: exactly one allocation group.
    let options = PoolOptions {
        block_size_bytes: BLOCK_SIZE_BYTES,
        capacity_bytes: Some(1920 * 1024),
        journal_bytes: Some(64 * 1024),
    };
    // A fixed capacity: auto-extension would grow it into the host.
    let fixed = grove_store::SpaceSettings {
        auto_extend: false,
        ..Default::default()
    };
    let pool = Pool::create_with_space(&path, &options, &fixed).unwrap();
    pool.create_volume("keep", 1 << 20).unwrap();
    pool.create_volume("fill", 8 << 20).unwrap();
    let keep = pool.volume("keep").unwrap();
    keep.write_at(&[1u8; 100_000], 0).unwrap();
    pool.flush().unwrap();
    let fill = pool.volume("fill").unwrap();
    let chunk = vec![2u8; 64 * 1024];
    let mut written = 0u64;
    let error = loop {
        match fill.write_at(&chunk, written) {
            Ok(()) => written += chunk.len() as u64,
            Err(e) => break e,
        }
        assert!(written < 8 << 20, "the pool never filled");
    };
    assert_eq!(error.kind(), ErrorKind::NoSpace, "{error}");
    assert!(error.to_string().contains("full"), "{error}");
    // Reads still work.
    let mut buf = vec![0u8; 100_000];
    keep.read_at(&mut buf, 0).unwrap();
    assert!(buf.iter().all(|&b| b == 1));
    // Removing a volume frees its space and writing works again. It is
    // claimed here (as by a client), so that takes --force.
    let claim = fill.claim();
    assert_eq!(
        pool.remove_volume("fill").unwrap_err().kind(),
        ErrorKind::Busy
    );
    let options = grove_store::RemoveOptions {
        recursive: false,
        force: true,
    };
    let freed = pool.remove("fill", options).unwrap();
    assert!(freed > 0);
    assert!(pool.reclaim_all(|_| {}).unwrap() >= freed);
    pool.create_volume("again", 1 << 20).unwrap();
    pool.volume("again")
        .unwrap()
        .write_at(&[3u8; 500_000], 0)
        .unwrap();
    pool.flush().unwrap();
    let report = pool.check(false).unwrap();
    assert!(report.is_clean(), "{:?}", report.errors);
    drop((keep, fill, claim));
    pool.close().unwrap();
    let reopened = Pool::open(&path).unwrap();
    assert!(reopened.check(false).unwrap().is_clean());
}
