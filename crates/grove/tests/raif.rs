//! `grove raif` end to end with the real kernel: POSIX behaviour in the
//! style of pjdfstest, a random-operation checker against an in-memory
//! oracle (fsx's idea) over a RAIF5 mount, a branch removed mid-run for
//! RAIF1, 5, 6 and 10, rebuild, scrub, kill -9 of the mount (anywhere, and
//! in the write hole), status and explain, and one-line errors. They need
//! root and /dev/fuse; without them each test prints why it skips (and
//! fails under GROVE_REQUIRE_TOOLS=1). Every mount is undone by a guard's
//! Drop, so a failing assertion leaves none behind.

#[macro_use]
mod support;

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const GROVE: &str = env!("CARGO_BIN_EXE_grove");
/// How long a mount may take to appear or go away.
const SETTLE_TIMEOUT_MS: u64 = 20_000;
/// Operations of the random checker.
const FSX_OPERATIONS: usize = 1500;
/// Largest file the random checker makes.
const FSX_FILE_MAX_BYTES: u64 = 300_000;
/// Whole-file reads through the mount in the slow-branch test.
const SLOW_BRANCH_PASSES: usize = 30;
/// Mount processes killed by the crash test, each at another moment.
const CRASH_ITERATIONS: u64 = 3;
/// Bytes each writer step appends and fsyncs (not a multiple of the
/// stripe, so that steps share stripes and parity is read-modify-written).
const CRASH_CHUNK_BYTES: usize = 6000;
/// Steps the writer takes at most.
const CRASH_CHUNKS: usize = 400;
/// Files the rebuild-status test rebuilds, each of several stripes.
const REBUILD_STATUS_FILES: usize = 32;
const REBUILD_STATUS_FILE_BYTES: usize = 64 * 1024;
/// The delay of each read on the surviving branches in that test: it
/// makes the rebuild last a few seconds while status is polled.
const REBUILD_READ_DELAY_MS: u64 = 5;

fn grove(args: &[&str]) -> Output {
    grove_with_env(args, &[])
}

fn grove_with_env(args: &[&str], env: &[(String, String)]) -> Output {
    Command::new("timeout")
        .args(["-k", "5", "60", GROVE])
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap()
}

fn is_mounted(path: &Path) -> bool {
    let path = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|line| line.split(' ').nth(4) == path.to_str())
}

/// Branch directories and a RAIF mount over them; unmounted on Drop.
struct Raif {
    dir: tempfile::TempDir,
    branches: Vec<PathBuf>,
    mnt: PathBuf,
    level: String,
    unit: String,
    /// Environment of the mount process (test hooks).
    env: Vec<(String, String)>,
    /// A config file to mount with instead of --level.
    config: Option<PathBuf>,
    /// More flags for `grove raif mount` (--degraded).
    flags: Vec<String>,
    /// The background mount process: an unmount waits for its exit, since
    /// a process still ending could take a new mount on the same path down.
    pid: std::cell::Cell<u32>,
}

impl Raif {
    fn new(level: &str, width: usize, unit: &str) -> Raif {
        Raif::with_env(level, width, unit, &[])
    }

