//! `grove mount` and `grove serve --mount` end to end, with the real kernel:
//! FUSE, loop devices, ext4 and xfs, fsfreeze, fsck. They need root,
//! /dev/fuse and the tools (scripts/test.sh installs them); without them
//! each test prints why it skips. Every loop device and mount a test makes
//! is undone by a guard's Drop, so a failing assertion leaves none behind,
//! and every external command runs under `timeout`.

#[macro_use]
mod support;

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const GROVE: &str = env!("CARGO_BIN_EXE_grove");
/// Longest any one external command may take before `timeout` kills it.
const COMMAND_TIMEOUT_SECS: u64 = 120;
/// How long a mount may take to appear or a daemon to let the pool go.
const SETTLE_TIMEOUT_MS: u64 = 30_000;
/// Size of the volumes that carry a file system (xfs wants 300 MiB).
const FS_VOLUME_SIZE: &str = "512M";
const BLOCK_BYTES: usize = 4096;

// ---------------------------------------------------------------- helpers

/// Runs a command under `timeout`.
fn run(program: &str, args: &[&str]) -> Output {
    Command::new("timeout")
        .args(["-k", "5", &COMMAND_TIMEOUT_SECS.to_string(), program])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"))
}

fn ok(program: &str, args: &[&str]) -> String {
    let output = run(program, args);
    assert!(
        output.status.success(),
        "{program} {args:?} failed ({}): {}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn is_mounted(path: &Path) -> bool {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|line| line.split(' ').nth(4) == Some(s(&path)))
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < Duration::from_millis(SETTLE_TIMEOUT_MS),
            "timed out waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A pool in a temporary directory, with room for mount points beside it.
struct TestPool {
    dir: tempfile::TempDir,
}

impl TestPool {
    fn new() -> TestPool {
        let pool = TestPool {
            dir: tempfile::tempdir().unwrap(),
        };
        pool.ok(&["init"]);
        pool
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("pool")
    }

    /// An empty directory next to the pool.
    fn dir(&self, name: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::create_dir_all(&path).unwrap();
        path
    }

    fn grove(&self, args: &[&str]) -> Output {
        let pool = self.path();
        let mut all = vec![GROVE, "--pool", s(&pool)];
        all.extend_from_slice(args);
        run(all[0], &all[1..])
    }

    fn ok(&self, args: &[&str]) -> String {
        let pool = self.path();
        let mut all = vec!["--pool", s(&pool)];
        all.extend_from_slice(args);
        ok(GROVE, &all)
    }

    /// Waits until no process holds the pool, then checks it.
    fn wait_released_and_check(&self) {
        wait_until("the grove process lets the pool go", || {
            !self.path().join("grove.control").exists() && self.grove(&["info"]).status.success()
        });
        let report = self.ok(&["check"]);
        assert!(report.contains("clean"), "grove check: {report}");
    }
}

/// A grove mount (background `grove mount`, `grove mount --foreground` or
/// `grove serve --mount`). Drop detaches it and stops its process.
struct GroveMount {
    mountpoint: PathBuf,
    child: Option<Child>,
}

impl GroveMount {
    fn background(pool: &TestPool, mountpoint: &Path) -> GroveMount {
        let guard = GroveMount {
            mountpoint: mountpoint.to_path_buf(),
            child: None,
        };
        let out = pool.ok(&["mount", s(mountpoint)]);
        assert!(out.contains("mounted pool"), "{out}");
        assert!(
            is_mounted(mountpoint),
            "grove mount returned before mounting"
        );
        guard
    }

    fn spawn(pool: &TestPool, mountpoint: &Path, args: &[&str]) -> GroveMount {
        let child = Command::new(GROVE)
            .arg("--pool")
            .arg(pool.path())
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut guard = GroveMount {
            mountpoint: mountpoint.to_path_buf(),
            child: Some(child),
        };
        wait_until("the FUSE mount appears", || {
            if let Some(status) = guard.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("grove {args:?} exited with {status}");
            }
            is_mounted(mountpoint)
        });
        guard
    }

    fn foreground(pool: &TestPool, mountpoint: &Path) -> GroveMount {
        GroveMount::spawn(pool, mountpoint, &["mount", s(mountpoint), "--foreground"])
    }

    fn serve(pool: &TestPool, mountpoint: &Path) -> GroveMount {
        GroveMount::spawn(pool, mountpoint, &["serve", "--mount", s(mountpoint)])
    }

    fn file(&self, name: &str) -> PathBuf {
        self.mountpoint.join(name)
    }

    /// Unmounts as a user would: `umount` for the mount, SIGTERM for serve.
    fn unmount(mut self, pool: &TestPool) {
        let serve = self.is_serve();
        match self.child.take() {
            Some(mut child) if serve => {
                ok("kill", &["-TERM", &child.id().to_string()]);
                let status = child.wait().unwrap();
                assert!(status.success(), "grove serve exited with {status}");
            }
            child => {
                ok("umount", &[s(&self.mountpoint)]);
                if let Some(mut child) = child {
                    let status = child.wait().unwrap();
                    assert!(status.success(), "grove mount exited with {status}");
                }
            }
        }
        assert!(!is_mounted(&self.mountpoint));
        pool.wait_released_and_check();
    }

    /// Whether the process is `grove serve`, which outlives its mount.
    fn is_serve(&self) -> bool {
        self.child.as_ref().is_some_and(|child| {
            std::fs::read_to_string(format!("/proc/{}/cmdline", child.id()))
                .is_ok_and(|cmdline| cmdline.split('\0').any(|arg| arg == "serve"))
        })
    }
}

impl Drop for GroveMount {
    fn drop(&mut self) {
        if is_mounted(&self.mountpoint) {
            let _ = run("umount", &["-l", s(&self.mountpoint)]);
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A loop device on a file. Drop detaches it.
struct Loop {
    device: String,
}

impl Loop {
    fn attach(file: &Path, read_only: bool) -> Loop {
        let mut args = vec!["--find", "--show", "--direct-io=on"];
        if read_only {
            args.push("--read-only");
        }
        args.push(s(file));
        let device = ok("losetup", &args).trim().to_string();
        assert!(
            device.starts_with("/dev/loop"),
            "losetup printed {device:?}"
        );
        Loop { device }
    }

    fn direct_io(&self) -> bool {
        let name = self.device.trim_start_matches("/dev/");
        std::fs::read_to_string(format!("/sys/block/{name}/loop/dio"))
            .is_ok_and(|text| text.trim() == "1")
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = run("losetup", &["-d", &self.device]);
    }
}

/// A kernel file system mounted from a loop device. Drop unmounts it.
struct FsMount {
    dir: PathBuf,
}

impl FsMount {
    fn mount(device: &Loop, dir: PathBuf, options: &str) -> FsMount {
        let mut args = vec![];
        if !options.is_empty() {
            args.extend(["-o", options]);
        }
        args.extend([device.device.as_str(), s(&dir)]);
        ok("mount", &args);
        FsMount { dir }
    }
}

impl Drop for FsMount {
    fn drop(&mut self) {
        if is_mounted(&self.dir) && !run("umount", &[s(&self.dir)]).status.success() {
            let _ = run("umount", &["-l", s(&self.dir)]);
        }
    }
}

/// A frozen file system. Drop thaws it, so a failure never leaves a
/// frozen mount that would hang its unmount.
struct Frozen<'a>(&'a Path);

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        let _ = run("fsfreeze", &["-u", s(self.0)]);
    }
}

// ------------------------------------------------------ file system trees

/// Deterministic bytes: xorshift64 from a seed.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

type Tree = BTreeMap<String, Vec<u8>>;

/// Writes `count` files under `root/tag/...` with sizes from empty to
/// 2 MiB, and returns them.
fn write_tree(root: &Path, tag: &str, count: usize) -> Tree {
    let mut tree = Tree::new();
    for i in 0..count {
        let relative = format!("{tag}/d{}/s{}/f{i}", i % 3, i % 2);
        let len = match i % 5 {
            0 => 0,
            1 => 1 + i * 37,
            2 => 4096 * (i + 1),
            3 => 100_000 + i,
            _ => 2 << 20,
        };
        let data = pattern(
            i as u64 + tag.len() as u64 * 1000 + tag.as_bytes()[0] as u64,
            len,
        );
        let path = root.join(&relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &data).unwrap();
        tree.insert(relative, data);
    }
    tree
}

/// Every regular file under `root` (lost+found left out).
fn read_tree(root: &Path) -> Tree {
    fn walk(root: &Path, dir: &Path, tree: &mut Tree) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            if entry.file_name() == "lost+found" {
                continue;
            }
            if entry.file_type().unwrap().is_dir() {
                walk(root, &path, tree);
            } else {
                let relative = path.strip_prefix(root).unwrap().to_str().unwrap();
                tree.insert(relative.to_string(), std::fs::read(&path).unwrap());
            }
        }
    }
    let mut tree = Tree::new();
    walk(root, root, &mut tree);
    tree
}

