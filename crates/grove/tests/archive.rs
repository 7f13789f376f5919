//! The archive tier end to end with the real binary, on `file://` (always)
//! and on the S3 gateway of scripts/ceph.sh (when $GROVE_TEST_S3_BUCKET and
//! AWS_* are set; required under scripts/test.sh): days of ranked snapshots
//! pushed and expired, the archive keeping what the calendar oracle keeps;
//! every kept snapshot restored with the hash recorded at push; a push
//! killed with SIGKILL part way, checked consistent and resumed sending no
//! pack twice, and one killed half way through streaming a pack (its
//! temporary file or multipart upload removed by the resumed push's sweep); a second writer refused and taken over; damaged packs and
//! catalogs found by `check`, and a restore over damage refused.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use grove_retention::oracle::kept_by_calendar;
use grove_retention::Policy;
use serde_json::Value;
use tempfile::TempDir;

mod support;
use support::GroveOnPool;

const DAY: u64 = 86_400;
/// 2026-11-02 00:00:00 UTC, a Monday.
const MONDAY: u64 = 1_793_577_600;

struct Pool {
    dir: TempDir,
    path: PathBuf,
    archive: String,
}

impl GroveOnPool for Pool {
    fn pool_path(&self) -> PathBuf {
        self.path.clone()
    }
}

fn at(t: u64) -> String {
    format!("@{t}")
}

fn tools_required() -> bool {
    std::env::var_os("GROVE_REQUIRE_TOOLS").is_some_and(|v| v != "0")
}

/// A fresh prefix of the test bucket, or None after a visible SKIP.
fn s3_archive(test: &str) -> Option<String> {
    match std::env::var("GROVE_TEST_S3_BUCKET") {
        Ok(bucket) if !bucket.is_empty() => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos();
            Some(format!(
                "s3://{bucket}/archive-{test}-{}-{nanos}",
                std::process::id()
            ))
        }
        _ => {
            let why = "no S3 gateway: GROVE_TEST_S3_BUCKET is not set (scripts/ceph.sh start)";
            assert!(!tools_required(), "{why}, and GROVE_REQUIRE_TOOLS is set");
            eprintln!("SKIP: {why}");
            None
        }
    }
}

/// What the tests' policy keeps in the archive: daily 4, weekly 2; the pool
/// itself keeps 2 dailies.
fn archive_policy() -> Policy {
    Policy {
        keep: [0, 0, 4, 2, 0, 0],
        frequent_secs: 900,
        minimum: 0,
    }
}

impl Pool {
    /// A pool with volume vm (8 MiB, 3 MiB written) whose policy archives
    /// to `archive` (None: the default beside the pool).
    fn new(archive: Option<String>) -> Pool {
        let dir = TempDir::new().unwrap();
        let path = dir.path().join("pool");
        let archive_url = archive
            .clone()
            .unwrap_or_else(|| format!("file://{}.archive", path.display()));
        let pool = Pool {
            dir,
            path,
            archive: archive_url,
        };
        pool.ok(&["init"]);
        pool.ok(&["create", "vm", "--size", "8M"]);
        pool.write_random(0, 3 << 20, 1);
        let mut toml = std::fs::read_to_string(pool.path.join("grove.toml")).unwrap();
        toml.push_str(
            "\n[retention.volumes]\nvm = { daily = 2, archive = { daily = 4, weekly = 2 } }\n",
        );
        if let Some(url) = archive {
            toml.push_str(&format!("\n[archive]\nlocation = \"{url}\"\n"));
        }
        std::fs::write(pool.path.join("grove.toml"), toml).unwrap();
        pool
    }

    fn write_random(&self, offset: u64, len: usize, seed: u64) {
        self.write_random_to("vm", offset, len, seed);
    }

    fn write_random_to(&self, volume: &str, offset: u64, len: usize, seed: u64) {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let data: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let file = self.dir.path().join("data");
        std::fs::write(&file, data).unwrap();
        self.ok(&[
            "write",
            volume,
            file.to_str().unwrap(),
            "--offset",
            &offset.to_string(),
        ]);
    }