    fn with_env(level: &str, width: usize, unit: &str, env: &[(&str, &str)]) -> Raif {
        let dir = tempfile::tempdir().unwrap();
        let branches: Vec<PathBuf> = (0..width)
            .map(|i| dir.path().join(format!("b{i}")))
            .collect();
        branches.iter().for_each(|b| fs::create_dir(b).unwrap());
        let mnt = dir.path().join("mnt");
        fs::create_dir(&mnt).unwrap();
        let raif = Raif {
            dir,
            branches,
            mnt,
            level: level.into(),
            unit: unit.into(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            config: None,
            flags: Vec::new(),
            pid: std::cell::Cell::new(0),
        };
        raif.mount();
        raif
    }

    /// Mounts (again) over the current branch directories; the pid of the
    /// background mount process.
    fn mount(&self) -> u32 {
        let out = self.mount_output();
        assert!(
            out.status.success(),
            "mount: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(is_mounted(&self.mnt));
        let stdout = String::from_utf8_lossy(&out.stdout);
        // The way out names this mount point, not a placeholder.
        let unmount = format!("unmount with `fusermount3 -u {}`", self.mnt.display());
        assert!(stdout.contains(&unmount), "{stdout}");
        let pid = stdout.split("pid ").nth(1).and_then(|rest| {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        });
        let pid = pid.unwrap_or_else(|| panic!("no pid in {stdout:?}"));
        self.pid.set(pid);
        pid
    }

    /// What `grove raif mount` over the current branch directories says.
    fn mount_output(&self) -> Output {
        let mut args = vec![
            "raif",
            "mount",
            "--level",
            &self.level,
            "--stripe-unit",
            &self.unit,
        ];
        args.extend(self.branches.iter().map(|b| b.to_str().unwrap()));
        args.push(self.mnt.to_str().unwrap());
        if let Some(config) = &self.config {
            args = vec![
                "raif",
                "mount",
                "--config",
                config.to_str().unwrap(),
                self.mnt.to_str().unwrap(),
            ];
        }
        let log = self.log_path();
        args.extend(["--log", log.to_str().unwrap()]);
        args.extend(self.flags.iter().map(String::as_str));
        grove_with_env(&args, &self.env)
    }

    /// `grove raif SUBCOMMAND ARGS... MOUNTPOINT`.
    fn run(&self, args: &[&str]) -> Output {
        let mut all = vec!["raif"];
        all.extend(args);
        all.push(self.mnt.to_str().unwrap());
        grove(&all)
    }

    /// What `explain` says about a file.
    fn explain(&self, rel: &str) -> serde_json::Value {
        let out = grove(&["raif", "explain", "--json", self.p(rel).to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// What `explain` says once `done` holds (or after the settle timeout).
    fn explain_when(
        &self,
        rel: &str,
        done: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let started = Instant::now();
        loop {
            let v = self.explain(rel);
            if done(&v) || started.elapsed() > Duration::from_millis(SETTLE_TIMEOUT_MS) {
                return v;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The directory of the branch labelled `label` (b0, b1, ...).
    fn branch(&self, label: &serde_json::Value) -> &Path {
        let index: usize = label.as_str().unwrap()[1..].parse().unwrap();
        &self.branches[index]
    }

    /// Every mount of this test appends its log here (printed on failure).
    fn log_path(&self) -> PathBuf {
        self.dir.path().join("mount.log")
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    fn status(&self) -> serde_json::Value {
        let out = grove(&["raif", "status", "--json", self.mnt.to_str().unwrap()]);
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn unmount(&self) {
        if is_mounted(&self.mnt) {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg(&self.mnt)
                .status();
            let started = Instant::now();
            while is_mounted(&self.mnt)
                && started.elapsed() < Duration::from_millis(SETTLE_TIMEOUT_MS)
            {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let started = Instant::now();
        let process = PathBuf::from(format!("/proc/{}", self.pid.get()));
        while self.pid.get() != 0
            && process.exists()
            && started.elapsed() < Duration::from_millis(SETTLE_TIMEOUT_MS)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Raif {
    fn drop(&mut self) {
        self.unmount();
        if std::thread::panicking() {
            let log = fs::read_to_string(self.log_path()).unwrap_or_default();
            eprintln!("--- log of the RAIF mount ---\n{log}--- end of the log ---");
        }
        if is_mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
        let _ = self.dir.path();
    }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// `count` pseudo-random words from `pattern`'s bytes for `seed`.
fn random_words(count: usize, seed: u64) -> std::vec::IntoIter<u64> {
    pattern(count * 8, seed)
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect::<Vec<_>>()
        .into_iter()
}

/// Opens `path` for writing (and reading, if `read`), creating it if it
/// is missing and keeping what it holds.
fn open_or_create(path: &Path, read: bool) -> std::fs::File {
    OpenOptions::new()
        .read(read)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap()
}

#[test]
fn posix_operations_behave() {
    require_fuse!();
    let r = Raif::new("raif5", 4, "4K");
    // create, write at offsets, read back, stat size
    fs::write(r.p("a"), b"hello").unwrap();
    let f = OpenOptions::new().write(true).open(r.p("a")).unwrap();
    f.write_all_at(b"XY", 100_000).unwrap();
    drop(f);
    let data = fs::read(r.p("a")).unwrap();
    assert_eq!(data.len(), 100_002);
    assert_eq!(&data[..5], b"hello");
    assert!(
        data[5..100_000].iter().all(|&b| b == 0),
        "a hole reads zeros"
    );
    // truncate down and up: the cut bytes come back as zeros
    let f = OpenOptions::new().write(true).open(r.p("a")).unwrap();
    f.set_len(3).unwrap();
    f.set_len(10).unwrap();
    drop(f);
    assert_eq!(fs::read(r.p("a")).unwrap(), b"hel\0\0\0\0\0\0\0");
    // O_EXCL on an existing file
    let e = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(r.p("a"))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists);
    // mkdir, rmdir of a non-empty directory, rename across directories
    fs::create_dir(r.p("d")).unwrap();
    assert_eq!(
        fs::create_dir(r.p("d")).unwrap_err().kind(),
        ErrorKind::AlreadyExists
    );
    fs::rename(r.p("a"), r.p("d/b")).unwrap();
    assert!(!r.p("a").exists());
    assert_eq!(fs::read(r.p("d/b")).unwrap().len(), 10);
    assert!(fs::remove_dir(r.p("d")).is_err(), "ENOTEMPTY");
    // rename over an existing file replaces it
    fs::write(r.p("d/c"), b"other").unwrap();
    fs::rename(r.p("d/c"), r.p("d/b")).unwrap();
    assert_eq!(fs::read(r.p("d/b")).unwrap(), b"other");
    // directories renamed with their files
    fs::rename(r.p("d"), r.p("e")).unwrap();
    assert_eq!(fs::read(r.p("e/b")).unwrap(), b"other");
    // symlink and readlink
    std::os::unix::fs::symlink("b", r.p("e/l")).unwrap();
    assert_eq!(fs::read_link(r.p("e/l")).unwrap(), Path::new("b"));
    assert_eq!(fs::read(r.p("e/l")).unwrap(), b"other");
    // chmod, chown, utimens
    fs::set_permissions(r.p("e/b"), fs::Permissions::from_mode(0o640)).unwrap();
    std::os::unix::fs::chown(r.p("e/b"), Some(1234), Some(5678)).unwrap();
    let when = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    OpenOptions::new()
        .write(true)
        .open(r.p("e/b"))
        .unwrap()
        .set_modified(when)
        .unwrap();
    let m = fs::metadata(r.p("e/b")).unwrap();
    assert_eq!(
        (m.mode() & 0o7777, m.uid(), m.gid(), m.mtime()),
        (0o640, 1234, 5678, 1_000_000)
    );
    fs::set_permissions(r.p("e"), fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(fs::metadata(r.p("e")).unwrap().mode() & 0o7777, 0o700);
    // listing hides the sidecars
    let mut names: Vec<String> = fs::read_dir(r.p("e"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, vec!["b", "l"]);
    // unlink, rmdir, fsync, statfs
    let f = OpenOptions::new().write(true).open(r.p("e/b")).unwrap();
    f.sync_all().unwrap();
    drop(f);
    fs::remove_file(r.p("e/l")).unwrap();
    fs::remove_file(r.p("e/b")).unwrap();
    assert_eq!(
        fs::metadata(r.p("e/b")).unwrap_err().kind(),
        ErrorKind::NotFound
    );
    fs::remove_dir(r.p("e")).unwrap();
    assert!(rustix::fs::statvfs(&r.mnt).unwrap().f_blocks > 0);
    assert!(fs::hard_link(r.p("x"), r.p("y")).is_err());
    // nothing is left on the branches but the empty work directory
    for b in &r.branches {
        let left: Vec<_> = fs::read_dir(b)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n != ".grove-raif.tmp")
            .collect();
        assert!(left.is_empty(), "{}: {left:?}", b.display());
        let work = b.join(".grove-raif.tmp");
        assert!(!work.exists() || fs::read_dir(&work).unwrap().count() == 0);
    }
}

#[test]
fn random_operations_match_an_oracle_on_raif5() {
    require_fuse!();
    let r = Raif::new("raif5", 4, "4K");
    let mut oracle: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut rng = random_words(FSX_OPERATIONS, 42);
    for step in 0..FSX_OPERATIONS {
        let x = rng.next().unwrap();
        let name = format!("f{}", x % 4);
        let path = r.p(&name);
        let file = oracle.entry(name.clone()).or_default();
        let offset = (x >> 8) % FSX_FILE_MAX_BYTES;
        let len = ((x >> 32) % 20_000) as usize + 1;
        match (x >> 4) % 8 {
            0..=3 => {
                let data = pattern(len, x);
                let f = open_or_create(&path, false);
                f.write_all_at(&data, offset).unwrap();
                let end = offset as usize + len;
                if file.len() < end {
                    file.resize(end, 0);
                }
                file[offset as usize..end].copy_from_slice(&data);
            }
            4 | 5 => {
                let mut buf = vec![0u8; len];
                let f = open_or_create(&path, true);
                let n = f.read_at(&mut buf, offset).unwrap();
                let expected = file
                    .get(offset as usize..(offset as usize + len).min(file.len()))
                    .unwrap_or(&[]);
                assert_eq!(&buf[..n], expected, "step {step}: read {name} at {offset}");
            }
            6 => {
                let size = offset / 2;
                let f = open_or_create(&path, false);
                f.set_len(size).unwrap();
                file.resize(size as usize, 0);
            }
            _ => {
                let f = open_or_create(&path, false);
                f.sync_all().unwrap();
                assert_eq!(
                    f.metadata().unwrap().len(),
                    file.len() as u64,
                    "step {step}: size of {name}"
                );
            }
        }
    }
    r.unmount();
    // Everything reads back the same after a remount.
    let out = grove(&[
        "raif",
        "mount",
        "--level",
        "raif5",
        "--stripe-unit",
        "4K",
        r.branches[0].to_str().unwrap(),
        r.branches[1].to_str().unwrap(),
        r.branches[2].to_str().unwrap(),
        r.branches[3].to_str().unwrap(),
        r.mnt.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    for (name, data) in &oracle {
        assert_eq!(&fs::read(r.p(name)).unwrap(), data, "{name} after remount");
    }
}

#[test]
fn removing_a_branch_mid_run_keeps_every_file() {
    require_fuse!();
    for (level, width) in [("raif1", 2), ("raif5", 3), ("raif6", 4), ("raif10", 4)] {
        let r = Raif::new(level, width, "4K");
        let files: Vec<(String, Vec<u8>)> = (0..6)
            .map(|i| (format!("f{i}"), pattern(1 + i * 37_001, i as u64)))
            .collect();
        for (name, data) in &files {
            fs::write(r.p(name), data).unwrap();
        }
        fs::remove_dir_all(&r.branches[1]).unwrap();
        for (name, data) in &files {
            assert_eq!(
                &fs::read(r.p(name)).unwrap(),
                data,
                "{level}: {name} without branch b1"
            );
        }
        // Writes go on in degraded mode where the level allows.
        fs::write(r.p("f0"), b"after").unwrap();
        assert_eq!(fs::read(r.p("f0")).unwrap(), b"after");
        let status = r.status();
        assert_eq!(status["state"], "degraded", "{level}: {status}");
        assert_eq!(status["branches"][1]["state"], "failed");
        let out = grove(&["raif", "status", r.mnt.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1), "status exits 1 when degraded");
        // Reported, not an error: the failed branch and how to refill it.
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("branch b1 failed: `grove raif rebuild --branch b1 --to NEWDIR"),
            "{level}: {stdout}"
        );
        assert!(
            out.stderr.is_empty(),
            "{level}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn a_branch_removed_under_an_open_file_is_noticed() {
    require_fuse!();
    let r = Raif::new("raif5", 3, "4K");
    let data = pattern(40_000, 50);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(r.p("f0"))
        .unwrap();
    f.write_all_at(&data[..20_000], 0).unwrap();
    f.sync_all().unwrap();
    // f0's metadata is on b2 and b0: writing it back never touches b1,
    // and the open file's handle on b1's component outlives the directory.
    let on = r.explain("f0")["metadata_on"].clone();
    assert_eq!(on, serde_json::json!(["b2", "b0"]));
    fs::remove_dir_all(&r.branches[1]).unwrap();
    f.write_all_at(&data[20_000..], 20_000).unwrap();
    f.sync_all().unwrap();
    let status = r.status();
    assert_eq!(status["state"], "degraded", "{status}");
    assert_eq!(status["branches"][1]["state"], "failed", "{status}");
    drop(f);
    assert_eq!(fs::read(r.p("f0")).unwrap(), data);
}

#[test]
fn explain_and_status_answer() {
    require_fuse!();
    let r = Raif::new("raif1", 3, "64K");
    fs::write(r.p("a.bin"), pattern(200_000, 1)).unwrap();
    let out = grove(&["raif", "explain", r.p("a.bin").to_str().unwrap()]);
    assert!(out.status.success());
    // For people: a line a field, not JSON.
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("level       raif1\n") && text.contains("rule        default\n"),
        "{text}"
    );
    assert!(text.contains("stripe 0 at 0: data"), "{text}");
    assert!(!text.trim_start().starts_with('{'), "{text}");
    let out = grove(&["raif", "explain", "--json", r.p("a.bin").to_str().unwrap()]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["level"], "raif1");
    assert_eq!(v["rule"], "default");
    assert_eq!(v["stripe_unit_bytes"], 65536);
    assert_eq!(v["stripes"][0]["data"][0].as_array().unwrap().len(), 3);
    // Replicated reads are spread over every branch.
    for _ in 0..20 {
        fs::read(r.p("a.bin")).unwrap();
    }
    let status = r.status();
    assert_eq!(status["state"], "ok");
    for b in status["branches"].as_array().unwrap() {
        assert!(b["reads"].as_u64().unwrap() > 0, "{status}");
    }
}

#[test]
fn bad_input_gets_one_line_errors() {
    require_fuse!();
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let config = dir.path().join("raif.toml");
    let cases = [
        (format!("[[branch]]\nlabel = \"a\"\npath = \"{0}/a\"\n[[rule]]\nname = \"m\"\nlevel = \"raif1\"\nbranches = [\"zz\"]\n[default]\nlevel = \"raif0\"\n", dir.path().display()), "rule \"m\": unknown branch label \"zz\""),
        (format!("[[branch]]\nlabel = \"a\"\npath = \"{0}/a\"\n[default]\nlevel = \"raif5\"\n", dir.path().display()), "rule \"default\": raif5 needs at least 3 branches, got 1"),
        (format!("[[branch]]\nlabel = \"a\"\npath = \"{0}/a\"\n[default]\nlevel = \"raif0\"\nstripe_unit = \"3K\"\n", dir.path().display()), "rule \"default\": stripe unit 3072 bytes is not a power of two"),
        (format!("[[branch]]\nlabel = \"a\"\npath = \"{0}/missing\"\n[default]\nlevel = \"raif0\"\n", dir.path().display()), "branch a"),
    ];
    for (text, expected) in cases {
        fs::write(&config, text).unwrap();
        let out = grove(&[
            "raif",
            "mount",
            "--config",
            config.to_str().unwrap(),
            mnt.to_str().unwrap(),
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with("grove: error: ") && stderr.contains(expected),
            "{stderr} should say {expected}"
        );
        assert!(!is_mounted(&mnt));
    }
}

/// `scrub --repair` finds and repairs (exit 1, "repaired"), then a second
/// scrub is clean; returns that second scrub's output.
fn repair_then_scrub_clean(r: &Raif, level: &str) -> Output {
    let out = r.run(&["scrub", "--repair"]);
    assert_eq!(out.status.code(), Some(1), "{level}: {}", text(&out));
    assert!(text(&out).contains("repaired"), "{level}: {}", text(&out));
    let out = r.run(&["scrub"]);
    assert!(out.status.success(), "{level}: {}", text(&out));
    out
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn rebuild_restores_full_redundancy() {
    require_fuse!();
    for (level, width) in [("raif1", 2), ("raif5", 3), ("raif6", 4), ("raif10", 4)] {
        let mut r = Raif::new(level, width, "4K");
        fs::create_dir(r.p("d")).unwrap();
        std::os::unix::fs::symlink("../f1", r.p("d/l")).unwrap();
        let mut files: Vec<(String, Vec<u8>)> = (0..6)
            .map(|i| (format!("f{i}"), pattern(1 + i * 37_001, i as u64)))
            .collect();
        files.push(("d/g".into(), pattern(70_000, 99)));
        for (name, data) in &files {
            fs::write(r.p(name), data).unwrap();
        }
        fs::remove_dir_all(&r.branches[1]).unwrap();
        // A degraded write, which the rebuild must carry onto the new branch.
        files[0].1 = pattern(50_000, 7);
        fs::write(r.p("f0"), &files[0].1).unwrap();
        assert_eq!(r.status()["state"], "degraded", "{level}");
        let new = r.dir.path().join("new1");
        fs::create_dir(&new).unwrap();
        fs::write(new.join("stray"), b"x").unwrap();
        let out = r.run(&["rebuild", "--branch", "b1", "--to", new.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert!(text(&out).contains("is not empty"), "{}", text(&out));
        fs::remove_file(new.join("stray")).unwrap();
        let out = r.run(&["rebuild", "--branch", "b1", "--to", new.to_str().unwrap()]);
        assert!(out.status.success(), "{level}: {}", text(&out));
        assert!(text(&out).contains("rebuilt branch b1"), "{}", text(&out));
        assert_eq!(r.status()["state"], "ok", "{level}: {}", r.status());
        r.branches[1] = new;
        // Full redundancy: every file survives the loss of any other branch.
        for lost in (0..width).filter(|&i| i != 1) {
            r.unmount();
            r.mount();
            let away = r.dir.path().join("away");
            fs::rename(&r.branches[lost], &away).unwrap();
            for (name, data) in &files {
                assert_eq!(
                    &fs::read(r.p(name)).unwrap(),
                    data,
                    "{level}: {name} without b{lost} after the rebuild"
                );
            }
            assert_eq!(fs::read_link(r.p("d/l")).unwrap(), Path::new("../f1"));
            r.unmount();
            fs::rename(&away, &r.branches[lost]).unwrap();
        }
    }
}

/// The CI flake of rebuild_restores_full_redundancy: a background mount
/// announced itself before moving its stderr off the pipe of the parent,
/// which exits at once; the first request that logged (here a branch found
/// missing) wrote into that dead pipe, tracing-subscriber reported the
/// failure with eprintln!, whose panic killed the request's thread and
/// fuser answered EIO. A foreground mount whose stderr reader is gone
/// shows the same deterministically: it must serve on, logs lost or not.
/// The traps of issue 26: a healthy branch is refused without --force
/// (the README's example once replaced one); a forced rebuild that cannot
/// finish (RAIF5 with another branch failed) leaves the mount as it was,
/// the new directory empty again and the files readable; the branch that
/// really failed is then rebuilt into that same directory, and status
/// shows labels beside directories.
#[test]
fn rebuild_refuses_a_healthy_branch_and_a_failed_one_leaves_the_mount_as_it_was() {
    require_fuse!();
    let r = Raif::new("raif5", 3, "4K");
    let data = pattern(100_000, 5);
    fs::write(r.p("f"), &data).unwrap();
    fs::remove_dir_all(&r.branches[1]).unwrap();
    assert_eq!(r.status()["state"], "degraded");
    let new = r.dir.path().join("new");
    fs::create_dir(&new).unwrap();
    let to = new.to_str().unwrap();
    let out = r.run(&["rebuild", "--branch", "b2", "--to", to]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("is not failed"), "{}", text(&out));
    assert!(
        text(&out).contains("b1"),
        "names the failed one: {}",
        text(&out)
    );
    let out = r.run(&["rebuild", "--branch", "b2", "--force", "--to", to]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("as it was"), "{}", text(&out));
    assert_eq!(fs::read_dir(&new).unwrap().count(), 0, "emptied again");
    let status = r.status();
    assert_eq!(status["branches"][2]["state"], "ok", "{status}");
    assert_eq!(
        status["branches"][2]["path"],
        r.branches[2].to_str().unwrap()
    );
    assert_eq!(fs::read(r.p("f")).unwrap(), data, "still readable");
    let out = r.run(&["rebuild", "--branch", "b1", "--to", to]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(r.status()["state"], "ok");
    let out = grove(&["raif", "status", r.mnt.to_str().unwrap()]);
    let human = text(&out);
    let line = human.lines().find(|l| l.starts_with("b1")).unwrap();
    assert!(line.contains(to) && line.contains("replaces"), "{human}");
    assert_eq!(fs::read(r.p("f")).unwrap(), data);
}

/// Issue 26 point 6: a replacement shows as rebuilding, never ok, until
/// every file on it is whole. The mount's test hook delays every read on
/// the surviving branches, which the rebuild reads from, so that it lasts
/// while `status --json` is polled; the job's file count in the same
/// answer says how far it is. Every answer with files still to rebuild
/// shows the branch failed or rebuilding, never ok; at least one answer
/// came while the rebuild was part way; at the end it is ok and whole.
#[test]
fn a_replacement_shows_as_rebuilding_until_every_file_on_it_is_whole() {
    require_fuse!();
    let delays = format!("b0={REBUILD_READ_DELAY_MS},b2={REBUILD_READ_DELAY_MS}");
    let mut r = Raif::with_env("raif5", 3, "4K", &[("GROVE_RAIF_READ_DELAY", &delays)]);
    let files: Vec<(String, Vec<u8>)> = (0..REBUILD_STATUS_FILES)
        .map(|i| {
            (
                format!("f{i}"),
                pattern(REBUILD_STATUS_FILE_BYTES, i as u64),
            )
        })
        .collect();
    for (name, data) in &files {
        fs::write(r.p(name), data).unwrap();
    }
    fs::remove_dir_all(&r.branches[1]).unwrap();
    let status = r.status();
    assert_eq!(status["branches"][1]["state"], "failed", "{status}");
    let new = r.dir.path().join("new1");
    fs::create_dir(&new).unwrap();
    let mut rebuild = Command::new("timeout")
        .args([
            "-k", "5", "240", GROVE, "raif", "rebuild", "--branch", "b1", "--to",
        ])
        .arg(&new)
        .arg(&r.mnt)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let total = REBUILD_STATUS_FILES as u64;
    let (mut polls, mut part_way) = (0, 0);
    let started = Instant::now();
    while rebuild.try_wait().unwrap().is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the rebuild did not end"
        );
        let status = r.status();
        polls += 1;
        let branch = &status["branches"][1];
        let state = branch["state"].as_str().unwrap();
        let job = &status["job"];
        let files = job["files"].as_u64().unwrap_or(0);
        assert!(
            state == "failed" || state == "rebuilding" || state == "ok",
            "{status}"
        );
        if files < total {
            assert_ne!(state, "ok", "ok with files still to rebuild: {status}");
            assert_eq!(status["state"], "degraded", "{status}");
        }
        if state == "ok" {
            assert_eq!(job["files"], total, "{status}");
            assert_eq!(job["problems"], 0, "{status}");
        }
        if files > 0 && files < total {
            assert_eq!(state, "rebuilding", "part way: {status}");
            assert_eq!(branch["path"], new.to_str().unwrap(), "{status}");
            part_way += 1;
        }
    }
    let out = rebuild.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        part_way > 0,
        "no status answer came while the rebuild was part way ({polls} polls)"
    );
    let status = r.status();
    assert_eq!(status["state"], "ok", "{status}");
    assert_eq!(status["branches"][1]["state"], "ok", "{status}");
    assert_eq!(status["job"]["finished"], true, "{status}");
    assert_eq!(status["job"]["files"], total, "{status}");
    // Whole: every file reads back without b0, from b1 and b2 alone.
    r.branches[1] = new;
    r.unmount();
    r.mount();
    let away = r.dir.path().join("away");
    fs::rename(&r.branches[0], &away).unwrap();
    for (name, data) in &files {
        assert_eq!(&fs::read(r.p(name)).unwrap(), data, "{name} without b0");
    }
    assert_eq!(r.status()["branches"][0]["state"], "failed");
    r.unmount();
    fs::rename(&away, &r.branches[0]).unwrap();
}

/// Issue 26 point 2: FIFOs, device nodes and sockets made through the
/// mount are on every branch, as directories are, with the type, device
/// number, mode and owner the mount shows, and a chmod, chown or
/// utimensat through the mount reaches every branch too. (Times as made
/// are each branch's own, milliseconds apart, as a directory's are; the
/// times set explicitly are the same everywhere.)
#[test]
fn special_files_are_on_every_branch_with_their_modes_owners_and_times() {
    require_fuse!();
    use rustix::fs::{FileType, Mode, Timespec, Timestamps};
    for (level, width) in [("raif1", 2), ("raif5", 3), ("raif6", 4)] {
        let r = Raif::new(level, width, "4K");
        fs::create_dir(r.p("d")).unwrap();
        // (name, type, st_mode's type bits, device number, mode as made:
        // none of them cleared by the test's umask of 022)
        let kinds = [
            ("d/fifo", FileType::Fifo, 0o010000, 0, 0o640),
            (
                "d/null",
                FileType::CharacterDevice,
                0o020000,
                rustix::fs::makedev(1, 3),
                0o604,
            ),
            (
                "d/loop",
                FileType::BlockDevice,
                0o060000,
                rustix::fs::makedev(7, 200),
                0o600,
            ),
            ("d/sock", FileType::Socket, 0o140000, 0, 0),
        ];
        for (name, kind, _, dev, mode) in &kinds[..3] {
            rustix::fs::mknodat(
                rustix::fs::CWD,
                r.p(name),
                *kind,
                Mode::from_raw_mode(*mode),
                *dev,
            )
            .unwrap_or_else(|e| panic!("{level}: mknod {name}: {e}"));
        }
        let listener = std::os::unix::net::UnixListener::bind(r.p("d/sock"))
            .unwrap_or_else(|e| panic!("{level}: bind: {e}"));
        // Each entry as the mount shows it meets `expect`, and is on every
        // branch with its type, device number, mode and owner, each of
        // which meets `expect` too.
        let check = |stage: &str, expect: &dyn Fn(&str, &fs::Metadata)| {
            for (name, _, kind, dev, _) in kinds {
                let seen = fs::symlink_metadata(r.p(name)).unwrap();
                expect(name, &seen);
                for (i, branch) in r.branches.iter().enumerate() {
                    let m = fs::symlink_metadata(branch.join(name)).unwrap_or_else(|e| {
                        panic!("{level} {stage}: {name} is not on branch b{i}: {e}")
                    });
                    let what = format!("{level} {stage}: {name} on b{i}");
                    assert_eq!(m.mode() & 0o170000, kind, "{what}: type");
                    assert_eq!(m.rdev(), dev, "{what}: device number");
                    assert_eq!(m.mode(), seen.mode(), "{what}: mode");
                    assert_eq!(
                        (m.uid(), m.gid()),
                        (seen.uid(), seen.gid()),
                        "{what}: owner"
                    );
                    expect(&what, &m);
                }
            }
        };
        // As made: the socket's mode follows the umask, so it is only
        // compared with what the mount shows.
        check("made", &|what, m| {
            let made = kinds.iter().find(|k| what.contains(k.0)).unwrap();
            if made.4 != 0 {
                assert_eq!(m.mode() & 0o7777, made.4, "{what}: mode as made");
            }
            assert_eq!((m.uid(), m.gid()), (0, 0), "{what}: owner");
        });
        // Changed through the mount: mode, owner, times.
        let when = Timespec {
            tv_sec: 1_234_567_890,
            tv_nsec: 250_000_000,
        };
        for (name, ..) in kinds {
            // chown first: it clears the set-user-ID bit.
            std::os::unix::fs::lchown(r.p(name), Some(4321), Some(8765)).unwrap();
            rustix::fs::chmod(r.p(name), Mode::from_raw_mode(0o4751)).unwrap();
            let times = Timestamps {
                last_access: when,
                last_modification: when,
            };
            rustix::fs::utimensat(
                rustix::fs::CWD,
                r.p(name),
                &times,
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            )
            .unwrap();
        }
        check("changed", &|what, m| {
            assert_eq!(m.mode() & 0o7777, 0o4751, "{what}: mode");
            assert_eq!((m.uid(), m.gid()), (4321, 8765), "{what}: owner");
            assert_eq!(
                (m.mtime(), m.mtime_nsec()),
                (1_234_567_890, 250_000_000),
                "{what}: mtime"
            );
            assert_eq!(
                (m.atime(), m.atime_nsec()),
                (1_234_567_890, 250_000_000),
                "{what}: atime"
            );
        });
        drop(listener);
    }
}

#[test]
fn a_mount_whose_log_cannot_be_written_still_serves() {
    require_fuse!();
    let r = Raif::new("raif5", 3, "4K");
    r.unmount();
    let mut args = vec!["raif", "mount", "--foreground", "--level", "raif5"];
    args.extend(["--stripe-unit", "4K"]);
    args.extend(r.branches.iter().map(|b| b.to_str().unwrap()));
    args.push(r.mnt.to_str().unwrap());
    let mut child = Command::new(GROVE)
        .args(&args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert!(line.starts_with("mounted RAIF"), "{line}");
    // Nobody reads the log any more, as after a background mount's parent exits.
    drop(child.stderr.take());
    let data = pattern(20_000, 12);
    fs::write(r.p("a"), &data).unwrap();
    // Both log lines: the component that cannot be opened, the branch failed.
    fs::rename(&r.branches[1], r.dir.path().join("away")).unwrap();
    for _ in 0..2 {
        assert_eq!(fs::read(r.p("a")).unwrap(), data);
    }
    assert_eq!(r.status()["state"], "degraded");
    r.unmount();
    assert!(child.wait().unwrap().success());
}

#[test]
fn a_degraded_mount_serves_and_rebuild_restores_the_missing_branch() {
    require_fuse!();
    let mut r = Raif::new("raif5", 3, "4K");
    fs::create_dir(r.p("d")).unwrap();
    let mut files: Vec<(String, Vec<u8>)> = (0..4)
        .map(|i| (format!("f{i}"), pattern(1 + i * 37_001, i as u64 + 30)))
        .collect();
    files.push(("d/g".into(), pattern(70_000, 34)));
    for (name, data) in &files {
        fs::write(r.p(name), data).unwrap();
    }
    r.unmount();
    fs::remove_dir_all(&r.branches[1]).unwrap();
    // Refused by default, with the branch named.
    let out = r.mount_output();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("branch b1") && stderr.contains("missing"),
        "{stderr}"
    );
    r.flags = vec!["--degraded".into()];
    let out = r.mount_output();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("mounted degraded: branch b1 missing"),
        "{}",
        text(&out)
    );
    let status = r.status();
    assert_eq!(status["state"], "degraded", "{status}");
    assert_eq!(status["branches"][1]["state"], "failed", "{status}");
    let log = fs::read_to_string(r.log_path()).unwrap();
    assert!(log.contains("mounted degraded: branch b1 missing"), "{log}");
    // Reads and writes go on where redundancy allows.
    files[1].1 = pattern(20_000, 35);
    files.push(("new".into(), pattern(50_000, 36)));
    for (name, data) in &files {
        fs::write(r.p(name), data).unwrap();
    }
    for (name, data) in &files {
        assert_eq!(&fs::read(r.p(name)).unwrap(), data, "{name} degraded");
    }
    let new = r.dir.path().join("new1");
    fs::create_dir(&new).unwrap();
    let out = r.run(&["rebuild", "--branch", "b1", "--to", new.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(r.status()["state"], "ok");
    // A plain mount over the new branch, without b0: everything is there.
    r.unmount();
    r.branches[1] = new;
    r.flags.clear();
    r.mount();
    fs::rename(&r.branches[0], r.dir.path().join("away")).unwrap();
    for (name, data) in &files {
        assert_eq!(&fs::read(r.p(name)).unwrap(), data, "{name} without b0");
    }
    r.unmount();
    fs::rename(r.dir.path().join("away"), &r.branches[0]).unwrap();
}

#[test]
fn a_degraded_mount_is_refused_beyond_what_the_layout_survives() {
    require_fuse!();
    // (level, width, branches removed, what the one-line error says)
    let cases = [
        (
            "raif5",
            3,
            &[1, 2][..],
            Some("rule \"default\" (raif5) does not survive the loss of b1, b2"),
        ),
        (
            "raif0",
            2,
            &[1][..],
            Some("rule \"default\" (raif0) does not survive the loss of b1"),
        ),
        (
            "raif6",
            4,
            &[1, 2][..],
            Some("branches b1, b2 hold both copies of some files' metadata"),
        ),
        ("raif6", 4, &[0, 2][..], None),
    ];
    for (level, width, removed, expected) in cases {
        let mut r = Raif::new(level, width, "4K");
        fs::write(r.p("a"), pattern(30_000, 40)).unwrap();
        r.unmount();
        for &b in removed {
            fs::remove_dir_all(&r.branches[b]).unwrap();
        }
        r.flags = vec!["--degraded".into()];
        let out = r.mount_output();
        let stderr = String::from_utf8_lossy(&out.stderr);
        match expected {
            Some(expected) => {
                assert_eq!(out.status.code(), Some(1), "{level}: {stderr}");
                assert_eq!(stderr.lines().count(), 1, "{level}: {stderr}");
                let line = format!("grove: error: cannot mount degraded: {expected}");
                assert!(stderr.starts_with(&line), "{level}: {stderr}");
                assert!(!is_mounted(&r.mnt));
            }
            None => {
                assert!(out.status.success(), "{level}: {stderr}");
                assert_eq!(fs::read(r.p("a")).unwrap(), pattern(30_000, 40));
            }
        }
    }
}

#[test]
fn scrub_finds_and_repairs_a_corrupt_unit() {
    require_fuse!();
    for level in ["raif5", "raif1"] {
        let r = Raif::new(level, 3, "4K");
        let data = pattern(50_000, 3);
        fs::write(r.p("a"), &data).unwrap();
        let out = r.run(&["scrub"]);
        assert!(out.status.success(), "{level}: {}", text(&out));
        // Stripe 1's parity (RAIF5) or second mirror copy (RAIF1), which the
        // repair rewrites from the data or the first copy.
        let stripe = &r.explain("a")["stripes"][1];
        let label = if level == "raif5" {
            stripe["parity"][0].clone()
        } else {
            stripe["data"][0][1].clone()
        };
        let component = OpenOptions::new()
            .write(true)
            .open(r.branch(&label).join("a"))
            .unwrap();
        component.write_all_at(&[0xa5; 100], 4096 + 10).unwrap();
        drop(component);
        let out = r.run(&["scrub"]);
        assert_eq!(out.status.code(), Some(1), "{level}: {}", text(&out));
        let expected = format!(
            "a: stripe 1 (offset {}): {} disagree",
            if level == "raif5" { 8192 } else { 4096 },
            label.as_str().unwrap()
        );
        assert!(text(&out).contains(&expected), "{level}: {}", text(&out));
        let out = repair_then_scrub_clean(&r, level);
        assert!(text(&out).contains("0 mismatches"), "{}", text(&out));
        assert_eq!(fs::read(r.p("a")).unwrap(), data, "{level}");
    }
}

#[test]
fn kill_9_of_the_mount_keeps_every_fsync() {
    require_fuse!();
    for iteration in 0..CRASH_ITERATIONS {
        let r = Raif::new("raif5", 3, "4K");
        r.unmount();
        let pid = r.mount();
        let src = r.dir.path().join("src");
        let data = pattern(CRASH_CHUNK_BYTES * CRASH_CHUNKS, iteration);
        fs::write(&src, &data).unwrap();
        fs::write(r.p("log"), b"").unwrap();
        // A writer process: each step appends a chunk with dd, fsyncs it
        // (conv=fsync) and then prints the step's number.
        let script = format!(
            "i=0; while [ $i -lt {CRASH_CHUNKS} ]; do \
             dd if={src} of={dst} bs={CRASH_CHUNK_BYTES} count=1 skip=$i seek=$i \
             conv=notrunc,fsync status=none || exit 1; echo $i; i=$((i+1)); done",
            src = src.display(),
            dst = r.p("log").display()
        );
        let mut writer = Command::new("sh")
            .args(["-c", &script])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut lines =
            std::io::BufRead::lines(std::io::BufReader::new(writer.stdout.take().unwrap()));
        // A pseudo-random moment: after some steps, some milliseconds in.
        let steps = 10 + (pattern(1, iteration + 11)[0] as usize) % 60;
        let mut synced: Option<usize> = None;
        for _ in 0..steps {
            match lines.next() {
                Some(Ok(line)) => synced = Some(line.parse().unwrap()),
                _ => break,
            }
        }
        std::thread::sleep(Duration::from_millis(
            pattern(1, iteration + 5)[0] as u64 % 20,
        ));
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        // The steps the writer finished after the kill count too.
        for line in lines.map_while(Result::ok) {
            synced = Some(line.parse().unwrap());
        }
        let _ = writer.kill();
        let _ = writer.wait();
        r.unmount();
        r.mount();
        let found = fs::read(r.p("log")).unwrap();
        let synced_bytes = synced.map_or(0, |s| (s + 1) * CRASH_CHUNK_BYTES);
        assert!(
            found.len() >= synced_bytes,
            "iteration {iteration}: {} bytes after the crash, {synced_bytes} were fsynced",
            found.len()
        );
        assert!(
            found[..synced_bytes] == data[..synced_bytes],
            "iteration {iteration}: fsynced data differs after the crash"
        );
        // A stripe the crash tore (data written, parity not) is found and
        // repaired; after the repair everything agrees.
        let out = r.run(&["scrub", "--repair"]);
        eprintln!(
            "iteration {iteration}, {synced_bytes} bytes fsynced: {}",
            text(&out)
        );
        let out = r.run(&["scrub"]);
        assert!(
            out.status.success(),
            "iteration {iteration}: {}",
            text(&out)
        );
        assert_eq!(fs::read(r.p("log")).unwrap(), found);
    }
}

/// Waits until the mount's log holds `text` (or the settle timeout ends).
fn wait_for_log(r: &Raif, text: &str) -> bool {
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(SETTLE_TIMEOUT_MS) {
        if fs::read_to_string(r.log_path()).is_ok_and(|log| log.contains(text)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn kill_9_in_the_write_hole_is_found_and_repaired_by_scrub() {
    require_fuse!();
    for (level, width) in [("raif5", 3), ("raif1", 2)] {
        let mut r = Raif::new(level, width, "4K");
        let mut data = pattern(50_000, 21);
        let other = pattern(30_000, 22);
        for (name, bytes) in [("a", &data), ("b", &other)] {
            let mut f = fs::File::create(r.p(name)).unwrap();
            std::io::Write::write_all(&mut f, bytes).unwrap();
            f.sync_all().unwrap();
        }
        // Remounted with the hook: its first write request stops for good
        // between its new data and the parity (RAIF5) or second copy (RAIF1).
        r.unmount();
        r.env = vec![("GROVE_RAIF_WRITE_HOLE".into(), "1".into())];
        let pid = r.mount();
        let stripe_bytes = if level == "raif5" { 8192 } else { 4096 };
        let at = stripe_bytes + 10;
        let piece = pattern(100, 23);
        let (path, written) = (r.p("a"), piece.clone());
        let writer = std::thread::spawn(move || {
            let f = OpenOptions::new().write(true).open(path).unwrap();
            f.write_all_at(&written, at as u64)
        });
        assert!(
            wait_for_log(&r, "GROVE_RAIF_WRITE_HOLE: this write stops"),
            "{level}: the write never reached the hole"
        );
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        assert!(writer.join().unwrap().is_err(), "{level}: the write failed");
        r.unmount();
        r.env.clear();
        r.mount();
        let out = r.run(&["scrub"]);
        assert_eq!(out.status.code(), Some(1), "{level}: {}", text(&out));
        let expected = format!("a: stripe 1 (offset {stripe_bytes}): ");
        assert!(text(&out).contains(&expected), "{level}: {}", text(&out));
        repair_then_scrub_clean(&r, level);
        // The new data reached its unit (the first copy, for RAIF1), which
        // the repair made redundant again; everything else is as fsynced.
        data[at..at + piece.len()].copy_from_slice(&piece);
        assert_eq!(fs::read(r.p("a")).unwrap(), data, "{level}");
        assert_eq!(fs::read(r.p("b")).unwrap(), other, "{level}");
        // Redundant indeed: without the branch of the stripe's other data
        // unit (RAIF5: rebuilt from the repaired parity) or of the first
        // copy (RAIF1), stripe 1 still reads back.
        let stripe = r.explain("a")["stripes"][1].clone();
        let label = &stripe["data"][if level == "raif5" { 1 } else { 0 }][0];
        let lost = r.branch(label).to_path_buf();
        r.unmount();
        r.mount();
        let away = r.dir.path().join("away");
        fs::rename(&lost, &away).unwrap();
        assert_eq!(fs::read(r.p("a")).unwrap(), data, "{level} without {label}");
        r.unmount();
        fs::rename(&away, &lost).unwrap();
    }
}

#[test]
fn a_slow_branch_gets_fewer_reads() {
    require_fuse!();
    // Every read of branch b0 is delayed by the mount's test hook.
    let r = Raif::with_env("raif1", 2, "64K", &[("GROVE_RAIF_READ_DELAY", "b0=3")]);
    let data = pattern(8 * 65536, 4);
    fs::write(r.p("a"), &data).unwrap();
    for _ in 0..SLOW_BRANCH_PASSES {
        assert_eq!(fs::read(r.p("a")).unwrap(), data);
    }
    let status = r.status();
    let reads = |i: usize| status["branches"][i]["reads"].as_u64().unwrap();
    assert!(reads(0) > 0, "the slow branch is still measured: {status}");
    assert!(
        reads(0) * 4 < reads(1),
        "the slow branch got too many reads: {status}"
    );
    assert!(
        status["branches"][0]["latency_us"].as_u64().unwrap()
            > status["branches"][1]["latency_us"].as_u64().unwrap()
    );
}

#[test]
fn a_file_growing_past_a_size_threshold_is_laid_out_again_at_close() {
    require_fuse!();
    let mut r = Raif::new("raif1", 3, "4K");
    r.unmount();
    let config = r.dir.path().join("raif.toml");
    let mut toml = String::new();
    for (i, b) in r.branches.iter().enumerate() {
        toml += &format!("[[branch]]\nlabel = \"b{i}\"\npath = \"{}\"\n", b.display());
    }
    toml +=
        "[[rule]]\nname = \"big\"\nmin_size = \"64K\"\nlevel = \"raif5\"\nstripe_unit = \"4K\"\n";
    toml += "[default]\nlevel = \"raif1\"\nstripe_unit = \"4K\"\n";
    fs::write(&config, toml).unwrap();
    r.config = Some(config);
    r.mount();
    let data = pattern(100_000, 8);
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(r.p("grows"))
        .unwrap();
    f.write_all_at(&data, 0).unwrap();
    // While open it keeps the layout it was created with (empty: default).
    let v = r.explain("grows");
    assert_eq!(
        (v["rule"].as_str(), v["rule_now"].as_str()),
        (Some("default"), Some("big"))
    );
    drop(f);
    // The last close laid it out by the rule for its size (the kernel
    // sends the release after close(2) returns, hence the wait).
    let v = r.explain_when("grows", |v| v["rule"] == "big");
    assert_eq!(
        (v["rule"].as_str(), v["level"].as_str()),
        (Some("big"), Some("raif5")),
        "{v}"
    );
    assert_eq!(fs::read(r.p("grows")).unwrap(), data);
    let mut names: Vec<String> = fs::read_dir(&r.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, vec!["grows"], "no temporary file shows");
    // Every branch holds a RAIF5 component: about half the file each.
    for b in &r.branches {
        let len = fs::metadata(b.join("grows")).unwrap().len();
        assert!(len < 60_000, "{}: {len} bytes", b.display());
    }
    // Shrunk below the threshold, it goes back to the default at close.
    OpenOptions::new()
        .write(true)
        .open(r.p("grows"))
        .unwrap()
        .set_len(1000)
        .unwrap();
    let v = r.explain_when("grows", |v| v["level"] == "raif1");
    assert_eq!(v["level"], "raif1", "{v}");
    r.unmount();
    r.mount();
    assert_eq!(fs::read(r.p("grows")).unwrap(), &data[..1000]);
    let out = r.run(&["scrub"]);
    assert!(out.status.success(), "{}", text(&out));
}

/// The names of the linked file in the hard-link tests.
const LINK_NAMES: [&str; 3] = ["a", "d/b", "c"];

/// Hard links through degraded mode, rebuild and scrub on every redundant
/// level: every name reads the file's bytes while a branch is gone, a
/// name made then counts, the rebuild makes one lower file for all the
/// names on the new branch (never a copy per name), scrub counts the file
/// once, and after the rebuild the names survive the loss of any other
/// branch. explain shows the count and the record.
#[test]
fn hard_links_stay_one_file_through_degraded_mode_rebuild_and_scrub() {
    require_fuse!();
    for (level, width) in [("raif1", 2), ("raif5", 3), ("raif6", 4), ("raif10", 4)] {
        let mut r = Raif::new(level, width, "4K");
        fs::create_dir(r.p("d")).unwrap();
        let first = pattern(50_000, 11);
        fs::write(r.p("a"), &first).unwrap();
        fs::hard_link(r.p("a"), r.p("d/b")).unwrap();
        std::os::unix::fs::symlink("a", r.p("l")).unwrap();
        fs::hard_link(r.p("l"), r.p("d/l2")).unwrap();
        fs::write(r.p("single"), b"one name").unwrap();
        let v = r.explain("d/b");
        assert_eq!(v["names"], 2, "{level}: {v}");
        assert!(v["link_record"].is_string(), "{level}: {v}");
        assert_eq!(r.explain("single")["names"], 1, "{level}");
        fs::remove_dir_all(&r.branches[1]).unwrap();
        assert_eq!(fs::read(r.p("d/b")).unwrap(), first, "{level} degraded");
        // Written through one name and given a third while degraded.
        let data = pattern(70_000, 12);
        fs::write(r.p("d/b"), &data).unwrap();
        fs::hard_link(r.p("a"), r.p("c")).unwrap();
        assert_eq!(r.status()["state"], "degraded", "{level}");
        let new = r.dir.path().join("new1");
        fs::create_dir(&new).unwrap();
        let out = r.run(&["rebuild", "--branch", "b1", "--to", new.to_str().unwrap()]);
        assert!(out.status.success(), "{level}: {}", text(&out));
        assert!(text(&out).contains(": 2 files,"), "{level}: {}", text(&out));
        r.branches[1] = new.clone();
        let lower: Vec<fs::Metadata> = LINK_NAMES
            .iter()
            .map(|n| fs::metadata(new.join(n)).unwrap())
            .collect();
        assert!(
            lower
                .iter()
                .all(|m| m.ino() == lower[0].ino() && m.nlink() == 3),
            "{level}: the rebuilt names are not one lower file"
        );
        let (l, l2) = (
            fs::symlink_metadata(new.join("l")).unwrap(),
            fs::symlink_metadata(new.join("d/l2")).unwrap(),
        );
        assert_eq!((l.ino(), l.nlink()), (l2.ino(), 2), "{level}: symlink");
        let out = r.run(&["scrub"]);
        assert!(out.status.success(), "{level}: {}", text(&out));
        let once = format!("scrubbed 2 files, {} bytes", data.len() + 8);
        assert!(text(&out).contains(&once), "{level}: {}", text(&out));
        for lost in (0..width).filter(|&i| i != 1) {
            r.unmount();
            r.mount();
            let away = r.dir.path().join("away");
            fs::rename(&r.branches[lost], &away).unwrap();
            let ino = fs::metadata(r.p("a")).unwrap().ino();
            for name in LINK_NAMES {
                let m = fs::metadata(r.p(name)).unwrap();
                assert_eq!((m.ino(), m.nlink()), (ino, 3), "{level}: {name}");
                assert!(
                    fs::read(r.p(name)).unwrap() == data,
                    "{level}: {name} without b{lost}"
                );
            }
            r.unmount();
            fs::rename(&away, &r.branches[lost]).unwrap();
        }
    }
}

/// Regular files on the branches, grove's temporary directory aside.
fn files_on_branches(r: &Raif) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = r.branches.clone();
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).unwrap().flatten() {
            let kind = entry.file_type().unwrap();
            if kind.is_dir() && entry.file_name() != ".grove-raif.tmp" {
                pending.push(entry.path());
            } else if kind.is_file() {
                found.push(entry.path());
            }
        }
    }
    found
}

/// Descriptors the mount process holds on branch files that no name
/// reaches any more.
fn deleted_files_held(r: &Raif) -> usize {
    let fds = fs::read_dir(format!("/proc/{}/fd", r.pid.get())).unwrap();
    fds.flatten()
        .filter_map(|fd| fs::read_link(fd.path()).ok())
        .map(|target| target.display().to_string())
        .filter(|t| t.starts_with(r.dir.path().to_str().unwrap()) && t.ends_with(" (deleted)"))
        .count()
}

/// The space of a linked file goes back when its last name and its last
/// descriptor go: with names gone and a descriptor open it still reads,
/// and the branches keep nothing of it but the lower files the mount holds
/// open; after the close the mount holds none.
#[test]
fn a_linked_file_goes_with_its_last_name_and_last_descriptor() {
    require_fuse!();
    let r = Raif::new("raif5", 3, "4K");
    fs::create_dir(r.p("d")).unwrap();
    let data = pattern(200_000, 21);
    fs::write(r.p("a"), &data).unwrap();
    fs::hard_link(r.p("a"), r.p("d/b")).unwrap();
    let open = fs::File::open(r.p("d/b")).unwrap();
    fs::remove_file(r.p("a")).unwrap();
    assert_eq!(open.metadata().unwrap().nlink(), 1);
    fs::remove_file(r.p("d/b")).unwrap();
    assert_eq!(files_on_branches(&r), Vec::<PathBuf>::new());
    let mut buf = vec![0u8; data.len()];
    open.read_exact_at(&mut buf, 0).unwrap();
    assert!(buf == data, "the descriptor reads other bytes");
    assert_eq!(open.metadata().unwrap().nlink(), 0);
    assert_eq!(deleted_files_held(&r), 3, "one component per branch");
    drop(open);
    // The release reaches the mount just after close(2) returns.
    let started = Instant::now();
    while deleted_files_held(&r) > 0 && started.elapsed() < Duration::from_millis(SETTLE_TIMEOUT_MS)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(deleted_files_held(&r), 0, "held after the last close");
}

/// Every regular file on the branches, grove's work directory included,
/// sorted.
fn all_files_on_branches(r: &Raif) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = r.branches.clone();
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).unwrap().flatten() {
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                pending.push(entry.path());
            } else {
                found.push(entry.path());
            }
        }
    }
    found.sort();
    found
}

/// Issue 26 point 4 for a file with one name: once unlinked while open,
/// nothing of it is left on the branches (no component, no sidecar, no
/// temporary), yet the descriptor reads and grows it; the mount holds its
/// lower files until the last close and none after. A kill -9 of the mount
/// while such a file is open leaves nothing behind either: after a remount
/// the branches hold what they held before it was made, and scrub is clean.
#[test]
fn an_unlinked_open_file_gives_its_space_back_at_close_and_a_crash_leaves_nothing() {
    require_fuse!();
    let r = Raif::new("raif5", 3, "4K");
    fs::write(r.p("keep"), b"kept").unwrap();
    let kept = all_files_on_branches(&r);
    let data = pattern(200_000, 41);
    for name in ["tmp", "crashed"] {
        fs::write(r.p(name), &data).unwrap();
        let open = OpenOptions::new()
            .read(true)
            .write(true)
            .open(r.p(name))
            .unwrap();
        fs::remove_file(r.p(name)).unwrap();
        assert_eq!(
            all_files_on_branches(&r),
            kept,
            "{name}: left on the branches"
        );
        open.write_all_at(b"grown", data.len() as u64 + 50_000)
            .unwrap();
        let mut back = vec![0u8; data.len()];
        open.read_exact_at(&mut back, 0).unwrap();
        assert!(back == data, "{name}: the descriptor reads other bytes");
        assert_eq!(open.metadata().unwrap().len(), data.len() as u64 + 50_005);
        assert_eq!(all_files_on_branches(&r), kept, "{name}: the growth landed");
        assert_eq!(deleted_files_held(&r), 3, "one component per branch");
        if name == "crashed" {
            let _ = Command::new("kill")
                .args(["-9", &r.pid.get().to_string()])
                .status();
            drop(open);
            r.unmount();
            r.mount();
            break;
        }
        drop(open);
        let started = Instant::now();
        while deleted_files_held(&r) > 0
            && started.elapsed() < Duration::from_millis(SETTLE_TIMEOUT_MS)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(deleted_files_held(&r), 0, "held after the last close");
    }
    assert_eq!(all_files_on_branches(&r), kept, "left by the crash");
    let names: Vec<_> = fs::read_dir(&r.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["keep"]);
    assert_eq!(fs::read(r.p("keep")).unwrap(), b"kept");
    let out = r.run(&["scrub"]);
    assert!(out.status.success(), "{}", text(&out));
}

/// What a link or unlink cut short by a crash leaves (made here on the
/// branches: a record no name points at, and lower links at a name with
/// no sidecar) is invisible through the mount, found by scrub and removed
/// by --repair; the linked file's names stay whole.
#[test]
fn scrub_repair_removes_what_a_cut_short_link_left() {
    require_fuse!();
    let r = Raif::new("raif5", 3, "4K");
    let data = pattern(30_000, 31);
    fs::write(r.p("a"), &data).unwrap();
    fs::hard_link(r.p("a"), r.p("b")).unwrap();
    let record_dir = r
        .branches
        .iter()
        .map(|b| b.join(".grove-raif.links"))
        .find(|d| d.is_dir())
        .unwrap();
    let record = fs::read_dir(&record_dir).unwrap().next().unwrap().unwrap();
    let id = record.file_name().to_string_lossy().into_owned();
    let stray_id = "00000000000000aa";
    let copy = fs::read_to_string(record.path())
        .unwrap()
        .replace(&id, stray_id);
    fs::write(record_dir.join(stray_id), copy).unwrap();
    for b in &r.branches {
        fs::hard_link(b.join("a"), b.join("ghost")).unwrap();
    }
    assert!(!r.p("ghost").exists(), "a name with no sidecar shows");
    assert_eq!(fs::read_dir(&r.mnt).unwrap().count(), 2);
    let out = r.run(&["scrub"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("no name points at it"),
        "{}",
        text(&out)
    );
    assert!(
        text(&out).contains("ghost on branch b0: a component with no sidecar"),
        "{}",
        text(&out)
    );
    repair_then_scrub_clean(&r, "raif5");
    assert!(!record_dir.join(stray_id).exists());
    for b in &r.branches {
        assert!(!b.join("ghost").exists());
        assert_eq!(fs::metadata(b.join("a")).unwrap().nlink(), 2);
    }
    for name in ["a", "b"] {
        assert!(fs::read(r.p(name)).unwrap() == data, "{name}");
        assert_eq!(fs::metadata(r.p(name)).unwrap().nlink(), 2);
    }
}

/// Operations of the random hard-link checker.
const LINK_OPERATIONS: usize = 800;
/// Names the random hard-link checker uses, in two directories.
const LINK_CHECK_NAMES: [&str; 6] = ["n0", "n1", "n2", "d/n3", "d/n4", "d/n5"];

/// What the random hard-link checker expects: each name's file, and each
/// file's bytes.
#[derive(Default)]
struct LinkModel {
    names: BTreeMap<&'static str, usize>,
    files: Vec<Vec<u8>>,
}

impl LinkModel {
    fn count(&self, file: usize) -> u64 {
        self.names.values().filter(|&&f| f == file).count() as u64
    }

    /// Every name reads its file's bytes, with its file's count, and the
    /// names of one file share an inode number (and no other file's).
    fn check(&self, r: &Raif, when: &str) {
        let mut inodes: BTreeMap<usize, u64> = BTreeMap::new();
        for (name, &file) in &self.names {
            let m = fs::metadata(r.p(name)).unwrap();
            assert_eq!(m.nlink(), self.count(file), "{when}: nlink of {name}");
            let ino = *inodes.entry(file).or_insert(m.ino());
            assert_eq!(m.ino(), ino, "{when}: ino of {name}");
            assert!(
                fs::read(r.p(name)).unwrap() == self.files[file],
                "{when}: {name} reads other bytes"
            );
        }
        let distinct: std::collections::BTreeSet<u64> = inodes.values().copied().collect();
        assert_eq!(
            distinct.len(),
            inodes.len(),
            "{when}: two files share an inode"
        );
    }
}

/// Random writes, truncates, links, unlinks and renames over a few names
/// against a model where names share files: contents, link counts and
/// inode numbers agree at every step, after a remount, and scrub finds
/// nothing.
#[test]
fn random_link_operations_match_a_model() {
    require_fuse!();
    let r = Raif::new("raif6", 4, "4K");
    fs::create_dir(r.p("d")).unwrap();
    let mut model = LinkModel::default();
    // Links made, and renames onto another name of the same file.
    let (mut linked, mut same_file_renames) = (0, 0);
    let mut rng = random_words(LINK_OPERATIONS, 77);
    for step in 0..LINK_OPERATIONS {
        let x = rng.next().unwrap();
        let pick = |shift: u32| LINK_CHECK_NAMES[((x >> shift) % 6) as usize];
        let (name, other) = (pick(8), pick(16));
        let when = format!("step {step}");
        let errno = |res: std::io::Result<()>| res.err().and_then(|e| e.raw_os_error());
        match x % 10 {
            0..=2 => {
                let offset = (x >> 24) % 60_000;
                let data = pattern(((x >> 40) % 9_000) as usize + 1, x);
                let f = open_or_create(&r.p(name), false);
                f.write_all_at(&data, offset).unwrap();
                let file = *model.names.entry(name).or_insert_with(|| {
                    model.files.push(Vec::new());
                    model.files.len() - 1
                });
                let bytes = &mut model.files[file];
                let end = offset as usize + data.len();
                if bytes.len() < end {
                    bytes.resize(end, 0);
                }
                bytes[offset as usize..end].copy_from_slice(&data);
            }
            3 => {
                let size = (x >> 24) % 60_000;
                if let Some(&file) = model.names.get(name) {
                    let f = OpenOptions::new().write(true).open(r.p(name)).unwrap();
                    f.set_len(size).unwrap();
                    model.files[file].resize(size as usize, 0);
                }
            }
            4..=6 => {
                let got = errno(fs::hard_link(r.p(name), r.p(other)));
                match (
                    model.names.get(name).copied(),
                    model.names.contains_key(other),
                ) {
                    (None, _) => assert_eq!(got, Some(2), "{when}: link of missing {name}"),
                    (Some(_), true) => assert_eq!(got, Some(17), "{when}: onto {other}"),
                    (Some(file), false) => {
                        assert_eq!(got, None, "{when}: link {name} {other}");
                        model.names.insert(other, file);
                        linked += 1;
                    }
                }
            }
            7 => {
                let got = errno(fs::remove_file(r.p(name)));
                let expected = model.names.remove(name).map_or(Some(2), |_| None);
                assert_eq!(got, expected, "{when}: unlink {name}");
            }
            8 => {
                let got = errno(fs::rename(r.p(name), r.p(other)));
                match model.names.get(name).copied() {
                    None => assert_eq!(got, Some(2), "{when}: rename of missing {name}"),
                    Some(file) => {
                        assert_eq!(got, None, "{when}: rename {name} {other}");
                        if model.names.get(other) == Some(&file) {
                            same_file_renames += 1;
                        } else {
                            model.names.remove(name);
                            model.names.insert(other, file);
                        }
                    }
                }
            }
            _ => model.check(&r, &when),
        }
    }
    assert!(
        linked >= 20 && same_file_renames >= 5,
        "too few links ({linked}) or renames between names of one file ({same_file_renames})"
    );
    model.check(&r, "at the end");
    r.unmount();
    r.mount();
    model.check(&r, "after a remount");
    let out = r.run(&["scrub"]);
    assert!(out.status.success(), "{}", text(&out));
    let files = model
        .names
        .values()
        .collect::<std::collections::BTreeSet<_>>();
    assert!(
        text(&out).contains(&format!("scrubbed {} files", files.len())),
        "{}",
        text(&out)
    );
}

/// A write or truncate by anyone but root clears set-user-ID, and
/// set-group-ID where group execute is set, as ext4 does (pjdfstest
/// chmod/12): a write by nobody left 4777 set. Root's writes keep them.
#[test]
fn a_write_by_another_user_clears_set_id_bits() {
    require_fuse!();
    let is_root = rustix::process::geteuid().is_root();
    if !is_root || Command::new("setpriv").arg("--version").output().is_err() {
        if std::env::var_os("GROVE_REQUIRE_TOOLS").is_some() {
            panic!("cannot run: needs root and setpriv");
        }
        eprintln!("SKIP: needs root and setpriv");
        return;
    }
    use std::io::Write;
    let mut r = Raif::new("raif1", 2, "64K");
    r.unmount();
    r.flags.push("--allow-other".into());
    r.mount();
    for dir in [r.dir.path(), r.mnt.as_path()] {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mode = |name: &str| fs::metadata(r.p(name)).unwrap().permissions().mode() & 0o7777;
    let as_nobody = |script: &str| {
        let out = Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "sh",
                "-c",
                script,
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let cases = [
        // (mode before, what nobody does, mode after)
        (0o4777, "echo x >> {}", 0o777),
        (0o6777, "truncate -s 1 {}", 0o777),
        (0o2777, "echo x >> {}", 0o777),
        // Set-group-ID without group execute is mandatory locking: kept.
        (0o2767, "echo x >> {}", 0o2767),
    ];
    for (i, (before, action, after)) in cases.into_iter().enumerate() {
        let name = format!("f{i}");
        fs::write(r.p(&name), b"hello\n").unwrap();
        fs::set_permissions(r.p(&name), fs::Permissions::from_mode(before)).unwrap();
        as_nobody(&action.replace("{}", r.p(&name).to_str().unwrap()));
        assert_eq!(mode(&name), after, "{before:o} after `{action}` by nobody");
    }
    // Root writes keep the bits, as on ext4 (CAP_FSETID).
    fs::set_permissions(r.p("f0"), fs::Permissions::from_mode(0o4777)).unwrap();
    OpenOptions::new()
        .append(true)
        .open(r.p("f0"))
        .unwrap()
        .write_all(b"root\n")
        .unwrap();
    assert_eq!(mode("f0"), 0o4777);
    // And the cleared bits are what the branches keep: after a remount.
    r.unmount();
    r.mount();
    assert_eq!(mode("f1"), 0o777);
}