fn assert_tree(root: &Path, expected: &Tree, what: &str) {
    let found = read_tree(root);
    let names = |tree: &Tree| tree.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(&found), names(expected), "{what}: file names differ");
    for (name, data) in expected {
        assert!(found[name] == *data, "{what}: {name} has other contents");
    }
}

// ------------------------------------------------ ext4 and xfs end to end

#[derive(Clone, Copy)]
enum Fs {
    Ext4,
    Xfs,
}

impl Fs {
    fn mkfs(self, device: &Loop) {
        match self {
            Fs::Ext4 => ok("mkfs.ext4", &["-q", "-F", &device.device]),
            Fs::Xfs => ok("mkfs.xfs", &["-q", "-f", &device.device]),
        };
    }

    /// Checks the file system on volume `name` read-only; it must find
    /// nothing to fix. ext4 is checked on the volume itself. A frozen xfs
    /// leaves its log covered but not unmounted, so `xfs_repair -n` first
    /// wants the log replayed: that is done by mounting a throwaway clone
    /// of the volume, which is then checked.
    fn check_volume(self, pool: &TestPool, grove: &GroveMount, name: &str) {
        let output = match self {
            Fs::Ext4 => {
                let device = Loop::attach(&grove.file(name), true);
                run("fsck.ext4", &["-fn", &device.device])
            }
            Fs::Xfs => {
                let scratch = format!("{name}-fsck");
                pool.ok(&["clone", name, &scratch]);
                let device = Loop::attach(&grove.file(&scratch), false);
                drop(FsMount::mount(&device, pool.dir(&scratch), "nouuid"));
                let output = run("xfs_repair", &["-n", &device.device]);
                drop(device);
                pool.ok(&["rm", &scratch]);
                output
            }
        };
        assert!(
            output.status.success(),
            "file system check of {name} failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Mount options: copies of one xfs share its UUID, and a read-only
    /// device cannot replay a journal.
    fn options(self, read_only: bool) -> &'static str {
        match (self, read_only) {
            (Fs::Ext4, false) => "",
            (Fs::Ext4, true) => "ro,noload",
            (Fs::Xfs, false) => "nouuid",
            (Fs::Xfs, true) => "ro,nouuid,norecovery",
        }
    }
}

fn mount_grove(pool: &TestPool, mountpoint: &Path, via_serve: bool) -> GroveMount {
    if via_serve {
        GroveMount::serve(pool, mountpoint)
    } else {
        GroveMount::background(pool, mountpoint)
    }
}

/// A file system on a volume file: snapshot and clone taken while it is
/// frozen, checked clean, the snapshot frozen in time and the clone on its
/// own; then everything again after an unmount and a reopen.
fn file_system_on_volume_files(fs: Fs, via_serve: bool) {
    let pool = TestPool::new();
    pool.ok(&["create", "disk", "--size", FS_VOLUME_SIZE]);
    let mountpoint = pool.dir("mnt");
    let grove = mount_grove(&pool, &mountpoint, via_serve);

    let live_loop = Loop::attach(&grove.file("disk"), false);
    assert!(live_loop.direct_io(), "loop device did not get direct I/O");
    fs.mkfs(&live_loop);
    let live = FsMount::mount(&live_loop, pool.dir("live"), fs.options(false));
    let frozen_tree = write_tree(&live.dir, "before", 24);
    ok("sync", &[]);

    ok("fsfreeze", &["-f", s(&live.dir)]);
    let frozen = Frozen(&live.dir);
    pool.ok(&["snapshot", "disk", "disk@frozen"]);
    pool.ok(&["clone", "disk", "disk-clone"]);
    drop(frozen);

    let mut live_tree = frozen_tree.clone();
    live_tree.extend(write_tree(&live.dir, "after", 8));
    ok("sync", &[]);

    // The snapshot file is read-only, the clone a writable file.
    let snapshot_file = grove.file("disk@frozen");
    let mode = std::fs::metadata(&snapshot_file).unwrap().permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o444
    );
    let snapshot_loop = Loop::attach(&snapshot_file, true);
    let clone_loop = Loop::attach(&grove.file("disk-clone"), false);
    fs.check_volume(&pool, &grove, "disk@frozen");
    fs.check_volume(&pool, &grove, "disk-clone");

