//! The branch pool device against a model (a plain byte vector): every
//! level, staged and committed, with branches failing, replaced and
//! rebuilt, and units corrupted then scrubbed; and the engine on top.

mod common;

use common::Rng;
use std::io;
use std::sync::Arc;

use grove_raif::branch_pool::{BranchDevice, Health, MemberDevices, MemberSpec};
use grove_raif::Level;
use grove_store::testing::{Fault, FaultyDevice};
use grove_store::{BlockDevice, MemDevice, Pool, PoolOptions};

const UNIT: u64 = 4096;

/// A branch in memory whose data device can be made to fail.
struct TestBranch {
    data: Arc<FaultyDevice<MemDevice>>,
    journal: Arc<MemDevice>,
    sums: Arc<MemDevice>,
}

impl TestBranch {
    fn new() -> TestBranch {
        TestBranch {
            data: Arc::new(FaultyDevice::new(MemDevice::new())),
            journal: Arc::new(MemDevice::new()),
            sums: Arc::new(MemDevice::new()),
        }
    }

    fn devices(&self) -> MemberDevices {
        MemberDevices {
            data: self.data.clone(),
            journal: self.journal.clone(),
            sums: self.sums.clone(),
        }
    }
}

fn width_of(level: Level) -> usize {
    match level {
        Level::Raif1 => 2,
        Level::Raif0 | Level::Raif4 | Level::Raif5 => 4,
        Level::Raif6 | Level::Raif10 => 4,
    }
}

fn assemble(level: Level, branches: &[TestBranch], failed: &[usize]) -> io::Result<BranchDevice> {
    let specs = branches
        .iter()
        .enumerate()
        .map(|(i, b)| MemberSpec {
            label: format!("b{i}"),
            place: format!("memory {i}"),
            devices: (!failed.contains(&i)).then(|| b.devices()),
            health: Health::Healthy,
        })
        .collect();
    BranchDevice::assemble(level, UNIT, specs, None)
}

fn random_writes(device: &BranchDevice, model: &mut [u8], rng: &mut Rng, count: usize) {
    for _ in 0..count {
        let len = 1 + rng.below(3 * UNIT) as usize;
        let offset = rng.below(model.len() as u64 - len as u64);
        let byte = rng.next() as u8;
        let data: Vec<u8> = (0..len).map(|i| byte.wrapping_add(i as u8)).collect();
        device.write_at(&data, offset).unwrap();
        model[offset as usize..offset as usize + len].copy_from_slice(&data);
        if rng.below(8) == 0 {
            device.flush().unwrap();
        }
    }
}

fn assert_matches(device: &BranchDevice, model: &[u8], context: &str) {
    let mut back = vec![0u8; model.len()];
    device.read_at(&mut back, 0).unwrap();
    let first_bad = back.iter().zip(model).position(|(a, b)| a != b);
    assert!(
        first_bad.is_none(),
        "{context}: first difference at byte {first_bad:?}"
    );
}

const LEVELS: [Level; 5] = [
    Level::Raif0,
    Level::Raif1,
    Level::Raif5,
    Level::Raif6,
    Level::Raif10,
];
const DEVICE_BYTES: usize = 96 * UNIT as usize * 6;

#[test]
fn every_level_reads_back_what_was_written_staged_committed_and_reopened() {
    for level in LEVELS {
        let branches: Vec<TestBranch> = (0..width_of(level)).map(|_| TestBranch::new()).collect();
        let device = assemble(level, &branches, &[])
            .unwrap()
            .with_staging_limit(64 * 1024);
        device.set_len_bytes(DEVICE_BYTES as u64).unwrap();
        let mut model = vec![0u8; DEVICE_BYTES];
        let mut rng = Rng(0x5eed ^ level as u64);
        random_writes(&device, &mut model, &mut rng, 300);
        assert_matches(&device, &model, &format!("{level} before flush"));
        device.flush().unwrap();
        drop(device);
        let device = assemble(level, &branches, &[]).unwrap();
        assert!(device.len_bytes().unwrap() >= DEVICE_BYTES as u64);
        assert_matches(&device, &model, &format!("{level} reopened"));
    }
}

