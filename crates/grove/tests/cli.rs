//! End-to-end tests of the `grove` binary: each test makes a pool in a
//! temporary directory and runs the real binary against it with --pool.

mod support;
use support::{GroveOnPool, TempPool as Pool};

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;
use tempfile::TempDir;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The default block size of a pool.
const BLOCK_BYTES: u64 = 4 * KIB;
/// Stored size of one file block, in `st_blocks` units.
const STAT_BLOCK_BYTES: u64 = 512;

impl Pool {
    fn run_with_stdin(&self, args: &[&str], input: &[u8]) -> Output {
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The child may refuse before reading all of it; a broken pipe
        // here is its business, and the test checks its exit status. Any
        // other failure to feed it is the test's own, and fails it.
        let fed = child.stdin.take().unwrap().write_all(input);
        if let Err(e) = &fed {
            assert_eq!(
                e.kind(),
                std::io::ErrorKind::BrokenPipe,
                "cannot feed the child its input: {e}"
            );
        }
        child.wait_with_output().unwrap()
    }

    /// Runs a command that must succeed; returns its stdout.
    fn ok(&self, args: &[&str]) -> Vec<u8> {
        expect_success(args, self.run(args))
    }

    fn ok_text(&self, args: &[&str]) -> String {
        String::from_utf8(self.ok(args)).unwrap()
    }

    fn volume(&self, name: &str) -> Value {
        self.list()
            .into_iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no volume {name} in the list"))
    }

    fn info(&self) -> Value {
        serde_json::from_slice(&self.ok(&["info", "--json"])).unwrap()
    }

    fn read(&self, name: &str, offset: u64, length: u64) -> Vec<u8> {
        self.ok(&[
            "read",
            name,
            "--offset",
            &offset.to_string(),
            "--length",
            &length.to_string(),
        ])
    }

    fn store_path(&self) -> PathBuf {
        self.path.join("grove.store")
    }

    /// Everything a refused command must leave alone: the listing, the
    /// pool's space use, and every byte of the store.
    fn snapshot_state(&self) -> (Vec<Value>, Value, Vec<u8>) {
        let list = self.list();
        let mut info = self.info();
        // Free space includes what the host file system has left, which
        // other programs (and this test) change; the store's blocks on the
        // host may move as the file system writes back earlier commands'
        // data (its own extent blocks), while its bytes (compared below) stay.
        info.as_object_mut().unwrap().remove("free_bytes");
        info.as_object_mut()
            .unwrap()
            .remove("store_allocated_bytes");
        // The levels' figures that follow the host's free space.
        let space = info["space"].as_object_mut().unwrap();
        for host_bound in [
            "ceiling_bytes",
            "warn_bytes",
            "prune_bytes",
            "host_available_bytes",
        ] {
            space.remove(host_bound);
        }
        let store = fs::read(self.store_path()).unwrap();
        (list, info, store)
    }

    /// Runs a command that must be refused and change nothing; returns the
    /// error line.
    fn refused(&self, args: &[&str]) -> String {
        self.refused_with_stdin(args, None)
    }

    /// Runs a command line that must be refused as a usage error (exit 2)
    /// and change nothing; returns the error line.
    fn refused_usage(&self, args: &[&str]) -> String {
        self.refused_checked(args, None, expect_usage_line)
    }

    fn refused_with_stdin(&self, args: &[&str], input: Option<&[u8]>) -> String {
        self.refused_checked(args, input, expect_error_line)
    }

    fn refused_checked(
        &self,
        args: &[&str],
        input: Option<&[u8]>,
        expect: fn(&[&str], &Output) -> String,
    ) -> String {
        let before = self.snapshot_state();
        let output = match input {
            Some(input) => self.run_with_stdin(args, input),
            None => self.run(args),
        };
        let line = expect(args, &output);
        let after = self.snapshot_state();
        assert!(before.0 == after.0, "{args:?} changed the volume list");
        assert_eq!(before.1, after.1, "{args:?} changed the pool info");
        assert!(before.2 == after.2, "{args:?} changed the store");
        line
    }
}

fn expect_success(args: &[&str], output: Output) -> Vec<u8> {
    assert!(
        output.status.success(),
        "grove {args:?} failed with {:?}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

/// Checks the error contract: exit code 1 and exactly one stderr line
/// starting with "grove: error:". Returns that line.
fn expect_error_line(args: &[&str], output: &Output) -> String {
    expect_error_line_with_code(args, output, 1)
}

/// The usage error contract: exit code 2, one line "grove: error: …"
/// ending with a pointer to a command's --help. Returns that line.
fn expect_usage_line(args: &[&str], output: &Output) -> String {
    let line = expect_error_line_with_code(args, output, 2);
    assert!(
        line.ends_with(" --help')") && line.contains("(see 'grove"),
        "grove {args:?}: no pointer to --help: {line}"
    );
    line
}

fn expect_error_line_with_code(args: &[&str], output: &Output, code: i32) -> String {
    let stderr = String::from_utf8(output.stderr.clone()).unwrap();
    assert_eq!(
        output.status.code(),
        Some(code),
        "grove {args:?} should fail with exit {code}; stderr: {stderr}"
    );
    assert!(
        stderr.starts_with("grove: error: ") && stderr.ends_with('\n'),
        "grove {args:?}: {stderr:?}"
    );
    assert_eq!(stderr.lines().count(), 1, "grove {args:?}: {stderr:?}");
    stderr.trim_end().to_string()
}

/// Deterministic bytes that never contain a whole zero block.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            // xorshift64
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8 | 1
        })
        .collect()
}

fn write_file(path: &Path, bytes: &[u8]) {
    fs::write(path, bytes).unwrap();
}