    let snapshot = FsMount::mount(&snapshot_loop, pool.dir("snapshot"), fs.options(true));
    assert_tree(&snapshot.dir, &frozen_tree, "snapshot");
    let clone = FsMount::mount(&clone_loop, pool.dir("clone"), fs.options(false));
    assert_tree(&clone.dir, &frozen_tree, "clone");
    let mut clone_tree = frozen_tree.clone();
    clone_tree.extend(write_tree(&clone.dir, "clone-only", 6));
    ok("sync", &[]);
    assert_tree(&clone.dir, &clone_tree, "clone after its own writes");
    assert_tree(&live.dir, &live_tree, "live file system");
    assert_tree(
        &snapshot.dir,
        &frozen_tree,
        "snapshot after writes elsewhere",
    );

    drop((clone, snapshot, live));
    drop((clone_loop, snapshot_loop, live_loop));
    grove.unmount(&pool);

    // Reopened: the same three trees, each file system clean.
    let grove = mount_grove(&pool, &mountpoint, via_serve);
    let expected = [
        ("disk", &live_tree),
        ("disk@frozen", &frozen_tree),
        ("disk-clone", &clone_tree),
    ];
    for (name, tree) in expected {
        fs.check_volume(&pool, &grove, name);
        let device = Loop::attach(&grove.file(name), true);
        let mounted = FsMount::mount(
            &device,
            pool.dir(&format!("again-{name}")),
            fs.options(true),
        );
        assert_tree(&mounted.dir, tree, &format!("{name} after reopening"));
    }
    grove.unmount(&pool);
}