#[test]
fn a_branch_that_fails_mid_way_leaves_every_redundant_level_readable_and_writable() {
    for level in LEVELS.into_iter().filter(|&l| l != Level::Raif0) {
        let branches: Vec<TestBranch> = (0..width_of(level)).map(|_| TestBranch::new()).collect();
        let device = assemble(level, &branches, &[]).unwrap();
        device.set_len_bytes(DEVICE_BYTES as u64).unwrap();
        let mut model = vec![0u8; DEVICE_BYTES];
        let mut rng = Rng(0xfa11 ^ level as u64);
        random_writes(&device, &mut model, &mut rng, 100);
        device.flush().unwrap();
        // Every write to branch 1 fails from now on.
        branches[1].data.arm(Fault::WriteEio, 0, true);
        random_writes(&device, &mut model, &mut rng, 100);
        device.flush().unwrap();
        assert_matches(&device, &model, &format!("{level} degraded"));
        assert_eq!(device.health_of("b1"), Some(Health::Failed), "{level}");
        assert!(device.is_degraded());
        // Opened again without the failed branch.
        drop(device);
        let device = assemble(level, &branches, &[1]).unwrap();
        assert_matches(&device, &model, &format!("{level} reopened degraded"));
    }
}

#[test]
fn raif0_refuses_to_open_without_a_branch_and_raif5_without_two() {
    let branches: Vec<TestBranch> = (0..4).map(|_| TestBranch::new()).collect();
    let error = assemble(Level::Raif0, &branches, &[2]).err().unwrap();
    assert!(
        error.to_string().contains("cannot do without b2"),
        "{error}"
    );
    let error = assemble(Level::Raif5, &branches, &[0, 3]).err().unwrap();
    assert!(
        error.to_string().contains("cannot do without b0, b3"),
        "{error}"
    );
    assert!(assemble(Level::Raif6, &branches, &[0, 3]).is_ok());
}

#[test]
fn a_replacement_is_rebuilt_byte_exact_and_then_carries_the_pool_alone() {
    for level in LEVELS.into_iter().filter(|&l| l != Level::Raif0) {
        let mut branches: Vec<TestBranch> =
            (0..width_of(level)).map(|_| TestBranch::new()).collect();
        let r = branches.len() - 1;
        let label = format!("b{r}");
        let device = assemble(level, &branches, &[r]).unwrap();
        device.set_len_bytes(DEVICE_BYTES as u64).unwrap();
        let mut model = vec![0u8; DEVICE_BYTES];
        let mut rng = Rng(0xb1d ^ level as u64);
        random_writes(&device, &mut model, &mut rng, 150);
        device.flush().unwrap();
        let fresh = TestBranch::new();
        device
            .replace(&label, "memory new".into(), fresh.devices())
            .unwrap();
        assert_eq!(device.health_of(&label), Some(Health::Rebuilding));
        // Writes during the rebuild reach the replacement too.
        random_writes(&device, &mut model, &mut rng, 20);
        let mut seen = Vec::new();
        let report = device
            .rebuild(&label, &mut |done, total| seen.push((done, total)), &|| {
                false
            })
            .unwrap();
        assert_eq!(report.stripes, seen.last().unwrap().1);
        assert_eq!(device.health_of(&label), Some(Health::Healthy));
        random_writes(&device, &mut model, &mut rng, 20);
        device.flush().unwrap();
        branches[r] = fresh;
        drop(device);
        // The rebuilt branch with all but what the level needs gone.
        let others: Vec<usize> = (0..branches.len())
            .filter(|&b| b != r)
            .take(level.tolerated_losses(branches.len()))
            .collect();
        let device = assemble(level, &branches, &others).unwrap();
        assert_matches(&device, &model, &format!("{level} on the rebuilt branch"));
        let clean = device.scrub(false, &mut |_, _| {}, &|| false).unwrap();
        assert_eq!(clean.stripes_with_errors, 0, "{level}: {clean:?}");
    }
}

#[test]
fn replacing_a_branch_the_level_cannot_spare_is_refused() {
    let branches: Vec<TestBranch> = (0..4).map(|_| TestBranch::new()).collect();
    let device = assemble(Level::Raif5, &branches, &[1]).unwrap();
    let error = device
        .replace("b2", "memory".into(), TestBranch::new().devices())
        .unwrap_err();
    assert!(error.to_string().contains("cannot do without"), "{error}");
    assert_eq!(device.health_of("b2"), Some(Health::Healthy));
    let error = assemble(Level::Raif0, &branches, &[])
        .unwrap()
        .replace("b0", "memory".into(), TestBranch::new().devices())
        .unwrap_err();
    assert!(error.to_string().contains("no redundancy"), "{error}");
}