    /// One day: a few writes, the due snapshot, a push, an expiry, a prune.
    fn day(&self, day: u64) {
        let now = MONDAY + day * DAY + 3600;
        for i in 0..3 {
            let offset = ((day * 7 + i * 13) % 1900) * 4096;
            self.write_random(offset, 4096 * (1 + (i as usize)), day * 10 + i);
        }
        self.ok(&["snapshot", "--auto", "vm", "--now", &at(now)]);
        self.ok(&["archive", "push"]);
        self.ok(&["archive", "expire", "--now", &at(now)]);
        self.ok(&["prune", "--now", &at(now)]);
    }

    /// A day whose push is not followed by an expiry: expiries pile up.
    fn day_without_expiry(&self, day: u64) {
        let now = MONDAY + day * DAY + 3600;
        self.write_random(((day * 7) % 1900) * 4096, 8192, day + 100);
        self.ok(&["snapshot", "--auto", "vm", "--now", &at(now)]);
        self.ok(&["archive", "push"]);
        self.ok(&["prune", "--now", &at(now)]);
    }

    /// Runs `args` with the archive's test hook stalling at `point`, waits
    /// until it says it stalled, and kills it with SIGKILL.
    fn kill_at(&self, point: &str, args: &[&str]) {
        let mut child = Reaped(
            self.command(args)
                .env("GROVE_TEST_ARCHIVE_STALL_AT", point)
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let mut line = String::new();
        BufReader::new(child.0.stderr.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(
            line.contains(&format!("stalled at {point}")),
            "{point}: {line}"
        );
        child.0.kill().unwrap();
        child.0.wait().unwrap();
    }

    /// `grove serve` holding the pool, its scheduler given a clock it
    /// cannot read so that it leaves the pool alone; returned once its
    /// control socket answers.
    fn serve_without_scheduler(&self) -> Reaped {
        let clock = self.dir.path().join("clock");
        std::fs::write(&clock, "not a time").unwrap();
        let child = Reaped(
            self.command(&["serve"])
                .env("GROVE_CLOCK_FILE", &clock)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let started = std::time::Instant::now();
        while std::os::unix::net::UnixStream::connect(self.path.join("grove.control")).is_err() {
            assert!(
                started.elapsed().as_secs() < 20,
                "grove serve did not start"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        child
    }

    fn listing(&self) -> Vec<Value> {
        let out = self.ok(&["archive", "list", "--json"]);
        let listings: Vec<Value> = serde_json::from_str(&out).unwrap();
        assert_eq!(listings.len(), 1, "{out}");
        listings[0]["snapshots"].as_array().unwrap().clone()
    }

    fn hash(&self, name: &str) -> String {
        self.ok(&["hash", name])
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    }

    fn folder(&self) -> Option<PathBuf> {
        self.archive
            .strip_prefix("file://")
            .map(|dir| Path::new(dir).join("archive=vm"))
    }
}

fn season_is_kept_as_the_calendar_says_and_restores(archive: Option<String>) {
    let pool = Pool::new(archive);
    let mut taken = Vec::new();
    for day in 0..16 {
        pool.day(day);
        taken.push(MONDAY + day * DAY + 3600);
    }
    let listed = pool.listing();
    assert_kept_as_the_calendar_says(&listed, &taken);
    // The pool kept only its last two; the archive restores the rest.
    for (i, s) in listed.iter().enumerate() {
        let name = s["name"].as_str().unwrap();
        let restored = format!("back{i}");
        pool.ok(&["archive", "restore", name, &restored]);
        assert_eq!(pool.hash(&restored), s["hash"].as_str().unwrap(), "{name}");
    }
    let check = pool.ok(&["archive", "check", "--deep"]);
    assert!(check.contains("consistent"), "{check}");
}

#[test]
fn a_season_on_file_keeps_what_the_calendar_keeps_and_restores_each_snapshot() {
    season_is_kept_as_the_calendar_says_and_restores(None);
}

#[test]
fn a_season_on_the_gateway_keeps_what_the_calendar_keeps_and_restores_each_snapshot() {
    if let Some(url) = s3_archive("season") {
        season_is_kept_as_the_calendar_says_and_restores(Some(url));
    }
}

fn killed_push_resumes(archive: Option<String>) {
    let pool = Pool::new(archive);
    pool.ok(&["snapshot", "vm", "vm@one"]);
    let mut child = Reaped(
        pool.command(&[
            "archive",
            "push",
            "vm",
            "--snapshot",
            "vm@one",
            "--pack-size",
            "256K",
        ])
        .env("GROVE_TEST_ARCHIVE_STALL_AFTER_PACKS", "5")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(child.0.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("stalled after 5 packs"), "{line}");
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    // Killed: the archive is consistent, and the claim is still held.
    let check = pool.ok(&["archive", "check"]);
    assert!(check.contains("consistent"), "{check}");
    let busy = pool.run(&["archive", "push", "vm", "--snapshot", "vm@one"]);
    let stderr = String::from_utf8_lossy(&busy.stderr);
    assert!(
        !busy.status.success() && stderr.contains("is in use by") && stderr.contains("--take-over"),
        "{stderr}"
    );
    let out = pool.ok(&[
        "archive",
        "push",
        "vm",
        "--snapshot",
        "vm@one",
        "--pack-size",
        "256K",
        "--take-over",
        "--json",
    ]);
    let reports: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(reports[0]["packs_resumed"], 5, "{out}");
    // 3 MiB in 256 KiB packs: 13 in all, none sent twice.
    let written = reports[0]["packs_written"].as_u64().unwrap();
    assert_eq!(written + 5, 13, "{out}");
    pool.ok(&["archive", "restore", "vm@one", "back"]);
    assert_eq!(pool.hash("back"), pool.hash("vm@one"));
}

#[test]
fn a_push_killed_part_way_is_consistent_and_resumes_on_file() {
    killed_push_resumes(None);
}

#[test]
fn a_push_killed_part_way_is_consistent_and_resumes_on_the_gateway() {
    if let Some(url) = s3_archive("killed") {
        killed_push_resumes(Some(url));
    }
}

/// The temporary files of streamed puts in a `file://` archive's folder
/// of volume `volume`, with their sizes.
fn temporary_puts(archive: &str, volume: &str) -> Vec<u64> {
    let dir = Path::new(archive.strip_prefix("file://").unwrap()).join(format!("archive={volume}"));
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().starts_with(".put-"))
        .map(|e| e.metadata().unwrap().len())
        .collect()
}

/// A push killed with SIGKILL half way through streaming a pack: 8 MiB of
/// its second pack (16 MiB packs, 12 MiB in the second) written (on the gateway one 5 MiB part of the
/// pack's multipart upload sent, the next gathering). The archive checks
/// consistent; the push resumes after the first pack, sending only the
/// killed one again, and its sweep removes what the killed one left: the
/// temporary file, or the recorded upload (aborted, then its marker).
fn push_killed_in_a_streamed_pack(archive: Option<String>) {
    let pool = Pool::new(archive);
    pool.ok(&["create", "big", "--size", "40M"]);
    pool.write_random_to("big", 0, 28 << 20, 7);
    pool.ok(&["snapshot", "big", "big@one"]);
    let push = [
        "archive",
        "push",
        "big",
        "--snapshot",
        "big@one",
        "--pack-size",
        "16M",
    ];
    pool.kill_at("pack-midway:1:8388608", &push);
    let check = pool.ok(&["archive", "check"]);
    assert!(check.contains("consistent"), "{check}");
    let on_file = pool.archive.starts_with("file://");
    if on_file {
        let left = temporary_puts(&pool.archive, "big");
        assert!(
            left.len() == 1 && left[0] >= (8 << 20) - (256 << 10),
            "{left:?}"
        );
    }
    let mut resume = push.to_vec();
    resume.extend(["--take-over", "--json"]);
    let out = pool.ok(&resume);
    let reports: Vec<Value> = serde_json::from_str(&out).unwrap();
    // 28 MiB in 16 MiB packs: two, the first kept, the killed one sent
    // again; the sweep found its leftover, and nothing else.
    assert_eq!(reports[0]["packs_resumed"], 1, "{out}");
    assert_eq!(reports[0]["packs_written"], 1, "{out}");
    assert_eq!(reports[0]["swept"], 1, "{out}");
    let listed = pool.ok(&["archive", "list", "big", "--json"]);
    let listed: Vec<Value> = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed[0]["packs"], 2, "{listed:?}");
    // Nothing of the killed pack is left to clean.
    let store = grove_objects::FolderStore::open(&pool.archive).unwrap();
    assert_eq!(store.clean_interrupted("archive=big").unwrap(), 0);
    if on_file {
        assert_eq!(temporary_puts(&pool.archive, "big"), Vec::<u64>::new());
    }
    let check = pool.ok(&["archive", "check", "--deep"]);
    assert!(check.contains("consistent"), "{check}");
    pool.ok(&["archive", "restore", "big@one", "back"]);
    assert_eq!(pool.hash("back"), pool.hash("big@one"));
}

#[test]
fn a_push_killed_in_the_middle_of_a_streamed_pack_on_file_resumes_and_leaves_no_temporary_file() {
    push_killed_in_a_streamed_pack(None);
}

#[test]
fn a_push_killed_in_the_middle_of_a_multipart_pack_on_the_gateway_resumes_and_aborts_it() {
    if let Some(url) = s3_archive("midpack") {
        push_killed_in_a_streamed_pack(Some(url));
    }
}

/// Flips a byte of the newest object named `prefix...` in the archive's
/// folder, at the offset `at` gives for its length.
fn flip(folder: &Path, prefix: &str, at: impl Fn(usize) -> usize) -> String {
    let mut names: Vec<_> = std::fs::read_dir(folder)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(prefix))
        .collect();
    names.sort();
    let name = names.last().unwrap().clone();
    let path = folder.join(&name);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = at(bytes.len());
    bytes[at] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();
    name
}

#[test]
fn damage_is_named_by_the_snapshots_it_affects_and_never_restored() {
    let pool = Pool::new(None);
    for day in 0..3 {
        pool.day(day);
    }
    let folder = pool.folder().unwrap();
    assert!(pool
        .ok(&["archive", "check", "--deep"])
        .contains("consistent"));
    // A flipped byte in the newest pack's first block (after the 32-byte
    // header and the slot's checksum): only a deep check sees it.
    flip(&folder, "pack-", |_| 32 + 4 + 10);
    assert!(pool.ok(&["archive", "check"]).contains("consistent"));
    let deep = pool.run(&["archive", "check", "--deep", "--json"]);
    assert_eq!(deep.status.code(), Some(1));
    let reports: Vec<Value> = serde_json::from_slice(&deep.stdout).unwrap();
    let damaged = reports[0]["report"]["damaged_snapshots"]
        .as_array()
        .unwrap()
        .clone();
    assert!(!damaged.is_empty(), "{reports:?}");
    let name = damaged[0].as_str().unwrap();
    let refused = pool.run(&["archive", "restore", name, "back"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("checksum does not match"),
        "{stderr}"
    );
    assert!(
        !pool.ok(&["list"]).contains("back"),
        "nothing of a refused restore is kept"
    );
    // A damaged catalog: every snapshot affected; push refuses to build on it.
    flip(
        &folder.with_file_name("archive-catalog=vm"),
        "catalog-",
        |len| len - 3,
    );
    let check = pool.run(&["archive", "check"]);
    assert_eq!(check.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&check.stdout).contains("catalog"),
        "{check:?}"
    );
    pool.ok(&["snapshot", "vm", "vm@more"]);
    let push = pool.run(&["archive", "push", "vm", "--snapshot", "vm@more"]);
    assert!(!push.status.success());
    assert!(
        String::from_utf8_lossy(&push.stderr).contains("damaged"),
        "{push:?}"
    );
}

#[test]
fn bad_requests_get_one_line_each() {
    let pool = Pool::new(None);
    let cases: [(&[&str], &str); 4] = [
        (&["archive", "restore", "vm@nothing", "x"], "no archive at"),
        (
            &["archive", "push", "vm", "--snapshot", "vm"],
            "is not a snapshot of volume",
        ),
        (&["archive", "list", "--to", "ftp://x"], "ftp"),
        (
            &["archive", "push", "vm", "--snapshot", "vm@none"],
            "vm@none",
        ),
    ];
    for (args, says) in cases {
        let out = pool.run(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

#[test]
fn grove_rank_reaches_a_snapshot_the_pool_no_longer_has_and_release_lets_one_pushed_by_hand_go() {
    let pool = Pool::new(None);
    for day in 0..4 {
        pool.day(day);
    }
    let listed = pool.listing();
    let first = listed[0]["name"].as_str().unwrap().to_string();
    assert!(!pool.ok(&["list"]).contains(&first), "the pool pruned it");
    let out = pool.ok(&["rank", &first, "weekly"]);
    assert!(out.contains("in the archive"), "{out}");
    let listed = pool.listing();
    assert_eq!(listed[0]["rank"], "weekly");
    // By hand: kept whatever the policy says, until released.
    pool.ok(&["snapshot", "vm", "vm@mine"]);
    pool.ok(&["archive", "push", "vm", "--snapshot", "vm@mine"]);
    let later = at(MONDAY + 40 * DAY);
    pool.ok(&["archive", "expire", "--now", &later]);
    assert!(pool.listing().iter().any(|s| s["name"] == "vm@mine"));
    pool.ok(&["archive", "release", "vm@mine"]);
    pool.ok(&["archive", "expire", "--now", &later]);
    assert!(!pool.listing().iter().any(|s| s["name"] == "vm@mine"));
}

/// `grove serve`'s scheduler, on a clock the test drives: each day it takes
/// the snapshot due, pushes what the archive keeps, expires, then prunes
/// the pool; the archive ends up keeping what the calendar oracle keeps.
#[test]
fn the_daemons_scheduler_pushes_and_expires_on_the_policys_clock() {
    let pool = Pool::new(None);
    let clock = pool.dir.path().join("clock");
    std::fs::write(&clock, (MONDAY + 3600).to_string()).unwrap();
    let mut child = Reaped(
        pool.command(&["serve"])
            .env("GROVE_CLOCK_FILE", &clock)
            .env("GROVE_SCHEDULER_TICK_MS", "20")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut taken = Vec::new();
    for day in 0..10 {
        let now = MONDAY + day * DAY + 3600;
        std::fs::write(&clock, now.to_string()).unwrap();
        taken.push(now);
        // Wait until the day's snapshot is archived and expiry has run.
        let want = kept_by_calendar(&archive_policy(), &taken).len();
        let started = std::time::Instant::now();
        loop {
            let out = pool.ok(&["archive", "list", "--json"]);
            let listings: Vec<Value> = serde_json::from_str(&out).unwrap();
            let listed = listings
                .first()
                .map_or(Vec::new(), |l| l["snapshots"].as_array().unwrap().clone());
            let newest = listed.last().and_then(|s| s["created_unix_secs"].as_u64());
            if newest == Some(now) && listed.len() == want {
                break;
            }
            assert!(
                started.elapsed().as_secs() < 30,
                "day {day}: the scheduler did not archive"
            );
            std::thread::sleep(std::time::Duration::from_millis(30));
        }
    }
    // Stop the daemon (SIGTERM) before reading the archive with the CLI.
    stop_daemon(&mut child);
    let listed = pool.listing();
    assert_kept_as_the_calendar_says(&listed, &taken);
}

/// The archived snapshots listed are those the calendar oracle keeps of
/// the snapshots taken at `taken`.
fn assert_kept_as_the_calendar_says(listed: &[Value], taken: &[u64]) {
    let kept: Vec<u64> = listed
        .iter()
        .map(|s| s["created_unix_secs"].as_u64().unwrap())
        .collect();
    let expected: Vec<u64> = kept_by_calendar(&archive_policy(), taken)
        .into_iter()
        .collect();
    assert_eq!(kept, expected);
}

/// A child process killed when the test ends, passed or failed, so that
/// no daemon or stalled command outlives it.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Stops a daemon as its users do (SIGTERM) and waits for it.
fn stop_daemon(child: &mut Reaped) {
    let _ = std::process::Command::new("kill")
        .arg(child.0.id().to_string())
        .status();
    let _ = child.0.wait();
}

/// The kinds of damage `archive check` must name by snapshot, each on a
/// fresh archive: a missing pack, a truncated index, another snapshot's
/// index in place of one (foreign).
#[test]
fn missing_truncated_and_foreign_objects_are_named_by_snapshot() {
    type Damage = fn(&Path);
    let kinds: [(&str, Damage); 3] = [
        ("missing pack", |folder| {
            let pack = newest(folder, "pack-");
            std::fs::remove_file(folder.join(pack)).unwrap();
        }),
        ("truncated index", |folder| {
            let index = folder.join(newest(folder, "index-"));
            let bytes = std::fs::read(&index).unwrap();
            std::fs::write(&index, &bytes[..bytes.len() - 5]).unwrap();
        }),
        ("foreign index", |folder| {
            let mut names = names(folder, "index-");
            names.sort();
            std::fs::copy(folder.join(&names[0]), folder.join(names.last().unwrap())).unwrap();
        }),
    ];
    for (kind, damage) in kinds {
        let pool = Pool::new(None);
        for day in 0..3 {
            pool.day(day);
        }
        damage(&pool.folder().unwrap());
        let check = pool.run(&["archive", "check", "--json"]);
        assert_eq!(check.status.code(), Some(1), "{kind}");
        let reports: Vec<Value> = serde_json::from_slice(&check.stdout).unwrap();
        let damaged = reports[0]["report"]["damaged_snapshots"]
            .as_array()
            .unwrap();
        let newest = pool.listing().last().unwrap()["name"].clone();
        assert!(damaged.contains(&newest), "{kind}: {reports:?}");
    }
}

fn names(folder: &Path, prefix: &str) -> Vec<String> {
    std::fs::read_dir(folder)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

fn newest(folder: &Path, prefix: &str) -> String {
    let mut names = names(folder, prefix);
    names.sort();
    names.pop().unwrap()
}

/// SIGKILL in expiry, before its commit and after it, and in the middle of
/// a restore: the archive checks consistent, the command runs again (the
/// dead writer's claim taken over) and ends as an uninterrupted run would,
/// with nothing left over.
/// Expiry killed before and after its commit, and a restore killed half
/// way, each on a fresh archive from `archive`: the archive checks
/// consistent and the command runs again to what an uninterrupted run does.
fn killed_expiry_and_restore_run_again(archive: &dyn Fn() -> Option<String>) {
    for point in ["expire-before-commit", "expire-before-delete"] {
        let pool = Pool::new(archive());
        let mut taken = Vec::new();
        for day in 0..10 {
            pool.day_without_expiry(day);
            taken.push(MONDAY + day * DAY + 3600);
        }
        let now = at(*taken.last().unwrap());
        pool.kill_at(point, &["archive", "expire", "--now", &now]);
        assert!(
            pool.ok(&["archive", "check"]).contains("consistent"),
            "{point}"
        );
        pool.ok(&["archive", "expire", "--now", &now, "--take-over"]);
        assert_kept_as_the_calendar_says(&pool.listing(), &taken);
        let out = pool.ok(&["archive", "check", "--deep", "--json"]);
        let reports: Vec<Value> = serde_json::from_str(&out).unwrap();
        assert!(
            reports[0]["report"]["problems"]
                .as_array()
                .unwrap()
                .is_empty(),
            "{out}"
        );
        assert!(
            reports[0]["report"]["unreferenced_objects"]
                .as_array()
                .unwrap()
                .is_empty(),
            "{point}: {out}"
        );
        for s in pool.listing() {
            let name = s["name"].as_str().unwrap();
            pool.ok(&["archive", "restore", name, "back"]);
            assert_eq!(
                pool.hash("back"),
                s["hash"].as_str().unwrap(),
                "{point}: {name}"
            );
            pool.ok(&["rm", "back"]);
        }
    }
    let pool = Pool::new(archive());
    pool.day(0);
    let name = pool.listing()[0]["name"].as_str().unwrap().to_string();
    pool.kill_at("restore-midway", &["archive", "restore", &name, "back"]);
    assert!(pool.ok(&["archive", "check"]).contains("consistent"));
    pool.ok(&["archive", "restore", &name, "back"]);
    assert_eq!(
        pool.hash("back"),
        pool.listing()[0]["hash"].as_str().unwrap()
    );
    assert!(
        !pool.ok(&["list"]).contains("back.restoring"),
        "the half restore is gone"
    );
}

#[test]
fn expire_and_restore_killed_part_way_leave_a_consistent_archive_and_run_again() {
    killed_expiry_and_restore_run_again(&|| None);
}

#[test]
fn expire_and_restore_killed_part_way_on_the_gateway_leave_it_consistent_and_run_again() {
    if s3_archive("expire").is_some() {
        killed_expiry_and_restore_run_again(&|| s3_archive("expire"));
    }
}

/// A pool lost: a new pool restores the newest archived snapshot from the
/// archive alone, makes the volume again from it, and goes on archiving
/// into the same archive (its generations start again; times still order
/// its snapshots after the archived ones).
#[test]
fn a_new_pool_restores_from_the_archive_and_goes_on_archiving_into_it() {
    let store = TempDir::new().unwrap();
    let url = format!("file://{}/archive", store.path().display());
    let first = Pool::new(Some(url.clone()));
    for day in 0..3 {
        first.day(day);
    }
    let newest = first.listing().last().unwrap().clone();
    drop(first);
    let second = Pool::new(Some(url));
    second.ok(&["rm", "vm"]);
    let name = newest["name"].as_str().unwrap();
    second.ok(&["archive", "restore", name, "vm@restored"]);
    assert_eq!(second.hash("vm@restored"), newest["hash"].as_str().unwrap());
    second.ok(&["clone", "vm@restored", "vm"]);
    second.day(3);
    let listed = second.listing();
    let last = listed.last().unwrap();
    assert_eq!(last["created_unix_secs"], MONDAY + 3 * DAY + 3600);
    let restored = "again";
    second.ok(&[
        "archive",
        "restore",
        last["name"].as_str().unwrap(),
        restored,
    ]);
    assert_eq!(second.hash(restored), last["hash"].as_str().unwrap());
    assert!(second
        .ok(&["archive", "check", "--deep"])
        .contains("consistent"));
}

/// `grove archive push` while `grove serve` holds the pool: the daemon
/// pushes, and the command prints what it did.
#[test]
fn a_push_goes_through_the_daemon_that_holds_the_pool() {
    let pool = Pool::new(None);
    let mut child = pool.serve_without_scheduler();
    pool.ok(&["snapshot", "vm", "vm@hand"]);
    let out = pool.ok(&["archive", "push", "vm", "--snapshot", "vm@hand", "--json"]);
    let reports: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(reports[0]["snapshot"], "vm@hand", "{out}");
    let hash = pool.ok(&["hash", "vm@hand"]);
    stop_daemon(&mut child);
    let listed = pool.listing();
    assert_eq!(listed[0]["name"], "vm@hand");
    assert!(hash.starts_with(listed[0]["hash"].as_str().unwrap()));
}

/// SIGKILL in a lazy rank (`grove rank` on a snapshot only the archive
/// has), before its commit and after it: the archive checks consistent,
/// the rank runs again over the dead writer's claim (`--take-over`), and
/// the archive ends, after an expiry, as it does on a pool whose rank was
/// never interrupted.
fn killed_lazy_rank_runs_again(archive: &dyn Fn() -> Option<String>) {
    let ranked_and_expired = |pool: &Pool, first: &str, take_over: bool| {
        let mut args = vec!["rank", first, "none"];
        if take_over {
            args.push("--take-over");
        }
        let out = pool.ok(&args);
        assert!(out.contains("in the archive"), "{out}");
        pool.ok(&["archive", "expire", "--now", &at(MONDAY + 9 * DAY)]);
        pool.listing()
            .iter()
            .map(|s| (s["name"].clone(), s["rank"].clone(), s["hash"].clone()))
            .collect::<Vec<_>>()
    };
    let uninterrupted = Pool::new(archive());
    for day in 0..4 {
        uninterrupted.day(day);
    }
    let first = uninterrupted.listing()[0]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let before = uninterrupted.listing()[0]["rank"].clone();
    let expected = ranked_and_expired(&uninterrupted, &first, false);
    assert!(
        expected
            .iter()
            .any(|(n, r, _)| n == first.as_str() && r != &before),
        "{expected:?}"
    );
    for point in ["rank-before-commit", "rank-after-commit"] {
        let pool = Pool::new(archive());
        for day in 0..4 {
            pool.day(day);
        }
        assert!(!pool.ok(&["list"]).contains(&first), "the pool pruned it");
        let before = pool.listing()[0]["rank"].clone();
        pool.kill_at(point, &["rank", &first, "none"]);
        let check = pool.ok(&["archive", "check"]);
        assert!(check.contains("consistent"), "{point}: {check}");
        let rank = pool.listing()[0]["rank"].clone();
        let committed = point == "rank-after-commit";
        assert_eq!(rank != before, committed, "{point}: {rank}");
        let busy = pool.run(&["rank", &first, "none"]);
        let stderr = String::from_utf8_lossy(&busy.stderr);
        assert!(
            !busy.status.success()
                && stderr.contains("is in use by")
                && stderr.contains("--take-over"),
            "{point}: {stderr}"
        );
        assert_eq!(ranked_and_expired(&pool, &first, true), expected, "{point}");
        let out = pool.ok(&["archive", "check", "--deep", "--json"]);
        let reports: Vec<Value> = serde_json::from_str(&out).unwrap();
        let report = &reports[0]["report"];
        assert!(report["problems"].as_array().unwrap().is_empty(), "{out}");
        assert!(
            report["unreferenced_objects"]
                .as_array()
                .unwrap()
                .is_empty(),
            "{point}: {out}"
        );
    }
}

#[test]
fn a_lazy_rank_killed_part_way_leaves_a_consistent_archive_and_runs_again_on_file() {
    killed_lazy_rank_runs_again(&|| None);
}

#[test]
fn a_lazy_rank_killed_part_way_leaves_a_consistent_archive_and_runs_again_on_the_gateway() {
    if s3_archive("rank").is_some() {
        killed_lazy_rank_runs_again(&|| s3_archive("rank"));
    }
}

/// `grove archive restore` while `grove serve` holds the pool: the daemon
/// restores, and the restored snapshot hashes (through the daemon) as
/// recorded at push; a restore whose name is taken is refused in one line.
#[test]
fn a_restore_goes_through_the_daemon_that_holds_the_pool() {
    let pool = Pool::new(None);
    for day in 0..4 {
        pool.day(day);
    }
    let first = pool.listing()[0].clone();
    let name = first["name"].as_str().unwrap();
    assert!(!pool.ok(&["list"]).contains(name), "the pool pruned it");
    let mut child = pool.serve_without_scheduler();
    let out = pool.ok(&["archive", "restore", name, "back"]);
    assert!(out.contains("restored"), "{out}");
    assert_eq!(pool.hash("back"), first["hash"].as_str().unwrap());
    let again = pool.run(&["archive", "restore", name, "back"]);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(
        !again.status.success() && stderr.lines().count() == 1 && stderr.contains("already exists"),
        "{stderr}"
    );
    stop_daemon(&mut child);
    assert_eq!(pool.hash("back"), first["hash"].as_str().unwrap());
}

/// `grove prune` by hand between a snapshot and its push keeps what the
/// archive's policy wants and has not got, and says so; once pushed, the
/// same snapshots are pruned; `--ignore-archive` prunes them unpushed.
#[test]
fn prune_keeps_snapshots_the_archive_wants_until_they_are_pushed() {
    let pool = Pool::new(None);
    let snapshot_on = |day: u64| {
        pool.write_random(((day * 7) % 1900) * 4096, 8192, day + 200);
        let now = at(MONDAY + day * DAY + 3600);
        pool.ok(&["snapshot", "--auto", "vm", "--now", &now]);
    };
    let named = |out: &str, verb: &str| -> Vec<String> {
        out.lines()
            .filter_map(|l| l.strip_prefix(verb))
            .map(|rest| rest.split([':', ' ']).next().unwrap().to_string())
            .collect()
    };
    for day in 0..4 {
        snapshot_on(day);
    }
    let day3 = at(MONDAY + 3 * DAY + 3600);
    let out = pool.ok(&["prune", "--now", &day3]);
    let kept = named(&out, "kept ");
    assert!(
        !kept.is_empty() && named(&out, "removed ").is_empty(),
        "{out}"
    );
    assert!(out.contains("not pushed yet"), "{out}");
    let listed = pool.ok(&["list"]);
    assert!(kept.iter().all(|k| listed.contains(k.as_str())), "{listed}");
    let dry = pool.ok(&["prune", "--now", &day3, "--dry-run", "--ignore-archive"]);
    assert_eq!(named(&dry, "would remove "), kept, "{dry}");
    pool.ok(&["archive", "push"]);
    let out = pool.ok(&["prune", "--now", &day3]);
    assert_eq!(named(&out, "removed "), kept, "{out}");
    assert!(named(&out, "kept ").is_empty(), "{out}");
    let archived: Vec<Value> = pool.listing().iter().map(|s| s["name"].clone()).collect();
    assert!(kept
        .iter()
        .all(|k| archived.contains(&Value::from(k.as_str()))));
    // Three more days unpushed: --ignore-archive prunes one the archive lacks.
    for day in 4..7 {
        snapshot_on(day);
    }
    let day6 = at(MONDAY + 6 * DAY + 3600);
    let out = pool.ok(&["prune", "--now", &day6, "--ignore-archive"]);
    let removed = named(&out, "removed ");
    assert!(named(&out, "kept ").is_empty(), "{out}");
    let unpushed: Vec<&String> = removed
        .iter()
        .filter(|r| !archived.contains(&Value::from(r.as_str())))
        .collect();
    assert!(!unpushed.is_empty(), "{out}");
    let listed = pool.ok(&["list"]);
    assert!(
        unpushed.iter().all(|r| !listed.contains(r.as_str())),
        "{listed}"
    );
}