#[test]
fn ext4_on_volume_files_through_grove_mount() {
    require_fuse!("losetup", "mkfs.ext4", "fsck.ext4", "fsfreeze", "timeout");
    file_system_on_volume_files(Fs::Ext4, false);
}

#[test]
fn xfs_on_volume_files_through_grove_serve_mount() {
    require_fuse!("losetup", "mkfs.xfs", "xfs_repair", "fsfreeze", "timeout");
    file_system_on_volume_files(Fs::Xfs, true);
}

// ------------------------------------------------ the files follow the pool

#[test]
fn volume_files_follow_the_pool() {
    require_fuse!("timeout", "fallocate");
    let pool = TestPool::new();
    pool.ok(&["create", "disk", "--size", "8M"]);
    let mountpoint = pool.dir("mnt");
    let grove = GroveMount::foreground(&pool, &mountpoint);
    let names = || {
        let mut names: Vec<String> = std::fs::read_dir(&mountpoint)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    assert_eq!(names(), ["disk"]);
    assert_eq!(
        std::fs::metadata(grove.file("disk")).unwrap().len(),
        8 << 20
    );

    // Data written through the file, at the offsets SEEK_DATA finds.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(grove.file("disk"))
        .unwrap();
    file.write_all_at(&pattern(1, 1 << 20), 2 << 20).unwrap();
    file.sync_all().unwrap();
    use rustix::fs::{seek, SeekFrom};
    assert_eq!(seek(&file, SeekFrom::Data(0)).unwrap(), 2 << 20);
    assert_eq!(seek(&file, SeekFrom::Hole(2 << 20)).unwrap(), 3 << 20);
    assert_eq!(seek(&file, SeekFrom::Hole(7 << 20)).unwrap(), 7 << 20);

    // Made, resized and removed through the control socket: seen at once.
    pool.ok(&["snapshot", "disk", "disk@1"]);
    pool.ok(&["create", "other", "--size", "1M"]);
    assert_eq!(names(), ["disk", "disk@1", "other"]);
    pool.ok(&["resize", "other", "3M"]);
    assert_eq!(
        std::fs::metadata(grove.file("other")).unwrap().len(),
        3 << 20
    );
    pool.ok(&["rm", "other"]);
    assert_eq!(names(), ["disk", "disk@1"]);

    // A snapshot is 0444 and refuses writers, even root.
    let metadata = std::fs::metadata(grove.file("disk@1")).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&metadata.permissions()) & 0o777,
        0o444
    );
    let refused = std::fs::OpenOptions::new()
        .write(true)
        .open(grove.file("disk@1"))
        .unwrap_err();
    assert!(
        matches!(refused.raw_os_error(), Some(libc_erofs) if libc_erofs == rustix::io::Errno::ROFS.raw_os_error()
            || libc_erofs == rustix::io::Errno::ACCESS.raw_os_error()),
        "writing a snapshot: {refused}"
    );
    // No truncation, no new files: volumes change only through grove.
    assert!(std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(grove.file("disk"))
        .is_err());
    assert!(std::fs::File::create(mountpoint.join("new")).is_err());

    // Punching a hole unmaps: the snapshot keeps the data, disk reads zeros.
    ok(
        "fallocate",
        &[
            "--punch-hole",
            "--offset",
            "2M",
            "--length",
            "1M",
            s(&grove.file("disk")),
        ],
    );
    let mut buf = vec![1u8; 4096];
    file.read_exact_at(&mut buf, 2 << 20).unwrap();
    assert!(buf.iter().all(|b| *b == 0));
    assert!(matches!(seek(&file, SeekFrom::Data(0)), Err(e) if e == rustix::io::Errno::NXIO));
    let snapshot = std::fs::read(grove.file("disk@1")).unwrap();
    assert!(snapshot[2 << 20..3 << 20] == pattern(1, 1 << 20)[..]);
    let list = pool.ok(&["list", "--json"]);
    assert!(list.contains(r#""name":"disk","kind":"volume""#), "{list}");

    // Direct I/O through the file works.
    ok(
        "dd",
        &[
            "if=/dev/zero",
            &format!("of={}", s(&grove.file("disk"))),
            "bs=64K",
            "count=4",
            "oflag=direct",
            "conv=notrunc",
        ],
    );
    drop(file);

    // A stream received into the mounted pool (through its control
    // socket) shows as a file holding what was sent; the mounted pool can
    // send too.
    let source = TestPool::new();
    source.ok(&["create", "vm", "--size", "4M"]);
    let data_path = source.dir("files").join("data");
    std::fs::write(&data_path, pattern(9, 1 << 20)).unwrap();
    source.ok(&["write", "vm", "--offset", "1M", s(&data_path)]);
    source.ok(&["snapshot", "vm", "vm@1"]);
    let stream = source.dir("files").join("vm.stream");
    source.ok(&["send", "vm@1", "-o", s(&stream)]);
    pool.ok(&["receive", "vm@1", s(&stream)]);
    assert!(names().contains(&"vm@1".to_string()));
    let received = std::fs::read(grove.file("vm@1")).unwrap();
    assert!(received[1 << 20..2 << 20] == pattern(9, 1 << 20)[..]);
    assert!(received[..1 << 20].iter().all(|b| *b == 0));
    let back = pool.dir("files").join("back.stream");
    pool.ok(&["send", "disk@1", "-o", s(&back)]);
    source.ok(&["receive", "disk@1", s(&back)]);
    assert_eq!(
        source.ok(&["hash", "disk@1"]).split_whitespace().next(),
        pool.ok(&["hash", "disk@1"]).split_whitespace().next()
    );
    grove.unmount(&pool);
}

// ------------------------------------------------------------ concurrency

/// Set for the writer processes the concurrency test starts: "FILE TAG ROUNDS BLOCKS".
const WRITER_ENV: &str = "GROVE_MOUNT_TEST_WRITER";
/// Marks a block written by the concurrency test, before its tag, round
/// and index.
const BLOCK_MAGIC: &[u8; 8] = b"grovetst";

fn model_block(tag: u8, round: u32, index: u32) -> Vec<u8> {
    let mut block = pattern(
        (u64::from(tag) << 48) | (u64::from(round) << 24) | u64::from(index),
        BLOCK_BYTES,
    );
    block[..8].copy_from_slice(BLOCK_MAGIC);
    block[8] = tag;
    block[9..13].copy_from_slice(&round.to_le_bytes());
    block[13..17].copy_from_slice(&index.to_le_bytes());
    block
}

/// The round that wrote this block (0: never written). Anything that is
/// not exactly some round's block for this tag and index is corruption.
fn decode_block(block: &[u8], tag: u8, index: u32, what: &str) -> u32 {
    if block.iter().all(|b| *b == 0) {
        return 0;
    }
    let round = u32::from_le_bytes(block[9..13].try_into().unwrap());
    assert!(
        block == model_block(tag, round, index),
        "{what}: block {index} is not one the writer wrote"
    );
    round
}

/// Not a test of its own: the body of a writer process, started by
/// `two_writers_and_snapshots_through_the_control_socket`.
#[test]
fn concurrency_writer_process() {
    let Ok(spec) = std::env::var(WRITER_ENV) else {
        return;
    };
    let parts: Vec<&str> = spec.split(' ').collect();
    let (path, tag) = (parts[0], parts[1].as_bytes()[0]);
    let rounds: u32 = parts[2].parse().unwrap();
    let blocks: u32 = parts[3].parse().unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    for round in 1..=rounds {
        for index in 0..blocks {
            file.write_all_at(
                &model_block(tag, round, index),
                u64::from(index) * BLOCK_BYTES as u64,
            )
            .unwrap();
        }
    }
    file.sync_all().unwrap();
}

/// A snapshot holds every write acknowledged before it began: since each
/// writer writes one block at a time in order, a snapshot is the state
/// after some prefix of its writer's sequence.
fn assert_prefix_state(data: &[u8], tag: u8, blocks: u32, what: &str) -> u32 {
    let rounds: Vec<u32> = (0..blocks)
        .map(|i| {
            let start = i as usize * BLOCK_BYTES;
            decode_block(&data[start..start + BLOCK_BYTES], tag, i, what)
        })
        .collect();
    // The last write included is the highest (round, index) found.
    let Some((last_index, last_round)) = rounds
        .iter()
        .enumerate()
        .filter(|(_, r)| **r > 0)
        .max_by_key(|(i, r)| (**r, *i))
        .map(|(i, r)| (i, *r))
    else {
        return 0;
    };
    for (index, round) in rounds.iter().enumerate() {
        let expected = if index <= last_index {
            last_round
        } else {
            last_round - 1
        };
        assert_eq!(
            *round, expected,
            "{what}: block {index} is from round {round}, not {expected}: not a prefix of the writes"
        );
    }
    last_round
}

#[test]
fn two_writers_and_snapshots_through_the_control_socket() {
    require_fuse!("timeout");
    const BLOCKS: u32 = 256;
    const ROUNDS: u32 = 12;
    const SNAPSHOTS_MAX: usize = 40;
    let pool = TestPool::new();
    let size = format!("{}K", BLOCKS as usize * BLOCK_BYTES / 1024);
    for name in ["a", "b"] {
        pool.ok(&["create", name, "--size", &size]);
    }
    let mountpoint = pool.dir("mnt");
    let grove = GroveMount::foreground(&pool, &mountpoint);

    let start_writer = |name: &str| {
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "concurrency_writer_process", "--nocapture"])
            .env(
                WRITER_ENV,
                format!("{} {name} {ROUNDS} {BLOCKS}", s(&grove.file(name))),
            )
            .stdout(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut writers = [start_writer("a"), start_writer("b")];
    let mut snapshots = Vec::new();
    let started = Instant::now();
    loop {
        let running = writers
            .iter_mut()
            .map(|w| w.try_wait().unwrap().is_none())
            .filter(|running| *running)
            .count();
        if running == 0 || snapshots.len() >= SNAPSHOTS_MAX {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(COMMAND_TIMEOUT_SECS));
        let source = ["a", "b"][snapshots.len() % 2];
        let name = format!("{source}@{}", snapshots.len());
        pool.ok(&["snapshot", source, &name]);
        snapshots.push((source, name));
    }
    for writer in &mut writers {
        let status = writer.wait().unwrap();
        assert!(status.success(), "a writer failed: {status}");
    }
    assert!(!snapshots.is_empty());
    for (source, name) in &snapshots {
        let data = std::fs::read(grove.file(name)).unwrap();
        assert_prefix_state(&data, source.as_bytes()[0], BLOCKS, name);
    }
    for name in ["a", "b"] {
        let data = std::fs::read(grove.file(name)).unwrap();
        let last = assert_prefix_state(&data, name.as_bytes()[0], BLOCKS, name);
        assert_eq!(last, ROUNDS, "{name} does not hold every round");
    }
    grove.unmount(&pool);

    // Reopened: the same contents, read with grove itself.
    for (source, name) in snapshots
        .iter()
        .chain(&[("a", "a".into()), ("b", "b".into())])
    {
        let output = pool.grove(&["read", name]);
        assert!(output.status.success());
        assert_prefix_state(&output.stdout, source.as_bytes()[0], BLOCKS, name);
    }
}

// ----------------------------------------------------------------- errors

/// A grove command that must fail with exit code 1 and one line naming
/// why; returns that line.
fn one_line_error(output: Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(1), "stderr: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "not one line: {stderr}");
    assert!(stderr.starts_with("grove: error: "), "{stderr}");
    stderr
}

#[test]
fn mount_errors_are_one_line() {
    require_fuse!("timeout", "unshare", "setpriv");
    let pool = TestPool::new();
    pool.ok(&["create", "disk", "--size", "1M"]);

    let missing = pool.dir("x").join("missing");
    let error = one_line_error(pool.grove(&["mount", s(&missing)]));
    assert!(error.contains("does not exist"), "{error}");

    let full = pool.dir("full");
    std::fs::write(full.join("file"), b"x").unwrap();
    let error = one_line_error(pool.grove(&["mount", s(&full)]));
    assert!(error.contains("is not empty"), "{error}");

    // No /dev/fuse: a private /dev without it.
    let mountpoint = pool.dir("mnt");
    let output = run(
        "unshare",
        &[
            "--mount",
            "sh",
            "-c",
            "mount -t tmpfs tmpfs /dev && exec \"$@\"",
            "sh",
            GROVE,
            "--pool",
            s(&pool.path()),
            "mount",
            s(&mountpoint),
        ],
    );
    let error = one_line_error(output);
    assert!(error.contains("/dev/fuse is missing"), "{error}");

    // No permission: an unprivileged user (nobody).
    std::fs::set_permissions(
        pool.dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let output = run(
        "setpriv",
        &[
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            GROVE,
            "--pool",
            s(&pool.path()),
            "mount",
            s(&mountpoint),
        ],
    );
    let error = one_line_error(output);
    assert!(error.contains("no permission to mount"), "{error}");
    assert!(!is_mounted(&mountpoint));

    // Held by a mount: a second mount and a server name the holder.
    let grove = GroveMount::background(&pool, &mountpoint);
    let error = one_line_error(pool.grove(&["mount", s(&pool.dir("mnt2"))]));
    assert!(
        error.contains("already held by `grove")
            && error.contains("mount")
            && error.contains("pid"),
        "{error}"
    );
    let error = one_line_error(pool.grove(&["serve", "--socket", s(&pool.dir("x").join("sock"))]));
    assert!(error.contains("already held by `grove"), "{error}");

    // A volume removed under an open file: EIO on I/O, ENOENT on lookup,
    // and the mount goes on.
    pool.ok(&["create", "gone", "--size", "1M"]);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(grove.file("gone"))
        .unwrap();
    file.write_all_at(b"data", 0).unwrap();
    // An open file claims its volume: removing it needs --force.
    support::assert_refused_in_use(pool.grove(&["rm", "gone"]));
    pool.ok(&["rm", "--force", "gone"]);
    let mut buf = [0u8; 4];
    let error = file.read_exact_at(&mut buf, 0).unwrap_err();
    assert_eq!(
        error.raw_os_error(),
        Some(rustix::io::Errno::IO.raw_os_error())
    );
    let error = file.write_all_at(b"more", 0).unwrap_err();
    assert_eq!(
        error.raw_os_error(),
        Some(rustix::io::Errno::IO.raw_os_error())
    );
    let error = std::fs::metadata(grove.file("gone")).unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::NotFound);
    drop(file);
    assert_eq!(std::fs::read(grove.file("disk")).unwrap().len(), 1 << 20);
    grove.unmount(&pool);
}

/// `grove export` onto a block device (a loop device over a file filled
/// with junk): the device is what the user named, so no --force is asked,
/// and every byte is written, zeros included (a sparse export would leave
/// the junk in the holes). A device smaller than the volume is refused in
/// one line and left as it was.
#[test]
fn export_onto_a_block_device_writes_every_byte() {
    require_fuse!("losetup", "timeout");
    let pool = TestPool::new();
    pool.ok(&["create", "v", "--size", "4M"]);
    let data = pattern(11, 64 * 1024);
    let source = pool.dir("files").join("data");
    std::fs::write(&source, &data).unwrap();
    pool.ok(&["write", "v", "--offset", "1M", s(&source)]);
    let mut expected = vec![0u8; 4 << 20];
    expected[1 << 20..(1 << 20) + data.len()].copy_from_slice(&data);

    let backing = pool.dir("files").join("disk.img");
    std::fs::write(&backing, vec![0xeeu8; 4 << 20]).unwrap();
    let disk = Loop::attach(&backing, false);
    let message = pool.ok(&["export", "v", &disk.device]);
    assert!(message.contains("exported \"v\""), "{message}");
    drop(disk);
    assert!(
        std::fs::read(&backing).unwrap() == expected,
        "the device does not hold the volume"
    );

    let small = pool.dir("files").join("small.img");
    std::fs::write(&small, vec![0xeeu8; 1 << 20]).unwrap();
    let disk = Loop::attach(&small, false);
    let line = one_line_error(pool.grove(&["export", "v", &disk.device]));
    assert!(line.contains(&disk.device), "{line}");
    drop(disk);
    assert!(
        std::fs::read(&small).unwrap().iter().all(|&b| b == 0xee),
        "a refused export wrote"
    );
}

/// Maps `len` bytes of `file` shared and read-write. (Mapping a file is
/// unsafe in Rust whatever the crate; this test exists to map one.)
#[allow(unsafe_code)]
fn map_shared(file: &std::fs::File, len: usize) -> rustix::io::Result<*mut u8> {
    use rustix::mm::{mmap, MapFlags, ProtFlags};
    // SAFETY: a fresh mapping of a file the caller keeps open; nothing
    // else in the process refers to that address range.
    let ptr = unsafe {
        mmap(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            file,
            0,
        )
    }?;
    Ok(ptr.cast())
}

/// Programs that map their disk images need shared mappings of volume
/// files: they failed with ENODEV (direct I/O). Bytes written through the
/// mapping and msync'ed are durable: after a kill -9 of the mount (the
/// mapping still there), another mount reads them.
#[test]
#[allow(unsafe_code)] // writes through the mapping: the point of the test
fn a_volume_file_maps_shared_and_msync_makes_writes_durable() {
    require_fuse!("timeout");
    const MAP_BYTES: usize = 1 << 20;
    let pool = TestPool::new();
    pool.ok(&["create", "disk", "--size", "4M"]);
    let mountpoint = pool.dir("mnt");
    let grove = GroveMount::foreground(&pool, &mountpoint);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(grove.file("disk"))
        .unwrap();
    let ptr = map_shared(&file, MAP_BYTES).expect("a shared mapping of a volume file");
    let data = pattern(7, MAP_BYTES);
    // SAFETY: the mapping is MAP_BYTES long, writable, and only used here.
    unsafe {
        std::ptr::copy_nonoverlapping(data.as_ptr(), ptr, MAP_BYTES);
        rustix::mm::msync(ptr.cast(), MAP_BYTES, rustix::mm::MsyncFlags::SYNC).unwrap();
    }
    // Durable on msync, not on a clean unmount: the mount is killed while
    // the mapping is still there, so nothing but the msync wrote it back.
    let mut grove = grove;
    let mut child = grove.child.take().expect("a foreground mount");
    child.kill().unwrap();
    child.wait().unwrap();
    // SAFETY: the mapping from above, not used after this.
    unsafe { rustix::mm::munmap(ptr.cast(), MAP_BYTES).unwrap() };
    drop(file);
    drop(grove);
    wait_until("the killed mount is gone", || !is_mounted(&mountpoint));
    let grove = GroveMount::foreground(&pool, &mountpoint);
    let mut back = vec![0u8; MAP_BYTES];
    std::fs::File::open(grove.file("disk"))
        .unwrap()
        .read_exact_at(&mut back, 0)
        .unwrap();
    assert!(back == data, "the mapped writes are in the volume");
    grove.unmount(&pool);
}