/// Flips a byte of branch `b`'s data file at `offset`.
fn corrupt(branch: &TestBranch, offset: u64) {
    let mut byte = [0u8];
    branch.data.inner().read_at(&mut byte, offset).unwrap();
    byte[0] ^= 0xff;
    branch.data.inner().write_at(&byte, offset).unwrap();
}

#[test]
fn scrub_finds_corruption_in_data_and_parity_and_repairs_it_by_checksum() {
    for level in [Level::Raif1, Level::Raif5, Level::Raif6, Level::Raif10] {
        let branches: Vec<TestBranch> = (0..width_of(level)).map(|_| TestBranch::new()).collect();
        let device = assemble(level, &branches, &[]).unwrap();
        device.set_len_bytes(DEVICE_BYTES as u64).unwrap();
        let mut model = vec![0u8; DEVICE_BYTES];
        let mut rng = Rng(0x5c4b ^ level as u64);
        random_writes(&device, &mut model, &mut rng, 200);
        device.write_at(&model, 0).unwrap();
        device.flush().unwrap();
        // Stripe 3's unit on branch 0 and stripe 10's on branch 1: data
        // or parity, whichever the rotation put there.
        corrupt(&branches[0], 3 * UNIT + 17);
        corrupt(&branches[1], 10 * UNIT + 4000);
        let found = device.scrub(false, &mut |_, _| {}, &|| false).unwrap();
        assert_eq!(found.stripes_with_errors, 2, "{level}: {found:?}");
        assert_eq!(found.bad_units.get("b0"), Some(&1), "{level}: {found:?}");
        assert_eq!(found.bad_units.get("b1"), Some(&1), "{level}: {found:?}");
        assert_eq!(found.repaired_units, 0);
        let repaired = device.scrub(true, &mut |_, _| {}, &|| false).unwrap();
        assert_eq!(repaired.repaired_units, 2, "{level}: {repaired:?}");
        let again = device.scrub(false, &mut |_, _| {}, &|| false).unwrap();
        assert_eq!(again.stripes_with_errors, 0, "{level}: {again:?}");
        assert_matches(&device, &model, &format!("{level} after repair"));
    }
}

#[test]
fn a_mirror_copy_that_matches_its_checksum_wins_over_the_one_read_first() {
    let branches: Vec<TestBranch> = (0..2).map(|_| TestBranch::new()).collect();
    let device = assemble(Level::Raif1, &branches, &[]).unwrap();
    let model = vec![0x42u8; 8 * UNIT as usize];
    device.write_at(&model, 0).unwrap();
    device.flush().unwrap();
    // The first copy (branch 0) is the one a vote-free scrub would trust.
    corrupt(&branches[0], 5 * UNIT);
    let report = device.scrub(true, &mut |_, _| {}, &|| false).unwrap();
    assert_eq!(report.bad_units.get("b0"), Some(&1), "{report:?}");
    assert_eq!(report.bad_units.get("b1"), None, "{report:?}");
    let mut byte = [0u8];
    branches[0]
        .data
        .inner()
        .read_at(&mut byte, 5 * UNIT)
        .unwrap();
    assert_eq!(byte[0], 0x42, "branch 0 repaired from branch 1");
}