fn u64_of(value: &Value, field: &str) -> u64 {
    value[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {value}"))
}

// ---------------------------------------------------------------- happy paths

#[test]
fn init_with_each_block_size() {
    for (args, block_bytes) in [
        (&[][..], 4 * KIB),
        (&["--block-size", "1K"][..], KIB),
        (&["--block-size", "64K"][..], 64 * KIB),
        (
            &["--block-size", "16KiB", "--capacity", "10G"][..],
            16 * KIB,
        ),
    ] {
        let pool = Pool::init(args);
        let info = pool.info();
        assert_eq!(u64_of(&info, "block_size_bytes"), block_bytes, "{args:?}");
        assert_eq!(u64_of(&info, "format_version"), 2);
        assert_eq!(u64_of(&info, "volume_count"), 0);
        assert!(pool.path.join("grove.toml").exists());
        // Volumes work in every block size.
        pool.ok(&["create", "v", "--size", "1M"]);
        let data = pattern(10_000, block_bytes);
        write_file(&pool.file("data"), &data);
        pool.ok(&["write", "v", "--offset", "1000", "data"]);
        assert_eq!(pool.read("v", 1000, data.len() as u64), data, "{args:?}");
    }
}

#[test]
fn capacity_is_reported() {
    let pool = Pool::init(&["--capacity", "1G"]);
    assert_eq!(u64_of(&pool.info(), "capacity_bytes"), GIB);
    // Without --capacity a pool starts at 1 GiB, which auto-extension grows.
    assert_eq!(u64_of(&Pool::init(&[]).info(), "capacity_bytes"), GIB);
    // The capacity is exact to the block, even far below one allocation
    // group (8 GiB at 64K blocks)...
    let pool = Pool::init(&["--block-size", "64K", "--capacity", "1M"]);
    assert_eq!(u64_of(&pool.info(), "capacity_bytes"), MIB);
    // ...and one that is not a whole number of blocks is rounded down, and
    // init says so.
    let pool = Pool::uninitialized();
    let message =
        String::from_utf8(pool.ok(&["init", "--block-size", "64K", "--capacity", "1000K"]))
            .unwrap();
    assert!(message.contains("rounded down"), "{message}");
    assert_eq!(u64_of(&pool.info(), "capacity_bytes"), 15 * 64 * 1024);
}

#[test]
fn write_from_file_and_stdin_then_read_back() {
    let pool = Pool::init(&[]);
    pool.ok(&["create", "disk", "--size", "4M"]);
    let first = pattern(3 * MIB as usize / 2, 1);
    write_file(&pool.file("first"), &first);
    pool.ok(&["write", "disk", "first"]);

    // From a pipe, at an offset with a suffix.
    let piped = pattern(5000, 2);
    let output = pool.run_with_stdin(&["write", "disk", "--offset", "2M"], &piped);
    expect_success(&["write"], output);

    // From stdin redirected from a file, with `-` spelled out.
    let redirected = pattern(700, 3);
    write_file(&pool.file("redirected"), &redirected);
    let output = pool
        .command(&["write", "disk", "--offset", "3000000", "-"])
        .stdin(File::open(pool.file("redirected")).unwrap())
        .output()
        .unwrap();
    expect_success(&["write", "-"], output);

    assert_eq!(pool.read("disk", 0, first.len() as u64), first);
    assert_eq!(pool.read("disk", 2 * MIB, piped.len() as u64), piped);
    assert_eq!(pool.read("disk", 3_000_000, 700), redirected);
    // Reading without --length goes to the end; untouched ranges are zeros.
    let whole = pool.ok(&["read", "disk"]);
    assert_eq!(whole.len() as u64, 4 * MIB);
    assert_eq!(&whole[..first.len()], &first[..]);
    assert!(whole[first.len()..2 * MIB as usize].iter().all(|&b| b == 0));
    let tail = pool.ok(&["read", "disk", "--offset", "4095K"]);
    assert_eq!(tail, vec![0u8; KIB as usize]);
    // A read of nothing at the very end is fine.
    assert!(pool.read("disk", 4 * MIB, 0).is_empty());
}

#[test]
fn snapshot_clone_list_and_tree() {
    let pool = Pool::init(&[]);
    pool.ok(&["create", "base", "--size", "1G"]);
    let original = pattern(MIB as usize, 4);
    write_file(&pool.file("original"), &original);
    pool.ok(&["write", "base", "original"]);
    pool.ok(&["snapshot", "base", "base@1"]);
    pool.ok(&["clone", "base@1", "work"]);
    pool.ok(&["snapshot", "work", "work@1"]);
    pool.ok(&["create", "other", "--size", "64M"]);

    // The clone is writable and diverges; the snapshot keeps the old data.
    let change = pattern(64 * KIB as usize, 5);
    write_file(&pool.file("change"), &change);
    pool.ok(&["write", "work", "change"]);
    assert_eq!(pool.read("work", 0, change.len() as u64), change);
    assert_eq!(pool.read("base@1", 0, MIB), original);
    assert_eq!(pool.read("work@1", 0, MIB), original);
    assert_eq!(pool.read("base", 0, MIB), original);

    let list = pool.list();
    let names: Vec<&str> = list.iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["base", "base@1", "work", "work@1", "other"]);
    let expect = [
        ("base", "volume", None, false),
        ("base@1", "snapshot", Some("base"), true),
        ("work", "clone", Some("base@1"), false),
        ("work@1", "snapshot", Some("work"), true),
        ("other", "volume", None, false),
    ];
    for (volume, (name, kind, parent, read_only)) in list.iter().zip(expect) {
        assert_eq!(volume["name"], name);
        assert_eq!(volume["kind"], kind, "{name}");
        assert_eq!(volume["parent"].as_str(), parent, "{name}");
        assert_eq!(volume["read_only"], read_only, "{name}");
    }
    assert_eq!(u64_of(&list[0], "size_bytes"), GIB);
    assert_eq!(u64_of(&list[4], "size_bytes"), 64 * MIB);
    for volume in &list[..4] {
        assert_eq!(u64_of(volume, "referenced_bytes"), MIB, "{volume}");
    }
    assert_eq!(u64_of(&list[4], "referenced_bytes"), 0);
    // The 64 KiB rewritten in the clone are its own; all else is shared.
    assert_eq!(u64_of(&list[2], "unique_bytes"), 64 * KIB);
    for index in [0, 1, 3, 4] {
        assert_eq!(u64_of(&list[index], "unique_bytes"), 0, "{}", list[index]);
    }
    // Written: the base wrote 1 MiB before its snapshot, which counts it;
    // the clone wrote 64 KiB after its own snapshot, so they are its own.
    assert_eq!(u64_of(&list[0], "written_bytes"), 0);
    assert_eq!(u64_of(&list[1], "written_bytes"), MIB);
    assert_eq!(u64_of(&list[2], "written_bytes"), 64 * KIB);
    assert_eq!(u64_of(&list[3], "written_bytes"), 0);

    // JSON comes on one line, so that scripts can grep it.
    let json = pool.ok_text(&["list", "--json"]);
    assert_eq!(json.lines().count(), 1, "{json}");
    assert!(json.contains(r#""name":"work""#), "{json}");

    let table = pool.ok_text(&["list"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "KIND",
            "PARENT",
            "SIZE",
            "REFERENCED",
            "UNIQUE",
            "WRITTEN"
        ]
    );
    assert!(table.contains("1.0 GiB"), "{table}");
    assert!(table.contains("64.0 KiB"), "{table}");
    assert!(table.contains("0 B"), "{table}");

    let tree = pool.ok_text(&["tree"]);
    let lines: Vec<&str> = tree.lines().collect();
    assert_eq!(lines.len(), 5, "{tree}");
    assert!(lines[0].starts_with("base (volume, 1.0 GiB, "), "{tree}");
    assert!(lines[1].starts_with("└── base@1 (snapshot"), "{tree}");
    assert!(lines[2].starts_with("    └── work (clone"), "{tree}");
    assert!(
        lines[3].starts_with("        └── work@1 (snapshot"),
        "{tree}"
    );
    assert!(lines[4].starts_with("other (volume, 64.0 MiB, "), "{tree}");
    assert!(
        lines[2].contains("referenced 1.0 MiB, unique 64.0 KiB, written 64.0 KiB"),
        "{tree}"
    );
}

#[test]
fn tree_draws_siblings() {
    let pool = Pool::init(&[]);
    pool.ok(&["create", "a", "--size", "1M"]);
    pool.ok(&["snapshot", "a", "a@1"]);
    pool.ok(&["clone", "a@1", "c1"]);
    pool.ok(&["snapshot", "a", "a@2"]);
    let tree = pool.ok_text(&["tree"]);
    let shape: Vec<String> = tree
        .lines()
        .map(|line| line.split(" (").next().unwrap().to_string())
        .collect();
    assert_eq!(shape, ["a", "├── a@1", "│   └── c1", "└── a@2"], "{tree}");
}

#[test]
fn rm_rename_and_resize() {
    let pool = Pool::init(&[]);
    pool.ok(&["create", "disk", "--size", "1M"]);
    let data = pattern(MIB as usize, 6);
    write_file(&pool.file("data"), &data);
    pool.ok(&["write", "disk", "data"]);
    pool.ok(&["snapshot", "disk", "disk@1"]);
    pool.ok(&["clone", "disk@1", "leaf"]);
    let leaf_data = pattern(8 * KIB as usize, 7);
    write_file(&pool.file("leaf_data"), &leaf_data);
    pool.ok(&["write", "leaf", "leaf_data"]);

    // Removing a leaf frees what only it held.
    let used_before = u64_of(&pool.info(), "used_bytes");
    let message = pool.ok_text(&["rm", "leaf"]);
    assert!(message.contains("removed clone \"leaf\""), "{message}");
    assert!(message.contains("it gives back 8.0 KiB"), "{message}");
    assert!(u64_of(&pool.info(), "used_bytes") < used_before);
    let names: Vec<Value> = pool.list().iter().map(|v| v["name"].clone()).collect();
    assert_eq!(names, ["disk", "disk@1"]);

    // Removing an interior volume re-parents its snapshot.
    pool.ok(&["clone", "disk", "disk2"]);
    pool.ok(&["rm", "disk"]);
    assert!(pool.volume("disk@1")["parent"].is_null());
    assert_eq!(pool.read("disk@1", 0, MIB), data);
    assert_eq!(pool.read("disk2", 0, MIB), data);

    pool.ok(&["rename", "disk2", "renamed"]);
    assert_eq!(pool.read("renamed", 0, MIB), data);
    assert_eq!(pool.volume("renamed")["kind"], "clone");

    // Grow: the old data stays, the new range reads as zeros.
    pool.ok(&["resize", "renamed", "3M"]);
    assert_eq!(u64_of(&pool.volume("renamed"), "size_bytes"), 3 * MIB);
    assert_eq!(pool.read("renamed", 0, MIB), data);
    assert_eq!(
        pool.read("renamed", MIB, 2 * MIB),
        vec![0u8; 2 * MIB as usize]
    );
    // Shrinking needs --force, and without it says how much data it drops:
    // the last 512 KiB of the 1 MiB written (the grown 2 MiB are holes).
    let line = pool.refused(&["resize", "renamed", "512K"]);
    assert!(
        line.contains("512.0 KiB of data") && line.contains("--force"),
        "{line}"
    );
    // A hole-only tail is refused too: shrinking is not undone by growing.
    let line = pool.refused(&["resize", "renamed", "2M"]);
    assert!(
        line.contains("no mapped data") && line.contains("--force"),
        "{line}"
    );
    // Shrink: the end moves in and the rest is kept.
    pool.ok(&["resize", "renamed", "512K", "--force"]);
    assert_eq!(u64_of(&pool.volume("renamed"), "size_bytes"), 512 * KIB);
    assert_eq!(pool.ok(&["read", "renamed"]), &data[..512 * KIB as usize]);
    // Growing back does not bring the dropped data back.
    pool.ok(&["resize", "renamed", "1M"]);
    assert_eq!(
        pool.read("renamed", 512 * KIB, 512 * KIB),
        vec![0u8; 512 * KIB as usize]
    );
}

/// The lifecycle from the issue that made grove leak: snapshot, remove the
/// snapshot, keep writing. Space must come back every cycle.
#[test]
fn rolling_snapshots_give_their_space_back() {
    let pool = Pool::init(&[]);
    pool.ok(&["create", "v", "--size", "128M"]);
    let data = pattern(64 * MIB as usize, 11);
    write_file(&pool.file("data"), &data);
    for cycle in 0..5 {
        pool.ok(&["snapshot", "v", "s"]);
        let message = pool.ok_text(&["rm", "s"]);
        assert!(message.contains("removed snapshot \"s\""), "{message}");
        pool.ok(&["write", "v", "data"]);
        let info = pool.info();
        let used = u64_of(&info, "used_bytes");
        let referenced = u64_of(&info, "referenced_bytes");
        assert_eq!(referenced, 64 * MIB, "cycle {cycle}");
        assert_eq!(u64_of(&info, "pending_free_bytes"), 0, "cycle {cycle}");
        // Data plus its metadata: well within 2% and a few MiB.
        assert!(
            used <= referenced + referenced / 50 + 4 * MIB,
            "cycle {cycle}: {used} used for {referenced} referenced"
        );
    }
    assert!(pool.ok_text(&["check"]).contains("clean"));
    assert!(!pool.ok_text(&["check"]).contains("leaked"));
}

#[test]
fn rm_recursive_rollback_diff_and_gc() {
    let pool = Pool::init(&[]);
    pool.ok(&["create", "disk", "--size", "16M"]);
    let first = pattern(MIB as usize, 21);
    write_file(&pool.file("first"), &first);
    pool.ok(&["write", "disk", "first"]);
    pool.ok(&["snapshot", "disk", "disk@1"]);
    let second = pattern(64 * KIB as usize, 22);
    write_file(&pool.file("second"), &second);
    pool.ok(&["write", "disk", "--offset", "4M", "second"]);

    // diff: the 64 KiB written at 4 MiB, as data.
    let diff: Value =
        serde_json::from_slice(&pool.ok(&["diff", "disk@1", "disk", "--json"])).unwrap();
    let extents = diff["extents"].as_array().unwrap();
    assert_eq!(extents.len(), 1, "{diff}");
    assert_eq!(u64_of(&extents[0], "offset_bytes"), 4 * MIB);
    assert_eq!(u64_of(&extents[0], "length_bytes"), 64 * KIB);
    assert_eq!(extents[0]["data"], true);
    let table = pool.ok_text(&["diff", "disk@1", "disk"]);
    assert!(table.contains("64.0 KiB of new data"), "{table}");
    assert!(
        table.contains("in 1 extent") && !table.contains("1 extents"),
        "{table}"
    );
    assert!(!table.contains("its size"), "{table}");
    // A size change is said, not only seen in the JSON's two sizes.
    pool.ok(&["clone", "disk@1", "bigger"]);
    pool.ok(&["resize", "bigger", "32M"]);
    let table = pool.ok_text(&["diff", "disk@1", "bigger"]);
    assert!(
        table.contains("its size grew from 16.0 MiB to 32.0 MiB"),
        "{table}"
    );
    pool.ok(&["rm", "bigger"]);

    // rollback: back to the snapshot, in place.
    let message = pool.ok_text(&["rollback", "disk@1"]);
    assert!(
        message.contains("rolled \"disk\" back to \"disk@1\""),
        "{message}"
    );
    assert_eq!(
        pool.read("disk", 4 * MIB, 64 * KIB),
        vec![0u8; 64 * KIB as usize]
    );
    assert_eq!(pool.read("disk", 0, MIB), first);
    let diff: Value =
        serde_json::from_slice(&pool.ok(&["diff", "disk@1", "disk", "--json"])).unwrap();
    assert!(diff["extents"].as_array().unwrap().is_empty(), "{diff}");
    let line = pool.refused(&["rollback", "disk@1", "disk@1"]);
    assert!(line.contains("read-only"), "{line}");

    // rm --recursive: a subtree goes, the rest stays.
    pool.ok(&["clone", "disk@1", "work"]);
    pool.ok(&["snapshot", "work", "work@1"]);
    let message = pool.ok_text(&["rm", "--recursive", "disk@1"]);
    assert!(
        message.contains("and everything taken from it"),
        "{message}"
    );
    let names: Vec<Value> = pool.list().iter().map(|v| v["name"].clone()).collect();
    assert_eq!(names, ["disk"]);
    assert_eq!(pool.read("disk", 0, MIB), first);

    // Nothing is pending after a command that removes: the CLI reclaims.
    assert_eq!(u64_of(&pool.info(), "pending_free_bytes"), 0);
    let message = pool.ok_text(&["gc", "--wait"]);
    assert!(message.contains("nothing is left"), "{message}");
    let report = pool.ok_text(&["check"]);
    assert!(
        report.contains("clean") && !report.contains("leaked"),
        "{report}"
    );

    // Help says what the new commands do.
    for command in ["rollback", "diff", "gc", "rm"] {
        let help = pool.ok_text(&[command, "--help"]);
        assert!(help.contains("Example"), "{command}: {help}");
    }
}

/// Every live volume's name and bytes.
fn every_volume(pool: &Pool) -> Vec<(String, Vec<u8>)> {
    pool.list()
        .iter()
        .map(|v| {
            let name = v["name"].as_str().unwrap().to_string();
            let bytes = pool.ok(&["read", &name]);
            (name, bytes)
        })
        .collect()
}

/// Issue 23: `grove rollback test`, where `test` was a clone whose origin
/// snapshot had been removed, reset the snapshot's volume to the clone's
/// contents, and its newer writes were gone. Named alone, only a snapshot
/// is taken; everything else needs both names.
#[test]
fn rollback_named_alone_takes_only_a_snapshot() {
    let pool = Pool::init(&[]);
    pool.ok(&["create", "disk", "--size", "1M"]);
    write_file(&pool.file("first"), &pattern(MIB as usize, 81));
    pool.ok(&["write", "disk", "first"]);
    pool.ok(&["snapshot", "disk", "disk@1"]);
    pool.ok(&["clone", "disk@1", "test"]);
    pool.ok(&["snapshot", "disk@1", "disk@1-copy"]);
    write_file(&pool.file("clone"), &pattern(64 * KIB as usize, 82));
    pool.ok(&["write", "test", "clone"]);
    // disk's writes after the snapshot: what the old rollback lost.
    write_file(&pool.file("newer"), &pattern(64 * KIB as usize, 83));
    pool.ok(&["write", "disk", "--offset", "512K", "newer"]);
    let before = every_volume(&pool);

    // A clone named alone, its origin still there: refused, naming only
    // what was named.
    let line = pool.refused(&["rollback", "test"]);
    assert!(
        line.contains("\"test\"") && line.contains("writable clone, not a snapshot"),
        "{line}"
    );
    assert!(line.contains("grove rollback test VOLUME"), "{line}");
    assert!(!line.contains("disk"), "{line}");
    // A snapshot of a snapshot: the snapshot it was taken from is said.
    let line = pool.refused(&["rollback", "disk@1-copy"]);
    assert!(
        line.contains("taken from \"disk@1\", a read-only snapshot"),
        "{line}"
    );
    // The clone's origin removed: still refused, and nothing changes.
    pool.ok(&["rm", "disk@1-copy"]);
    pool.ok(&["rm", "disk@1"]);
    let before_removed: Vec<_> = before
        .iter()
        .filter(|(name, _)| name == "disk" || name == "test")
        .cloned()
        .collect();
    assert_eq!(every_volume(&pool), before_removed);
    let line = pool.refused(&["rollback", "test"]);
    assert!(
        line.contains("not a snapshot") && !line.contains("disk"),
        "{line}"
    );
    assert_eq!(every_volume(&pool), before_removed);

    // Both names written out: disk takes the clone's contents.
    let message = pool.ok_text(&["rollback", "test", "disk"]);
    assert!(
        message.contains("rolled \"disk\" back to \"test\""),
        "{message}"
    );
    let test = pool.read("test", 0, MIB);
    assert_eq!(pool.read("disk", 0, MIB), test);
    assert_eq!(every_volume(&pool)[1], before_removed[1]);
    let report = pool.ok_text(&["check"]);
    assert!(report.contains("the pool is clean"), "{report}");
}

#[test]
fn info_reports_the_pool() {
    let pool = Pool::init(&["--block-size", "8K"]);
    pool.ok(&["create", "v", "--size", "1G"]);
    let info = pool.info();
    assert_eq!(info["path"].as_str().unwrap(), pool.path.to_str().unwrap());
    assert_eq!(u64_of(&info, "block_size_bytes"), 8 * KIB);
    assert_eq!(u64_of(&info, "volume_count"), 1);
    let used = u64_of(&info, "used_bytes");
    assert!(u64_of(&info, "metadata_bytes") <= used);
    assert!(used <= u64_of(&info, "store_bytes"));
    assert!(u64_of(&info, "free_bytes") > 0);

    let text = pool.ok_text(&["info"]);
    for field in [
        "pool",
        "format version",
        "block size",
        "volumes",
        "store size",
        "used",
        "metadata",
        "free",
        "capacity",
    ] {
        assert!(
            text.lines().any(|line| line.starts_with(field)),
            "{field} missing from:\n{text}"
        );
    }
    assert!(text.contains("8.0 KiB"), "{text}");
}

/// Freed blocks are punched out of the store file: what it takes on the
/// host drops with `used` when a snapshot holding unique data goes.
#[test]
fn info_shows_the_store_allocated_on_the_host_and_rm_gives_it_back() {
    const UNIQUE_BYTES: u64 = 32 * MIB;
    let pool = Pool::init(&[]);
    pool.ok(&["create", "disk", "--size", "64M"]);
    write_file(&pool.file("old"), &pattern(UNIQUE_BYTES as usize, 21));
    write_file(&pool.file("new"), &pattern(UNIQUE_BYTES as usize, 22));
    pool.ok(&["write", "disk", "old"]);
    pool.ok(&["snapshot", "disk", "disk@1"]);
    pool.ok(&["write", "disk", "new"]);
    let before = pool.info();
    let allocated_before = u64_of(&before, "store_allocated_bytes");
    assert!(allocated_before >= 2 * UNIQUE_BYTES, "{before}");
    let text = pool.ok_text(&["info"]);
    assert!(
        text.lines()
            .any(|line| line.starts_with("allocated on host")),
        "{text}"
    );

    pool.ok(&["rm", "disk@1"]);
    let after = pool.info();
    let allocated_after = u64_of(&after, "store_allocated_bytes");
    assert!(
        allocated_before - allocated_after >= UNIQUE_BYTES,
        "{allocated_before} -> {allocated_after}"
    );
    assert!(u64_of(&before, "used_bytes") - u64_of(&after, "used_bytes") >= UNIQUE_BYTES);
    let disk = pool.ok(&["read", "disk", "--length", "32M"]);
    assert!(
        disk == pattern(UNIQUE_BYTES as usize, 22),
        "the live data changed"
    );
}

#[test]
fn pool_comes_from_env_then_default() {
    let dir = TempDir::new().unwrap();
    let grove = || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_grove"));
        command.current_dir(dir.path()).env_remove("GROVE_POOL");
        command
    };
    let from_env = dir.path().join("from-env");
    let status = grove()
        .env("GROVE_POOL", &from_env)
        .arg("init")
        .output()
        .unwrap();
    assert!(status.status.success());
    assert!(from_env.join("grove.toml").exists());
    // An empty $GROVE_POOL counts as unset.
    let status = grove().env("GROVE_POOL", "").arg("init").output().unwrap();
    assert!(status.status.success());
    assert!(dir.path().join("grove-pool").join("grove.toml").exists());
    let status = grove()
        .args(["create", "v", "--size", "1M"])
        .output()
        .unwrap();
    assert!(status.status.success());
    // --pool wins over the environment.
    let output = grove()
        .env("GROVE_POOL", &from_env)
        .args(["--pool", "grove-pool", "info", "--json"])
        .output()
        .unwrap();
    let info: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(info["path"].as_str().unwrap().ends_with("grove-pool"));
}

// ------------------------------------------------------------ import, export

#[test]
fn import_export_sparse_image() {
    import_export_sparse_image_with("4K", 4 * KIB);
}

/// Volume blocks larger than the file system's: the holes SEEK_DATA finds
/// inside one volume block must not split it.
#[test]
fn import_export_sparse_image_with_64k_blocks() {
    import_export_sparse_image_with("64K", 64 * KIB);
}

fn import_export_sparse_image_with(block_size: &str, block_bytes: u64) {
    let pool = Pool::init(&["--block-size", block_size]);
    let image_bytes = 64 * MIB;
    let image = pool.file("image.raw");
    let file = File::create(&image).unwrap();
    file.set_len(image_bytes).unwrap();
    // Scattered data: unaligned, block-aligned, spanning chunks, two pieces
    // in one 64 KiB block with a hole between them, and at the very end.
    let pieces = [
        (0, 4096),
        (10 * MIB + 123, 10_000),
        (MIB - 2048, 4096),
        (20 * MIB, 4096),
        (20 * MIB + 32 * KIB, 4096),
        (33 * MIB, MIB as usize),
        (image_bytes - 4096, 4096),
    ];
    let mut written_bytes = 0;
    for (index, (offset, len)) in pieces.iter().enumerate() {
        file.write_all_at(&pattern(*len, 10 + index as u64), *offset)
            .unwrap();
        written_bytes += *len as u64;
    }
    // Zeros that were written (not a hole) still take no space in the volume.
    file.write_all_at(&vec![0u8; MIB as usize], 40 * MIB)
        .unwrap();
    drop(file);

    pool.ok(&["import", "img", image.to_str().unwrap()]);
    let volume = pool.volume("img");
    assert_eq!(u64_of(&volume, "size_bytes"), image_bytes);
    // Only the blocks holding data were written: each piece may touch one
    // partial block at either end.
    let referenced = u64_of(&volume, "referenced_bytes");
    let slack = pieces.len() as u64 * 2 * block_bytes;
    assert!(
        referenced >= written_bytes && referenced <= written_bytes + slack,
        "referenced {referenced} for {written_bytes} written"
    );

    let exported = pool.file("exported.raw");
    pool.ok(&["export", "img", exported.to_str().unwrap()]);
    assert!(fs::read(&exported).unwrap() == fs::read(&image).unwrap());
    let metadata = fs::metadata(&exported).unwrap();
    assert_eq!(metadata.len(), image_bytes);
    let stored = metadata.blocks() * STAT_BLOCK_BYTES;
    assert!(
        stored < 4 * MIB,
        "exported image stores {stored} bytes for {written_bytes} of data"
    );

    // Export overwrites (truncates) an existing file only with --force.
    pool.ok(&["create", "small", "--size", "4K"]);
    pool.ok(&["export", "small", exported.to_str().unwrap(), "--force"]);
    assert_eq!(fs::read(&exported).unwrap(), vec![0u8; 4096]);
}

/// Issue 23: `export` silently overwrote an existing file. Now it refuses
/// in one line naming the file, and --force overwrites; a pipe or
/// /dev/stdout still works without it, with every byte in order.
#[test]
fn export_refuses_to_overwrite_without_force() {
    let pool = Pool::init(&[]);
    pool.ok(&["create", "v", "--size", "64K"]);
    let data = pattern(8 * KIB as usize, 91);
    write_file(&pool.file("data"), &data);
    pool.ok(&["write", "v", "--offset", "16K", "data"]);
    let mut image = vec![0u8; 64 * KIB as usize];
    image[16 * KIB as usize..24 * KIB as usize].copy_from_slice(&data);

    let precious = pool.file("precious.img");
    write_file(&precious, b"someone's image");
    let line = pool.refused(&["export", "v", "precious.img"]);
    assert!(
        line.contains("precious.img already exists (15 B)") && line.contains("--force"),
        "{line}"
    );
    assert_eq!(fs::read(&precious).unwrap(), b"someone's image");
    // A directory is refused as such, even with --force.
    fs::create_dir(pool.file("dir")).unwrap();
    let line = pool.refused(&["export", "v", "dir", "--force"]);
    assert!(line.contains("is a directory"), "{line}");

    let message = pool.ok_text(&["export", "v", "precious.img", "--force"]);
    assert!(message.contains("exported \"v\""), "{message}");
    assert!(fs::read(&precious).unwrap() == image);
    // A new file needs no --force.
    pool.ok(&["export", "v", "new.img"]);
    assert!(fs::read(pool.file("new.img")).unwrap() == image);

    // /dev/stdout (a pipe here): the image alone on stdout, the report
    // on stderr.
    let output = pool.run(&["export", "v", "/dev/stdout"]);
    assert!(output.status.success(), "{output:?}");
    assert!(output.stdout == image, "stdout is not the image");
    let report = String::from_utf8(output.stderr).unwrap();
    assert!(report.contains("exported \"v\" to /dev/stdout"), "{report}");
    // `> file`: the shell made the file the user chose; no --force needed.
    let redirected = pool.file("redirected.img");
    let status = pool
        .command(&["export", "v", "/dev/stdout"])
        .stdout(File::create(&redirected).unwrap())
        .status()
        .unwrap();
    assert!(status.success());
    assert!(fs::read(&redirected).unwrap() == image);
}

#[test]
fn import_rounds_up_to_a_sector() {
    let pool = Pool::init(&["--block-size", "1K"]);
    let data = pattern(1000, 20);
    write_file(&pool.file("odd"), &data);
    pool.ok(&["import", "odd", "odd"]);
    assert_eq!(u64_of(&pool.volume("odd"), "size_bytes"), 1024);
    let mut expected = data.clone();
    expected.resize(1024, 0);
    assert_eq!(pool.ok(&["read", "odd"]), expected);
    pool.ok(&["export", "odd", "odd.out"]);
    assert_eq!(fs::read(pool.file("odd.out")).unwrap(), expected);
}

#[test]
fn failed_import_leaves_no_volume() {
    let pool = Pool::init(&[]);
    // A directory opens, but reading it fails once the volume exists: the
    // half-made volume must go again.
    let directory = pool.file("a-directory");
    fs::create_dir(&directory).unwrap();
    let args = ["import", "half", directory.to_str().unwrap()];
    let line = expect_error_line(&args, &pool.run(&args));
    assert!(line.contains("cannot import"), "{line}");
    assert!(line.contains("removed"), "{line}");
    assert!(pool.list().is_empty());
    write_file(&pool.file("good"), &pattern(4096, 21));
    pool.ok(&["import", "half", "good"]);

    // A missing file and an empty file are refused before anything is made.
    let line = pool.refused(&["import", "x", "no-such-file"]);
    assert!(line.contains("no-such-file"), "{line}");
    write_file(&pool.file("empty"), b"");
    let line = pool.refused(&["import", "x", "empty"]);
    assert!(line.contains("invalid volume size 0"), "{line}");
}

#[test]
fn snapshot_of_a_big_volume_takes_no_space() {
    let pool = Pool::init(&[]);
    pool.ok(&["create", "big", "--size", "10G"]);
    let data = pattern(32 * MIB as usize, 30);
    write_file(&pool.file("data"), &data);
    pool.ok(&["write", "big", "--offset", "5G", "data"]);
    let used_before = u64_of(&pool.info(), "used_bytes");
    pool.ok(&["snapshot", "big", "big@1"]);
    let used_after = u64_of(&pool.info(), "used_bytes");
    assert!(
        used_after <= used_before + 2 * BLOCK_BYTES,
        "a snapshot took {} bytes",
        used_after - used_before
    );
    let snapshot = pool.volume("big@1");
    assert_eq!(u64_of(&snapshot, "unique_bytes"), 0);
    assert_eq!(u64_of(&snapshot, "referenced_bytes"), 32 * MIB);
    assert_eq!(
        pool.read("big@1", 5 * GIB + 12345, 1000),
        &data[12345..13345]
    );
}

// ---------------------------------------------------------------- bad input

#[test]
fn unknown_volume_is_refused() {
    let pool = Pool::init(&[]);
    pool.ok(&["create", "v", "--size", "1M"]);
    write_file(&pool.file("data"), b"data");
    for args in [
        &["read", "nope"][..],
        &["write", "nope", "data"],
        &["snapshot", "nope", "s"],
        &["clone", "nope", "c"],
        &["rm", "nope"],
        &["resize", "nope", "1M"],
        &["rename", "nope", "other"],
        &["export", "nope", "out.raw"],
    ] {
        let line = pool.refused(args);
        assert!(line.contains("\"nope\""), "{args:?}: {line}");
    }
    // A failed export does not create (or truncate) its file.
    assert!(!pool.file("out.raw").exists());
}

#[test]
fn duplicate_name_is_refused() {
    let pool = Pool::init(&[]);
    pool.ok(&["create", "v", "--size", "1M"]);
    pool.ok(&["create", "w", "--size", "1M"]);
    write_file(&pool.file("image"), &pattern(4096, 40));
    for args in [
        &["create", "v", "--size", "1M"][..],
        &["snapshot", "w", "v"],
        &["clone", "w", "v"],
        &["rename", "w", "v"],
        &["import", "v", "image"],
    ] {
        let line = pool.refused(args);
        assert!(line.contains("already exists"), "{args:?}: {line}");
    }
}

#[test]
fn read_only_snapshot_is_refused() {
    let pool = Pool::init(&[]);
    pool.ok(&["create", "v", "--size", "1M"]);
    pool.ok(&["snapshot", "v", "v@1"]);
    write_file(&pool.file("data"), &pattern(4096, 50));
    let line = pool.refused(&["write", "v@1", "data"]);
    assert!(line.contains("read-only"), "{line}");
    let line = pool.refused_with_stdin(&["write", "v@1"], Some(b"hello"));
    assert!(line.contains("read-only"), "{line}");
    let line = pool.refused(&["resize", "v@1", "2M"]);
    assert!(line.contains("read-only"), "{line}");
}

#[test]
fn io_past_the_end_is_refused() {
    let pool = Pool::init(&[]);
    pool.ok(&["create", "v", "--size", "1M"]);
    write_file(&pool.file("4k"), &pattern(4096, 60));
    write_file(&pool.file("2m"), &pattern(2 * MIB as usize, 61));
    for args in [
        &["read", "v", "--offset", "1M", "--length", "1"][..],
        &["read", "v", "--offset", "1020K", "--length", "8K"],
        &["read", "v", "--length", "2M"],
        &["read", "v", "--offset", "2M"],
        &[
            "read",
            "v",
            "--offset",
            "18446744073709551615",
            "--length",
            "2",
        ],
        &["write", "v", "--offset", "1022K", "4k"],
        &["write", "v", "--offset", "2M", "4k"],
        &["write", "v", "2m"],
    ] {
        let line = pool.refused(args);
        assert!(line.contains("past the end"), "{args:?}: {line}");
    }
    // From a pipe, whose length is only known as it arrives.
    let line = pool.refused_with_stdin(
        &["write", "v", "--offset", "1023K"],
        Some(&pattern(4096, 62)),
    );
    assert!(line.contains("past the end"), "{line}");
}

#[test]
fn bad_volume_sizes_are_refused() {
    let pool = Pool::init(&[]);
    pool.ok(&["create", "v", "--size", "1M"]);
    for (args, reason) in [
        (&["create", "x", "--size", "0"][..], "invalid volume size 0"),
        (&["create", "x", "--size", "1000"], "multiple of 512"),
        (&["create", "x", "--size", "1.25K"], "multiple of 512"),
        (&["resize", "v", "0"], "invalid volume size 0"),
        (&["resize", "v", "513"], "multiple of 512"),
    ] {
        let line = pool.refused(args);
        assert!(line.contains(reason), "{args:?}: {line}");
    }
    // A size whose text cannot be read is a usage error.
    let line = pool.refused_usage(&["create", "x", "--size", "100P"]);
    assert!(line.contains("invalid size"), "{line}");
}

#[test]
fn bad_size_strings_are_refused() {
    let pool = Pool::init(&[]);
    pool.ok(&["create", "v", "--size", "1M"]);
    write_file(&pool.file("data"), b"data");
    for text in [
        "abc",
        "10X",
        "1.1G",
        "",
        "1..2K",
        "4 K B",
        "99999999999T",
        "0x10",
    ] {
        for args in [
            &["create", "x", "--size", text][..],
            &["resize", "v", text],
            &["read", "v", "--offset", text],
            &["read", "v", "--length", text],
            &["write", "v", "--offset", text, "data"],
        ] {
            let line = pool.refused_usage(args);
            assert!(line.contains("invalid "), "{args:?}: {line}");
        }
    }
    // A negative number glued to its flag, or not.
    let line = pool.refused_usage(&["create", "x", "--size=-5"]);
    assert!(line.contains("invalid size \"-5\""), "{line}");
}

/// Issue 23: `--size -5G` and `--offset -1` got clap's multi-line usage
/// error (a leading '-' read as a flag); every size, offset and length now
/// gets grove's one line, naming the argument and the value.
#[test]
fn negative_sizes_and_offsets_get_one_line() {
    let pool = Pool::init(&[]);
    pool.ok(&["create", "v", "--size", "1M"]);
    write_file(&pool.file("data"), b"data");
    for (args, what) in [
        (&["create", "x", "--size", "-5G"][..], "size \"-5G\""),
        (&["resize", "v", "-5G"], "size \"-5G\""),
        (&["read", "v", "--offset", "-1"], "offset \"-1\""),
        (&["read", "v", "--length", "-1"], "length \"-1\""),
        (&["write", "v", "--offset", "-1", "data"], "offset \"-1\""),
        (&["write", "v", "data", "--offset", "-4K"], "offset \"-4K\""),
    ] {
        let line = pool.refused_usage(args);
        assert!(
            line.contains(&format!("invalid {what}")) && line.contains("cannot be negative"),
            "{args:?}: {line}"
        );
    }
    for args in [
        &["init", "--block-size", "-4K"][..],
        &["init", "--capacity", "-1G"],
    ] {
        let fresh = Pool::uninitialized();
        let line = expect_usage_line(args, &fresh.run(args));
        assert!(line.contains("cannot be negative"), "{args:?}: {line}");
        assert!(!fresh.path.exists(), "{args:?} made a pool");
    }
    // Help still works after a size argument.
    assert!(pool.ok_text(&["resize", "v", "--help"]).contains("Usage"));
}

#[test]
fn bad_block_size_is_refused() {
    for text in ["3K", "128K", "512", "0", "abc", "4Q"] {
        let pool = Pool::uninitialized();
        let output = pool.run(&["init", "--block-size", text]);
        // Text that is no size at all is a usage error; a size the pool
        // cannot take is refused as any other error.
        let line = if text.ends_with(|c: char| c.is_ascii_digit() || c == 'K') {
            expect_error_line(&["init", text], &output)
        } else {
            expect_usage_line(&["init", text], &output)
        };
        assert!(line.contains("block size"), "{text}: {line}");
        assert!(
            !pool.path.exists(),
            "init --block-size {text} made a directory"
        );
    }
    let pool = Pool::uninitialized();
    let output = pool.run(&["init", "--capacity", "lots"]);
    expect_usage_line(&["init", "--capacity"], &output);
    assert!(!pool.path.exists());
}

#[test]
fn init_over_a_pool_is_refused() {
    let pool = Pool::init(&[]);
    pool.ok(&["create", "v", "--size", "1M"]);
    let store = fs::read(pool.store_path()).unwrap();
    let config = fs::read(pool.path.join("grove.toml")).unwrap();
    let line = expect_error_line(&["init"], &pool.run(&["init"]));
    assert!(line.contains("already exists"), "{line}");
    let line = expect_error_line(
        &["init", "--block-size", "64K"],
        &pool.run(&["init", "--block-size", "64K"]),
    );
    assert!(line.contains("already exists"), "{line}");
    // init never opens the pool, so not even a superblock was rewritten.
    assert_eq!(fs::read(pool.store_path()).unwrap(), store);
    assert_eq!(fs::read(pool.path.join("grove.toml")).unwrap(), config);
    assert_eq!(pool.list().len(), 1);
}

#[test]
fn missing_pool_is_refused() {
    let pool = Pool::uninitialized();
    for args in [&["list"][..], &["info"], &["create", "v", "--size", "1M"]] {
        let line = expect_error_line(args, &pool.run(args));
        assert!(line.contains("does not exist"), "{args:?}: {line}");
        assert!(!pool.path.exists(), "{args:?} made the pool directory");
    }
}

#[test]
fn directory_that_is_not_a_pool_is_refused() {
    let pool = Pool::uninitialized();
    fs::create_dir(&pool.path).unwrap();
    fs::write(pool.path.join("unrelated"), b"keep me").unwrap();
    for args in [&["list"][..], &["create", "v", "--size", "1M"], &["tree"]] {
        let line = expect_error_line(args, &pool.run(args));
        assert!(line.contains("not a grove pool"), "{args:?}: {line}");
    }
    let entries: Vec<_> = fs::read_dir(&pool.path).unwrap().collect();
    assert_eq!(entries.len(), 1);
    assert_eq!(fs::read(pool.path.join("unrelated")).unwrap(), b"keep me");
}

#[test]
fn newer_format_version_is_refused() {
    let pool = Pool::init(&[]);
    pool.ok(&["create", "v", "--size", "1M"]);
    let config_path = pool.path.join("grove.toml");
    let config = fs::read_to_string(&config_path).unwrap();
    assert!(config.contains("format_version = 2\n"), "{config}");
    let newer = config.replace("format_version = 2\n", "format_version = 99\n");
    fs::write(&config_path, &newer).unwrap();
    let store = fs::read(pool.store_path()).unwrap();
    for args in [&["list"][..], &["create", "w", "--size", "1M"], &["info"]] {
        let line = expect_error_line(args, &pool.run(args));
        assert!(line.contains("99"), "{args:?}: {line}");
    }
    assert_eq!(fs::read(pool.store_path()).unwrap(), store);
    assert_eq!(fs::read_to_string(&config_path).unwrap(), newer);
}

/// Issue 23: unknown keys in grove.toml (`cache-size = "1G"`) were
/// silently ignored. Now every command refuses the pool in one line that
/// names the key, the file, and the near-miss it probably meant.
#[test]
fn unknown_config_keys_are_refused() {
    let pool = Pool::init(&[]);
    pool.ok(&["create", "v", "--size", "1M"]);
    let config_path = pool.path.join("grove.toml");
    let config = fs::read_to_string(&config_path).unwrap();
    let store = fs::read(pool.store_path()).unwrap();
    for (extra, says) in [
        (
            "cache-size = \"1G\"\n",
            "unknown setting \"cache-size\" (did you mean cache_size?)",
        ),
        (
            "compression = true\n",
            "unknown setting \"compression\" (known settings: format_version, store, cache_size, space, retention, branches, archive, rados)",
        ),
    ] {
        fs::write(&config_path, format!("{config}{extra}")).unwrap();
        for args in [&["list"][..], &["info"], &["check"]] {
            let line = expect_error_line(args, &pool.run(args));
            assert!(
                line.contains(&config_path.display().to_string()) && line.contains(says),
                "{args:?}: {line}"
            );
        }
    }
    assert_eq!(fs::read(pool.store_path()).unwrap(), store);
    // The right spelling is taken.
    fs::write(&config_path, format!("{config}cache_size = \"1G\"\n")).unwrap();
    assert_eq!(pool.list().len(), 1);
}

/// A superblock that passes its checksum but holds an impossible field
/// (issue 23: a journal sequence near 2^64 was accepted and writes were
/// lost; a capacity of one block passed `check`) is refused by every
/// command with one line naming the field and its value, and nothing is
/// written to the store.
#[test]
fn crafted_superblock_fields_are_refused() {
    use grove_store::format::superblock::{Superblock, SUPERBLOCK_LEN};
    const CRC_OFFSET: usize = 12;
    const CAPACITY_OFFSET: usize = 72;
    const JOURNAL_SEQUENCE_OFFSET: usize = 104;
    let pool = Pool::init(&[]);
    pool.ok(&["create", "v", "--size", "1M"]);
    let pristine = fs::read(pool.store_path()).unwrap();
    let slot0 = Superblock::decode(&pristine[..SUPERBLOCK_LEN]).unwrap();
    let block = slot0.block_size_bytes as usize;
    let slot1 = Superblock::decode(&pristine[block..block + SUPERBLOCK_LEN]).unwrap();
    let current = if slot0.generation > slot1.generation {
        0
    } else {
        block
    };
    let crafted = |offset: usize, value: u64| {
        let mut image = pristine.clone();
        let superblock = &mut image[current..current + SUPERBLOCK_LEN];
        superblock[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
        superblock[CRC_OFFSET..CRC_OFFSET + 4].fill(0);
        let crc = crc32c::crc32c(superblock);
        superblock[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
        image
    };
    let cases = [
        (JOURNAL_SEQUENCE_OFFSET, u64::MAX - 3, "journal_sequence"),
        (CAPACITY_OFFSET, 1, "capacity_blocks"),
    ];
    for (offset, value, field) in cases {
        let image = crafted(offset, value);
        fs::write(pool.store_path(), &image).unwrap();
        for args in [
            &["info"][..],
            &["check"],
            &["list"],
            &["create", "w", "--size", "1M"],
        ] {
            let line = expect_error_line(args, &pool.run(args));
            assert!(
                line.contains(&format!("{field} {value}")),
                "{args:?}: {line}"
            );
        }
        assert!(
            fs::read(pool.store_path()).unwrap() == image,
            "{field}: the store was written"
        );
    }
}

#[test]
fn truncated_store_is_refused() {
    let pool = Pool::init(&[]);
    pool.ok(&["create", "v", "--size", "1M"]);
    let store_path = pool.store_path();
    let store_bytes = fs::metadata(&store_path).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(&store_path)
        .unwrap()
        .set_len(store_bytes / 2)
        .unwrap();
    let store = fs::read(&store_path).unwrap();
    for args in [
        &["list"][..],
        &["read", "v"],
        &["create", "w", "--size", "1M"],
    ] {
        let line = expect_error_line(args, &pool.run(args));
        assert!(line.contains("truncated"), "{args:?}: {line}");
    }
    assert_eq!(fs::read(&store_path).unwrap(), store);
}

#[test]
fn usage_errors_exit_2() {
    let pool = Pool::init(&[]);
    for args in [
        &["frobnicate"][..],
        &["create", "v"],
        &["list", "--bogus"],
        &[],
        &["snapshot", "only-one"],
        &["list", "--json", "extra"],
        &["policy", "set"],
    ] {
        let line = expect_usage_line(args, &pool.run(args));
        assert!(!line.contains("Usage:"), "{args:?}: {line}");
    }
    // The pointer names the command that was misused.
    let line = expect_usage_line(&["list", "--bogus"], &pool.run(&["list", "--bogus"]));
    assert!(
        line.contains("'--bogus'") && line.ends_with("(see 'grove list --help')"),
        "{line}"
    );
    let args = ["resize", "v", "12Q"];
    let line = expect_usage_line(&args, &pool.run(&args));
    assert!(line.ends_with("(see 'grove resize --help')"), "{line}");
    // Version is not an error either.
    assert!(pool.run(&["--version"]).status.success());
    // Help is not an error.
    let output = pool.run(&["--help"]);
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    assert!(help.contains("Examples:"), "{help}");
}

/// Rewrites the nibble of `block` in the store's first allocation group,
/// with a valid checksum, as damage (or a crash leftover) would.
fn set_map_nibble(pool: &Pool, block: u64, nibble: u8) {
    use grove_store::format::{group, superblock::Superblock};
    let mut store = fs::read(pool.store_path()).unwrap();
    let sb = Superblock::decode(&store[..512]).unwrap();
    let block_bytes = u64::from(sb.block_size_bytes) as usize;
    let map_at = sb.data_start.0 as usize * block_bytes;
    let map = &mut store[map_at..map_at + block_bytes];
    let mut decoded = group::decode(0, map).unwrap();
    decoded.nibbles[(block - sb.data_start.0) as usize] = nibble;
    group::encode(0, &decoded.nibbles, decoded.shares_present, map);
    fs::write(pool.store_path(), store).unwrap();
}

/// A data block the volume "v" uses: the first block past the metadata.
fn first_data_block(pool: &Pool) -> u64 {
    use grove_store::format::superblock::Superblock;
    let store = fs::read(pool.store_path()).unwrap();
    let sb = Superblock::decode(&store[..512]).unwrap();
    let block_bytes = u64::from(sb.block_size_bytes) as usize;
    (sb.data_start.0..sb.store_blocks())
        .find(|&b| store[b as usize * block_bytes..][..4] == [0xab; 4])
        .expect("the written data is in the store")
}

#[test]
fn check_reports_a_clean_pool() {
    let pool = Pool::init(&[]);
    pool.ok(&["create", "v", "--size", "64M"]);
    pool.run_with_stdin(&["write", "v"], &[0xab; 100_000]);
    pool.ok(&["snapshot", "v", "s"]);
    let text = pool.ok_text(&["check"]);
    assert!(text.contains("the pool is clean"), "{text}");
    assert!(text.contains("blocks/s"), "{text}");
    let report: Value = serde_json::from_slice(&pool.ok(&["check", "--json"])).unwrap();
    assert!(report["report"]["errors"].as_array().unwrap().is_empty());
    assert!(u64_of(&report["report"], "blocks_checked") > 25);
    assert_eq!(u64_of(&report["report"], "leaked_blocks"), 0);
    // The help says what exit 1 means.
    let help = pool.ok_text(&["check", "--help"]);
    assert!(
        help.contains("Exit status") && help.contains("leaked"),
        "{help}"
    );
}

#[test]
fn check_warns_of_a_leak_and_repair_frees_it() {
    let pool = Pool::init(&[]);
    pool.ok(&["create", "v", "--size", "64M"]);
    pool.run_with_stdin(&["write", "v"], &[0xab; 100_000]);
    let used = u64_of(&pool.info(), "used_bytes");
    // A block allocated in the map that nothing uses: a leak.
    let leaked = first_data_block(&pool) + 500;
    set_map_nibble(&pool, leaked, 0x1);
    // Space lost is an alarm: exit 1, one error line, and the count in
    // both the text and the JSON.
    let output = pool.run(&["check"]);
    let line = expect_error_line(&["check"], &output);
    assert!(
        line.contains("1 leaked blocks") && line.contains("--repair"),
        "{line}"
    );
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(
        text.contains("warning:") && text.contains("leaked"),
        "{text}"
    );
    assert!(text.contains("space is lost: 1 leaked blocks"), "{text}");
    let output = pool.run(&["check", "--json"]);
    expect_error_line(&["check", "--json"], &output);
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(u64_of(&report["report"], "leaked_blocks"), 1, "{report}");
    assert_eq!(u64_of(&report["report"], "over_counted_blocks"), 0);
    let warnings = report["report"]["warnings"].as_array().unwrap();
    assert!(
        warnings
            .iter()
            .any(|w| w.as_str().unwrap().contains("leaked")),
        "{report}"
    );
    let text = pool.ok_text(&["check", "--repair"]);
    assert!(text.contains("repaired: freed 1 leaked blocks"), "{text}");
    assert!(text.contains("after repair, the pool is clean"), "{text}");
    assert_eq!(u64_of(&pool.info(), "used_bytes"), used);
    assert_eq!(pool.read("v", 0, 100_000), vec![0xab; 100_000]);
}

/// Rewrites share-count block 0 of the first group (with a valid
/// checksum) so that `block` counts one more reference than before.
fn add_share_count(pool: &Pool, block: u64) {
    use grove_store::format::{group, shares, superblock::Superblock};
    use grove_store::types::BlockAddr;
    let mut store = fs::read(pool.store_path()).unwrap();
    let sb = Superblock::decode(&store[..512]).unwrap();
    let block_bytes = u64::from(sb.block_size_bytes) as usize;
    let data_start = sb.data_start.0;
    let map = group::decode(
        0,
        &store[data_start as usize * block_bytes..][..block_bytes],
    )
    .unwrap();
    assert_eq!(map.shares_present & 1, 1, "no share-count block yet");
    let home = &mut store[(data_start as usize + 1) * block_bytes..][..block_bytes];
    let mut counts = shares::decode(BlockAddr(data_start), home).unwrap();
    counts[(block - data_start) as usize] += 1;
    shares::encode(BlockAddr(data_start), &counts, home);
    fs::write(pool.store_path(), store).unwrap();
}

/// Flips a byte of share-count block 0 of the first group: its checksum
/// no longer matches, and the next open rebuilds every count.
fn tear_share_count_block(pool: &Pool) {
    use grove_store::format::superblock::Superblock;
    let store = fs::read(pool.store_path()).unwrap();
    let sb = Superblock::decode(&store[..512]).unwrap();
    let at = (sb.data_start.0 + 1) * u64::from(sb.block_size_bytes) + 100;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(pool.store_path())
        .unwrap();
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, at).unwrap();
    file.write_all_at(&[byte[0] ^ 0xff], at).unwrap();
}

/// A pool with data shared by a snapshot, so that it has a share-count
/// block.
fn pool_with_shares() -> Pool {
    let pool = Pool::init(&[]);
    pool.ok(&["create", "v", "--size", "64M"]);
    pool.run_with_stdin(&["write", "v"], &[0xab; 100_000]);
    pool.ok(&["snapshot", "v", "s"]);
    pool.ok(&["clone", "s", "c"]);
    pool
}

#[test]
fn check_fails_on_an_over_counted_block_and_repair_fixes_it() {
    let pool = pool_with_shares();
    add_share_count(&pool, first_data_block(&pool));
    let output = pool.run(&["check"]);
    let line = expect_error_line(&["check"], &output);
    assert!(
        line.contains("1 blocks counted with more references than they have"),
        "{line}"
    );
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(
        text.contains("warning: 1 blocks are counted with more"),
        "{text}"
    );
    let output = pool.run(&["check", "--json"]);
    expect_error_line(&["check", "--json"], &output);
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        u64_of(&report["report"], "over_counted_blocks"),
        1,
        "{report}"
    );
    assert_eq!(u64_of(&report["report"], "leaked_blocks"), 0, "{report}");
    let text = pool.ok_text(&["check", "--repair"]);
    assert!(text.contains("after repair, the pool is clean"), "{text}");
    // For good: the corrected count is what the next open loads.
    pool.ok(&["check"]);
    assert_eq!(pool.read("c", 0, 100_000), vec![0xab; 100_000]);
}

/// Harmless warnings (here: a torn share-count block, rebuilt from the
/// trees at open) exit 0, and --json carries every warning and error the
/// text shows.
#[test]
fn check_json_carries_what_the_text_shows_and_harmless_warnings_exit_0() {
    let pool = pool_with_shares();
    // The warning is the open's: the rebuilt counts are written back, so
    // each form of the check gets a freshly torn block.
    tear_share_count_block(&pool);
    let text = pool.ok_text(&["check"]);
    let shown = |prefix: &str| -> Vec<String> {
        text.lines()
            .filter_map(|line| line.strip_prefix(prefix))
            .map(str::to_string)
            .collect()
    };
    let (text_warnings, text_errors) = (shown("warning: "), shown("error: "));
    assert_eq!(text_warnings.len(), 1, "{text}");
    assert!(
        text_warnings[0].contains("rebuilt from the trees"),
        "{text}"
    );
    assert!(text.contains("no errors (1 warnings)"), "{text}");
    tear_share_count_block(&pool);
    let report: Value = serde_json::from_slice(&pool.ok(&["check", "--json"])).unwrap();
    let strings = |field: &str| -> Vec<String> {
        report["report"][field]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w.as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(strings("warnings"), text_warnings, "{report}");
    assert_eq!(strings("errors"), text_errors, "{report}");
    assert!(!pool.ok_text(&["check"]).contains("warning"));
}

/// The open that finds a torn share-count block rebuilds it and writes it
/// back, so the next `check` finds nothing: whatever command opened the
/// pool must tell the user, on stderr, and still do its job.
#[test]
fn any_command_tells_what_its_open_rebuilt() {
    let pool = pool_with_shares();
    tear_share_count_block(&pool);
    let output = pool.run(&["list", "--json"]);
    assert!(output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let warnings: Vec<&str> = stderr.lines().collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(
        warnings[0].starts_with("grove: warning: ")
            && warnings[0].contains("rebuilt from the trees"),
        "{stderr}"
    );
    // The listing on stdout is untouched by it.
    serde_json::from_slice::<Value>(&output.stdout).unwrap();
    // Written back: the next command opens a sound pool and says nothing.
    let output = pool.run(&["list"]);
    assert!(
        output.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn check_fails_on_a_block_in_use_marked_free_and_repair_fixes_it() {
    let pool = Pool::init(&[]);
    pool.ok(&["create", "v", "--size", "64M"]);
    pool.run_with_stdin(&["write", "v"], &[0xab; 100_000]);
    let block = first_data_block(&pool);
    set_map_nibble(&pool, block, 0x0);
    let output = pool.run(&["check"]);
    let line = expect_error_line(&["check"], &output);
    assert!(line.contains("check found 1 errors"), "{line}");
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        report.contains(&format!(
            "block {block} is in use but the allocation map says it is free"
        )),
        "{report}"
    );
    let text = pool.ok_text(&["check", "--repair"]);
    assert!(text.contains("after repair, the pool is clean"), "{text}");
    pool.ok(&["check"]);
    assert_eq!(pool.read("v", 0, 100_000), vec![0xab; 100_000]);
}

// ------------------------------------------------------------------ space

#[test]
fn init_space_flags_go_into_grove_toml_and_info_shows_the_levels() {
    let pool = Pool::init(&[
        "--capacity",
        "2G",
        "--max-capacity",
        "200G",
        "--warn",
        "70%",
        "--prune",
        "85%",
        "--extend-step",
        "4G",
        "--host-reserve",
        "5%",
        "--hook",
        "logger -t grove",
    ]);
    let config = fs::read_to_string(pool.path.join("grove.toml")).unwrap();
    for line in [
        "[space]",
        "max_capacity = \"200G\"",
        "extend_step = \"4G\"",
        "host_reserve = \"5%\"",
        "warn = \"70%\"",
        "prune = \"85%\"",
        "hook = \"logger -t grove\"",
    ] {
        assert!(config.contains(line), "{line} missing from {config}");
    }
    let space = &pool.info()["space"];
    assert_eq!(space["level"], "normal");
    assert_eq!(u64_of(space, "capacity_bytes"), 2 * GIB);
    assert_eq!(u64_of(space, "max_capacity_bytes"), 200 * GIB);
    assert_eq!(u64_of(space, "extend_at_bytes"), 2 * GIB * 80 / 100);
    let ceiling = u64_of(space, "ceiling_bytes");
    assert!((2 * GIB..=200 * GIB).contains(&ceiling), "{space}");
    assert_eq!(u64_of(space, "warn_bytes"), ceiling * 70 / 100);
    assert_eq!(u64_of(space, "prune_bytes"), ceiling * 85 / 100);
    let text = pool.ok_text(&["info"]);
    for line in [
        "space level        normal",
        "max capacity       200.0 GiB",
        "auto-extend        on: at 1.6 GiB used, to ",
        "warn at ",
        "(70%)",
        "(85%)",
    ] {
        assert!(text.contains(line), "{line:?} missing from {text}");
    }
    let shown: Value = serde_json::from_slice(&pool.ok(&["space", "show", "--json"])).unwrap();
    assert_eq!(shown["settings"]["warn_percent"], 70);
    assert_eq!(shown["settings"]["hook"], "logger -t grove");
    assert!(pool
        .ok_text(&["space", "show"])
        .contains("hook          logger -t grove (killed after 10 s)"));
}

#[test]
fn space_set_changes_the_settings_and_raises_the_capacity() {
    let pool = Pool::init(&["--capacity", "1G", "--hook", "true"]);
    let out = pool.ok_text(&["space", "set", "--capacity", "3G", "--warn", "60%"]);
    assert!(out.contains("capacity      3.0 GiB"), "{out}");
    assert_eq!(u64_of(&pool.info(), "capacity_bytes"), 3 * GIB);
    pool.ok(&["space", "set", "--auto-extend", "off", "--hook", ""]);
    let config = fs::read_to_string(pool.path.join("grove.toml")).unwrap();
    assert!(
        config.contains("auto_extend = false") && config.contains("warn = \"60%\""),
        "{config}"
    );
    assert!(!config.contains("hook"), "an empty hook stays in: {config}");
    let space = &pool.info()["space"];
    assert_eq!(space["auto_extend"], false);
    // Without auto-extension the capacity is the ceiling.
    assert_eq!(u64_of(space, "ceiling_bytes"), 3 * GIB);
    assert!(pool.ok_text(&["info"]).contains("auto-extend        off"));
    // Back to the defaults: the table holds only what differs.
    pool.ok(&["space", "set", "--auto-extend", "on", "--warn", "80%"]);
    let config = fs::read_to_string(pool.path.join("grove.toml")).unwrap();
    assert!(!config.contains("[space]"), "{config}");
}

#[test]
fn bad_space_settings_get_one_line_and_change_nothing() {
    let pool = Pool::init(&["--capacity", "2G", "--max-capacity", "10G"]);
    let config_path = pool.path.join("grove.toml");
    let config = fs::read_to_string(&config_path).unwrap();
    for (args, says) in [
        (
            &["space", "set", "--warn", "120%"][..],
            "space.warn \"120%\" is not a percentage from 1% to 100%",
        ),
        (
            &["space", "set", "--prune", "50%"][..],
            "space.warn 80% is above space.prune 50%",
        ),
        (
            &["space", "set", "--extend-step", "0"][..],
            "space.extend_step",
        ),
        (
            &["space", "set", "--host-reserve", "100%"][..],
            "space.host_reserve",
        ),
        (
            &["space", "set", "--auto-extend", "maybe"][..],
            "say on or off",
        ),
        (
            &["space", "set", "--hook-timeout", "soon"][..],
            "--hook-timeout",
        ),
        (
            &["space", "set", "--hook-timeout", "0"][..],
            "space.hook_timeout_secs",
        ),
        (
            &["space", "set", "--capacity", "1G"][..],
            "the capacity can only grow",
        ),
        (
            &["space", "set", "--capacity", "20G"][..],
            "above max_capacity",
        ),
    ] {
        let line = pool.refused(args);
        assert!(line.contains(says), "{args:?}: {line}");
        assert_eq!(
            fs::read_to_string(&config_path).unwrap(),
            config,
            "{args:?}"
        );
    }
    // A size whose text cannot be read is a usage error (exit 2).
    let line = pool.refused_usage(&["space", "set", "--max-capacity", "lots"]);
    assert!(line.contains("max capacity"), "{line}");
    assert_eq!(fs::read_to_string(&config_path).unwrap(), config);
    let fresh = Pool::uninitialized();
    let output = fresh.run(&["init", "--capacity", "5G", "--max-capacity", "2G"]);
    let line = expect_error_line(&["init"], &output);
    assert!(line.contains("above --max-capacity"), "{line}");
    assert!(!fresh.path.join("grove.toml").exists());
}

#[test]
fn a_bad_space_table_in_grove_toml_is_refused_by_key() {
    let pool = Pool::init(&[]);
    let config_path = pool.path.join("grove.toml");
    let config = fs::read_to_string(&config_path).unwrap();
    for (table, says) in [
        (
            "[space]\nwarn = \"x\"\n",
            "space.warn \"x\" is not a percentage from 1% to 100%",
        ),
        (
            "[space]\nwarm = \"80%\"\n",
            "unknown setting \"space.warm\" (did you mean space.warn?)",
        ),
        ("[space]\nauto_extend = \"yes\"\n", "auto_extend"),
    ] {
        fs::write(&config_path, format!("{config}{table}")).unwrap();
        let output = pool.run(&["info"]);
        let line = expect_error_line(&["info"], &output);
        assert!(line.contains("grove.toml") && line.contains(says), "{line}");
    }
}