#[test]
fn the_engine_runs_on_a_branch_pool_and_survives_losing_a_branch() {
    let branches: Vec<TestBranch> = (0..4).map(|_| TestBranch::new()).collect();
    let device = Arc::new(assemble(Level::Raif5, &branches, &[]).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::format(device.clone(), &PoolOptions::default(), dir.path(), None).unwrap();
    pool.create_volume("disk", 64 << 20).unwrap();
    let data: Vec<u8> = (0..(8 << 20)).map(|i: u32| (i % 251) as u8).collect();
    let volume = pool.volume("disk").unwrap();
    volume.write_at(&data, 1 << 20).unwrap();
    volume.flush().unwrap();
    pool.snapshot("disk", "disk@1").unwrap();
    volume.write_at(&[7u8; 4096], 1 << 20).unwrap();
    volume.flush().unwrap();
    drop(volume);
    pool.close().unwrap();
    drop(device);
    let device = Arc::new(assemble(Level::Raif5, &branches, &[3]).unwrap());
    let pool = Pool::open_device(device, dir.path(), None).unwrap();
    let mut back = vec![0u8; data.len()];
    pool.volume("disk@1")
        .unwrap()
        .read_at(&mut back, 1 << 20)
        .unwrap();
    assert!(
        back == data,
        "the snapshot reads back whole with branch 3 gone"
    );
    pool.volume("disk")
        .unwrap()
        .read_at(&mut back[..4096], 1 << 20)
        .unwrap();
    assert_eq!(&back[..4096], &[7u8; 4096][..]);
    let report = pool.check(false).unwrap();
    assert!(report.is_clean(), "{report:?}");
}

/// A device whose reads take `delay` longer: a slow disk.
struct Slow {
    inner: MemDevice,
    delay: std::time::Duration,
}

impl BlockDevice for Slow {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        std::thread::sleep(self.delay);
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn len_bytes(&self) -> io::Result<u64> {
        self.inner.len_bytes()
    }
    fn set_len_bytes(&self, len_bytes: u64) -> io::Result<()> {
        self.inner.set_len_bytes(len_bytes)
    }
    fn describe(&self) -> String {
        "slow memory".into()
    }
}

#[test]
fn mirrored_reads_go_mostly_to_the_faster_branch() {
    let slow = MemberDevices {
        data: Arc::new(Slow {
            inner: MemDevice::new(),
            delay: std::time::Duration::from_millis(2),
        }),
        journal: Arc::new(MemDevice::new()),
        sums: Arc::new(MemDevice::new()),
    };
    let fast = TestBranch::new();
    let specs = vec![
        MemberSpec {
            label: "b0".into(),
            place: "slow".into(),
            devices: Some(slow),
            health: Health::Healthy,
        },
        MemberSpec {
            label: "b1".into(),
            place: "fast".into(),
            devices: Some(fast.devices()),
            health: Health::Healthy,
        },
    ];
    let device = BranchDevice::assemble(Level::Raif1, UNIT, specs, None).unwrap();
    let model: Vec<u8> = (0..64 * UNIT).map(|i| (i / 7) as u8).collect();
    device.write_at(&model, 0).unwrap();
    device.flush().unwrap();
    let mut rng = Rng(3);
    let mut buf = vec![0u8; UNIT as usize];
    for _ in 0..400 {
        let unit = rng.below(64);
        device.read_at(&mut buf, unit * UNIT).unwrap();
        assert_eq!(
            buf[..],
            model[(unit * UNIT) as usize..((unit + 1) * UNIT) as usize]
        );
    }
    let balance = device.read_balance();
    let (slow_reads, fast_reads) = (balance[0].0, balance[1].0);
    assert!(
        slow_reads >= 1,
        "the slow branch is still measured: {balance:?}"
    );
    assert!(
        slow_reads * 10 < fast_reads,
        "the slow branch got {slow_reads} reads, the fast one {fast_reads}"
    );
}

#[test]
fn threads_writing_interleaved_blocks_of_shared_stripes_lose_nothing() {
    const THREADS: u64 = 4;
    const BLOCKS: u64 = 96;
    for level in [Level::Raif5, Level::Raif6, Level::Raif10] {
        let branches: Vec<TestBranch> = (0..width_of(level)).map(|_| TestBranch::new()).collect();
        let device = Arc::new(
            assemble(level, &branches, &[])
                .unwrap()
                .with_staging_limit(48 * 1024),
        );
        device.set_len_bytes(BLOCKS * UNIT).unwrap();
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let device = device.clone();
                std::thread::spawn(move || {
                    let mut rng = Rng(0x7ead + t);
                    let mut mine = vec![0u8; BLOCKS as usize];
                    for round in 0..200u32 {
                        // Thread t owns the blocks b with b % THREADS == t:
                        // neighbours in every stripe belong to the others.
                        let b = rng.below(BLOCKS / THREADS) * THREADS + t;
                        let byte = (round % 250) as u8 + 1;
                        device
                            .write_at(&vec![byte; UNIT as usize], b * UNIT)
                            .unwrap();
                        mine[b as usize] = byte;
                        if rng.below(10) == 0 {
                            device.flush().unwrap();
                        }
                        let check = rng.below(BLOCKS / THREADS) * THREADS + t;
                        let mut buf = vec![0u8; UNIT as usize];
                        device.read_at(&mut buf, check * UNIT).unwrap();
                        assert!(
                            buf.iter().all(|&x| x == mine[check as usize]),
                            "{level}: thread {t} block {check}"
                        );
                    }
                    mine
                })
            })
            .collect();
        let owned: Vec<Vec<u8>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
        device.flush().unwrap();
        drop(device);
        let device = assemble(level, &branches, &[0]).unwrap();
        for b in 0..BLOCKS {
            let mut buf = vec![0u8; UNIT as usize];
            device.read_at(&mut buf, b * UNIT).unwrap();
            let want = owned[(b % THREADS) as usize][b as usize];
            assert!(
                buf.iter().all(|&x| x == want),
                "{level}: block {b} after reopen"
            );
        }
    }
}

#[test]
fn a_clean_close_leaves_nothing_to_replay_and_a_crash_leaves_the_last_commit() {
    let branches: Vec<TestBranch> = (0..4).map(|_| TestBranch::new()).collect();
    let device = assemble(Level::Raif5, &branches, &[]).unwrap();
    device.write_at(&[9u8; 8192], 0).unwrap();
    device.flush().unwrap();
    let journal_of = |b: &TestBranch| {
        let mut header = vec![0u8; grove_raif::branch_pool::journal::HEADER_BYTES];
        b.journal.read_at(&mut header, 0).unwrap();
        grove_raif::branch_pool::journal::decode_header(&header, UNIT as usize, 3)
            .map(|(_, total)| total > grove_raif::branch_pool::journal::HEADER_BYTES)
    };
    // A crash now (the device forgotten, not dropped) finds the commit.
    assert_eq!(journal_of(&branches[0]), Ok(true));
    drop(device);
    for b in &branches {
        assert_eq!(
            journal_of(b),
            Ok(false),
            "a clean close empties every journal"
        );
    }
    let device = assemble(Level::Raif5, &branches, &[]).unwrap();
    let mut back = vec![0u8; 8192];
    device.read_at(&mut back, 0).unwrap();
    assert_eq!(back, vec![9u8; 8192]);
}

/// The journal goes to the first `tolerated + 1` healthy branches; when a
/// failure moves it (RAIF5 over four: b0 and b1, then b1 and b2) and a
/// rebuild moves it back, the branch it left (b2) must not keep its last
/// journal: a crash that tears the newest journals (on b0 and b1) would
/// otherwise replay that old one over data committed since. Regression
/// case for the emptying of every healthy branch's journal on each move.
#[test]
fn a_journal_left_behind_by_a_move_is_never_replayed_over_newer_data() {
    let stripe = 3 * UNIT as usize;
    let mut branches: Vec<TestBranch> = (0..4).map(|_| TestBranch::new()).collect();
    let device = assemble(Level::Raif5, &branches, &[]).unwrap();
    device.set_len_bytes(8 * stripe as u64).unwrap();
    let write = |device: &BranchDevice, value: u8, at: usize| {
        device.write_at(&vec![value; stripe], at as u64).unwrap();
        device.flush().unwrap();
    };
    write(&device, 1, 0);
    device.fail_branch("b0", "the test").unwrap();
    write(&device, 2, 0); // journal on b1 and b2
    branches[0] = TestBranch::new();
    device
        .replace("b0", "memory new".into(), branches[0].devices())
        .unwrap();
    device.rebuild("b0", &mut |_, _| {}, &|| false).unwrap();
    write(&device, 3, 5 * stripe); // back on b0 and b1
    write(&device, 4, 0);
    // A crash in the next commit's journal write: both copies torn.
    for b in &branches[..2] {
        let mut byte = [0u8; 1];
        b.journal.read_at(&mut byte, 8).unwrap();
        b.journal.write_at(&[byte[0] ^ 0xff], 8).unwrap();
    }
    std::mem::forget(device);
    let device = assemble(Level::Raif5, &branches, &[]).unwrap();
    let mut back = vec![0u8; stripe];
    device.read_at(&mut back, 0).unwrap();
    assert!(back.iter().all(|&b| b == 4), "stripe 0 reads {}", back[0]);
    device.read_at(&mut back, 5 * stripe as u64).unwrap();
    assert!(back.iter().all(|&b| b == 3), "stripe 5 reads {}", back[0]);
}
