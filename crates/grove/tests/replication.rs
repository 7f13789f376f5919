//! Replication end to end with the real binary: damaged streams are
//! refused without leaving a snapshot, a receive killed anywhere (from a
//! pipe or a stored stream) resumes to a verified snapshot having re-sent
//! a bounded amount, a served pool receives while NBD clients write,
//! streams stored at file:// (and, when configured, s3://) URLs round-trip
//! and resume an interrupted upload, and `grove send | ssh HOST grove
//! receive` works through a real sshd. NBD clients are the real fio; a
//! test that needs a missing tool or service skips visibly, and under
//! scripts/test.sh ($GROVE_REQUIRE_TOOLS) fails instead.

mod support;
use support::{have, GroveOnPool, Reaped, TempPool as Pool};

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

const GROVE: &str = env!("CARGO_BIN_EXE_grove");
const MIB: usize = 1 << 20;
/// Frame layout (crates/grove-send/src/format.rs): type, body length, body,
/// crc32c.
const FRAME_HEAD_BYTES: usize = 5;
const FRAME_CRC_BYTES: usize = 4;
const TYPE_DATA: u8 = 3;
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Most stream bytes a resume may send again after a kill anywhere: the
/// receiver runs at most 5 MiB ahead of its last durable commit
/// (grove-send's `UNDURABLE_BYTES_MAX`), and up to 1 MiB may sit in the
/// pipe, 256 KiB in the receiver's read buffer and 1 MiB in the frame
/// being decoded.
const RESENT_BYTES_MAX: i64 = 8 << 20;

/// xorshift64: a small seeded generator, so a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n + 8);
        while out.len() < n {
            out.extend_from_slice(&self.next().to_le_bytes());
        }
        out.truncate(n);
        out
    }
}

fn require_tools() -> bool {
    std::env::var_os("GROVE_REQUIRE_TOOLS").is_some_and(|v| v != "0")
}

fn skip(what: &str) {
    if require_tools() {
        panic!("{what}, and GROVE_REQUIRE_TOOLS is set");
    }
    eprintln!("SKIP: {what}");
    println!("SKIP: {what}");
}

impl Pool {
    fn has_volume(&self, name: &str) -> bool {
        self.list().iter().any(|v| v["name"] == name)
    }

    fn hash(&self, name: &str) -> String {
        self.ok(&["hash", name])
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    }

    /// Writes `bytes` into `volume` at `offset` with `grove write`.
    fn write(&self, volume: &str, offset: usize, bytes: &[u8]) {
        let path = self.file("write.tmp");
        std::fs::write(&path, bytes).unwrap();
        self.ok(&[
            "write",
            volume,
            "--offset",
            &offset.to_string(),
            path.to_str().unwrap(),
        ]);
        std::fs::remove_file(path).unwrap();
    }

    /// `grove receive --status NAME`: the resume token, if a partial is kept.
    fn status(&self, name: &str) -> Option<String> {
        let output = self.run(&["receive", "--status", name]);
        output
            .status
            .success()
            .then(|| token_in(&String::from_utf8_lossy(&output.stdout)).unwrap())
    }
}

/// The first `grove1-...` token in `text`.
fn token_in(text: &str) -> Option<String> {
    let at = text.find("grove1-")?;
    let token: String = text[at..]
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != '`' && *c != '"' && *c != '\'')
        .collect();
    Some(token)
}

/// A pool with volume `v` of `size` MiB holding random data, and snapshot
/// v@1 of it; returns the pool and the full stream of v@1.
fn source(size_mib: usize, runs: &[(usize, usize)], seed: u64) -> (Pool, Vec<u8>) {
    let pool = Pool::init(&[]);
    pool.ok(&["create", "v", "--size", &format!("{size_mib}M")]);
    let mut rng = Rng(seed);
    for &(offset, length) in runs {
        pool.write("v", offset, &rng.bytes(length));
    }
    pool.ok(&["snapshot", "v", "v@1"]);
    let stream = pool.file("full.stream");
    pool.ok(&["send", "v@1", "-o", stream.to_str().unwrap()]);
    let bytes = std::fs::read(&stream).unwrap();
    (pool, bytes)
}

/// Frames of a stream as (start, end) byte ranges, found by their length
/// fields.
fn frames(stream: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < stream.len() {
        let length = u32::from_le_bytes(stream[at + 1..at + 5].try_into().unwrap()) as usize;
        let end = at + FRAME_HEAD_BYTES + length + FRAME_CRC_BYTES;
        assert!(end <= stream.len(), "frame at {at} runs past the stream");
        out.push((at, end));
        at = end;
    }
    out
}

#[test]
fn damaged_streams_are_refused_and_leave_nothing_visible() {
    let runs = [
        (0, 300 * 1024),
        (3 * MIB + 4096, 1536 * 1024),
        (9 * MIB, 64 * 1024),
        (16 * MIB - 512 * 1024, 512 * 1024),
    ];
    let (a, full) = source(16, &runs, 0x9e37_79b9_7f4a_7c15);
    let layout = frames(&full);
    let data: Vec<(usize, usize)> = layout
        .iter()
        .copied()
        .filter(|&(start, _)| full[start] == TYPE_DATA)
        .collect();
    assert!(data.len() >= 3, "expected several Data frames: {layout:?}");

    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut damaged: Vec<(String, Vec<u8>)> = Vec::new();
    for _ in 0..110 {
        let mut copy = full.clone();
        let offset = rng.below(copy.len() as u64) as usize;
        let bit = rng.below(8);
        copy[offset] ^= 1 << bit;
        damaged.push((format!("bit {bit} flipped at byte {offset}"), copy));
    }
    for _ in 0..70 {
        let length = rng.below(full.len() as u64) as usize;
        damaged.push((
            format!("truncated to {length} bytes"),
            full[..length].to_vec(),
        ));
    }
    let mut pairs = Vec::new();
    for i in 0..data.len() {
        for j in i + 1..data.len() {
            pairs.push((i, j));
        }
    }
    for &(i, j) in pairs.iter().cycle().take(20) {
        let (first, second) = (data[i], data[j]);
        let mut copy = full[..first.0].to_vec();
        copy.extend_from_slice(&full[second.0..second.1]);
        copy.extend_from_slice(&full[first.1..second.0]);
        copy.extend_from_slice(&full[first.0..first.1]);
        copy.extend_from_slice(&full[second.1..]);
        assert_eq!(copy.len(), full.len());
        damaged.push((format!("Data frames {i} and {j} swapped"), copy));
    }

    let b = Pool::init(&[]);
    let (mut tried, mut refused, mut partials) = (0, 0, 0);
    for (what, stream) in &damaged {
        tried += 1;
        let path = b.file("damaged.stream");
        std::fs::write(&path, stream).unwrap();
        let output = b.run(&["receive", "r@1", path.to_str().unwrap()]);
        assert!(
            !output.status.success(),
            "a stream with {what} was received: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        refused += 1;
        assert!(
            !b.has_volume("r@1"),
            "after a refused stream ({what}) the list shows r@1"
        );
        if b.status("r@1").is_some() {
            // A refused stream may keep what arrived before the damage
            // for a resume; dropped here so the next stream starts afresh.
            partials += 1;
            b.ok(&["receive", "--abort", "r@1"]);
            assert!(b.status("r@1").is_none(), "--abort left r@1 ({what})");
        }
    }

    // An incremental stream whose base the receiver lacks.
    a.write("v", 8 * MIB, b"changed");
    a.ok(&["snapshot", "v", "v@2"]);
    let incremental = a.file("incremental.stream");
    a.ok(&[
        "send",
        "v@2",
        "--from",
        "v@1",
        "-o",
        incremental.to_str().unwrap(),
    ]);
    tried += 1;
    let output = b.run(&["receive", "r@2", incremental.to_str().unwrap()]);
    assert!(!output.status.success());
    refused += 1;
    assert!(!b.has_volume("r@2"));
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    let base = a.list().into_iter().find(|v| v["name"] == "v@1").unwrap();
    let guid = base["guid"]
        .as_str()
        .unwrap_or_else(|| panic!("no guid in the list entry {base}"))
        .to_string();
    assert!(stderr.contains("v@1"), "the error names no base: {stderr}");
    assert!(
        stderr.to_lowercase().contains(&guid.to_lowercase()),
        "the error lacks the base's GUID {guid}: {stderr}"
    );
    assert!(
        stderr.contains("send a full stream") || stderr.contains("grove send"),
        "the error says not what to send instead: {stderr}"
    );
    println!(
        "damaged streams: tried {tried}, refused {refused} ({partials} left a partial receive); stream {} bytes, {} frames",
        full.len(),
        layout.len()
    );
    println!("wrong-base error: {}", stderr.trim());
    assert_eq!(tried, refused);
}

#[test]
fn abort_drops_a_partial_receive() {
    let (_a, full) = source(16, &[(0, 3 * MIB)], 7);
    let b = Pool::init(&[]);
    let truncated = b.file("truncated.stream");
    std::fs::write(&truncated, &full[..full.len() / 2]).unwrap();
    let output = b.run(&["receive", "r@1", truncated.to_str().unwrap()]);
    assert!(!output.status.success());
    assert!(b.status("r@1").is_some(), "no partial receive kept");
    b.ok(&["receive", "--abort", "r@1"]);
    assert!(b.status("r@1").is_none());
    assert!(!b.has_volume("r@1"));
}

/// Spawns `grove receive NAME -` on `pool` reading from a pipe.
fn spawn_receive(pool: &Pool, name: &str) -> Child {
    pool.command(&["receive", name, "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Pool `a` with a 64 MiB volume of random data and snapshot v@1: its
/// full stream and its content digest.
fn killed_source(rng: &mut Rng) -> (Pool, Vec<u8>, String) {
    let a = Pool::init(&[]);
    a.ok(&["create", "v", "--size", "64M"]);
    a.write("v", 0, &rng.bytes(64 * MIB));
    a.ok(&["snapshot", "v", "v@1"]);
    let stream_path = a.file("stream");
    a.ok(&["send", "v@1", "-o", stream_path.to_str().unwrap()]);
    let full = std::fs::read(&stream_path).unwrap();
    let expected = a.hash("v@1");
    (a, full, expected)
}

/// After a receive of `full` into `b` was killed with `fed` stream bytes
/// given to it: resumes it (with the token it kept, or the whole stream
/// when it kept nothing), checks the result and the amount sent again,
/// and returns that amount.
fn resume_after_kill(
    a: &Pool,
    b: &Pool,
    full: &[u8],
    fed: usize,
    expected: &str,
    what: &str,
) -> i64 {
    assert!(!b.has_volume("r@1"), "{what}: r@1 is visible after a kill");
    let rest = b.file("rest");
    let kept = b.status("r@1");
    let had_partial = kept.is_some();
    match kept {
        Some(token) => {
            a.ok(&["send", "--resume", &token, "-o", rest.to_str().unwrap()]);
        }
        None => {
            // Killed before any of it was kept: the whole stream again.
            std::fs::write(&rest, full).unwrap();
        }
    }
    let rest_len = std::fs::metadata(&rest).unwrap().len() as i64;
    let missing = (full.len() - fed) as i64;
    let resent = rest_len - missing;
    println!(
        "{what}: killed after feeding {fed} of {} stream bytes; rest is {rest_len} bytes; re-sent {resent} bytes (partial kept: {had_partial})",
        full.len()
    );
    assert!(
        resent <= RESENT_BYTES_MAX,
        "{what}: a resume after a kill at {fed} bytes sent {resent} bytes again (at most {RESENT_BYTES_MAX})"
    );
    b.ok(&["receive", "r@1", rest.to_str().unwrap()]);
    assert_eq!(
        b.hash("r@1"),
        expected,
        "{what}: the resumed receive differs"
    );
    resent
}

#[test]
fn a_receive_killed_anywhere_resumes_to_a_verified_snapshot() {
    let mut rng = Rng(0xdead_beef_cafe_f00d);
    let (a, full, expected) = killed_source(&mut rng);

    let mut largest_resent: i64 = 0;
    for round in 0..8 {
        let b = Pool::init(&[]);
        // Half the kills early, where a receive has not yet committed
        // once (and a resume sends the whole stream again).
        let fed = if round % 2 == 0 {
            1 + rng.below(12 * MIB as u64) as usize
        } else {
            1 + rng.below(full.len() as u64 - 1) as usize
        };
        let mut child = spawn_receive(&b, "r@1");
        let mut stdin = child.stdin.take().unwrap();
        // Feed `fed` bytes, then kill -9 the receiver while it works.
        let mut written = 0;
        while written < fed {
            let end = (written + 64 * 1024).min(fed);
            if stdin.write_all(&full[written..end]).is_err() {
                break;
            }
            written = end;
        }
        child.kill().unwrap();
        let _ = child.wait().unwrap();
        drop(stdin);
        let resent = resume_after_kill(&a, &b, &full, fed, &expected, &format!("round {round}"));
        largest_resent = largest_resent.max(resent);
    }

    // The sender killed mid-stream: the receiver sees a truncated stream
    // and names the token; the resumed send completes it.
    let b = Pool::init(&[]);
    let mut sender = a
        .command(&["send", "v@1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut receiver = spawn_receive(&b, "r@1");
    let mut from = sender.stdout.take().unwrap();
    let mut to = receiver.stdin.take().unwrap();
    let cut = full.len() / 3 + rng.below(full.len() as u64 / 3) as usize;
    let mut moved = 0;
    let mut buf = vec![0u8; 64 * 1024];
    while moved < cut {
        let n = from.read(&mut buf).unwrap();
        assert!(n > 0, "the sender ended early");
        to.write_all(&buf[..n]).unwrap();
        moved += n;
    }
    sender.kill().unwrap();
    sender.wait().unwrap();
    drop(from);
    drop(to);
    let output = receiver.wait_with_output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(
        stderr.contains("grove send --resume grove1-"),
        "no token in the receiver's error: {stderr}"
    );
    let token = token_in(&stderr).unwrap();
    let rest = b.file("rest");
    a.ok(&["send", "--resume", &token, "-o", rest.to_str().unwrap()]);
    let rest_len = std::fs::metadata(&rest).unwrap().len() as i64;
    let resent = rest_len - (full.len() - moved) as i64;
    println!("sender killed after {moved} bytes; rest is {rest_len} bytes; re-sent {resent} bytes");
    assert!(
        resent <= RESENT_BYTES_MAX,
        "a resume after the sender's kill at {moved} bytes sent {resent} bytes again"
    );
    largest_resent = largest_resent.max(resent);
    b.ok(&["receive", "r@1", rest.to_str().unwrap()]);
    assert_eq!(b.hash("r@1"), expected);
    println!("largest re-sent amount: {largest_resent} bytes (bound {RESENT_BYTES_MAX})");
}

/// Debug builds' pause before each of a receive's progress commits
/// (grove-send's test hook): a slow disk.
const COMMIT_DELAY_ENV: &str = "GROVE_TEST_RECEIVE_COMMIT_DELAY_MS";

/// A receive whose commits lag (each waits 300 ms) is fed as fast as it
/// reads and killed at a random moment: it must have stopped reading
/// while its commits caught up, so that a resume still sends at most
/// `RESENT_BYTES_MAX` again. Without the back-pressure it would run two
/// commit intervals ahead and re-send more than that.
#[test]
fn a_receive_with_slow_commits_killed_resends_a_bounded_amount() {
    let mut rng = Rng(0x5105_c0aa_17ed_0001);
    let (a, full, expected) = killed_source(&mut rng);
    let full = std::sync::Arc::new(full);
    let mut largest_resent: i64 = 0;
    for round in 0..4 {
        let b = Pool::init(&[]);
        let mut child = b
            .command(&["receive", "r@1", "-"])
            .env(COMMIT_DELAY_ENV, "300")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        // Counted before each write: `fed` may exceed what the receiver
        // took by one piece, which only overstates what is sent again.
        let fed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let feeder = {
            let (full, fed) = (full.clone(), fed.clone());
            std::thread::spawn(move || {
                for piece in full.chunks(64 * 1024) {
                    fed.fetch_add(piece.len(), std::sync::atomic::Ordering::SeqCst);
                    if stdin.write_all(piece).is_err() {
                        return;
                    }
                }
            })
        };
        std::thread::sleep(Duration::from_millis(300 + rng.below(1200)));
        child.kill().unwrap();
        let _ = child.wait().unwrap();
        feeder.join().unwrap();
        let fed = fed.load(std::sync::atomic::Ordering::SeqCst);
        assert!(
            fed < full.len(),
            "round {round}: the whole stream went in before the kill"
        );
        let resent = resume_after_kill(
            &a,
            &b,
            &full,
            fed,
            &expected,
            &format!("slow commits, round {round}"),
        );
        largest_resent = largest_resent.max(resent);
    }
    println!("largest re-sent amount with slow commits: {largest_resent} bytes (bound {RESENT_BYTES_MAX})");
}

/// `grove serve` on a pool, killed on drop.
fn serve(pool: &Pool) -> Reaped {
    let sockets = ["nbd.sock", "grove.control"];
    pool.spawn_serving(pool.command(&["serve"]), &sockets, STARTUP_TIMEOUT)
}

#[test]
fn receive_into_a_served_pool_while_clients_write() {
    if !have("fio") {
        return;
    }
    let runs = [(0, 24 * MIB), (40 * MIB, 24 * MIB)];
    let (a, _) = source(64, &runs, 0x1234_5678_9abc_def1);
    let stream_path = a.path.join("full.stream");
    a.ok(&["send", "v@1", "-o", stream_path.to_str().unwrap()]);
    let stream = std::fs::read(&stream_path).unwrap();
    let b = Pool::init(&[]);
    b.ok(&["create", "disk", "--size", "64M"]);
    let _server = serve(&b);
    let uri = format!(
        "nbd+unix:///disk?socket={}",
        b.path.join("nbd.sock").display()
    );

    // fio writes random blocks and reads them back verified, pass after
    // pass, for as long as the receive runs.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let client = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut passes = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || passes == 0 {
                let output = Command::new("fio")
                    .args([
                        "--name=during-receive",
                        "--ioengine=nbd",
                        &format!("--uri={uri}"),
                    ])
                    .args(["--rw=randwrite", "--bs=4k", "--size=8M", "--iodepth=8"])
                    .args(["--verify=crc32c", "--verify_fatal=1", "--do_verify=1"])
                    .arg(format!("--randseed={}", passes + 1))
                    .output()
                    .unwrap();
                assert!(
                    output.status.success(),
                    "fio: {}{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                );
                passes += 1;
            }
            passes
        })
    };

    // The stream is fed in small pieces, so that the receive lasts while
    // fio runs several passes.
    let mut receiver = b
        .command(&["receive", "r@1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        let mut stdin = receiver.stdin.take().unwrap();
        for piece in stream.chunks(MIB) {
            stdin.write_all(piece).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
    }
    let output = receiver.wait_with_output().unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let passes = client.join().unwrap();
    assert!(
        output.status.success(),
        "receive into the served pool failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    println!(
        "served receive: {}; verified fio passes meanwhile: {passes}",
        String::from_utf8_lossy(&output.stdout).trim()
    );
    assert!(
        passes >= 2,
        "fio ran only {passes} pass(es) during the receive"
    );
    assert_eq!(b.hash("r@1"), a.hash("v@1"));
}

/// The stream bytes a finished receive read, from its summary line
/// ("received ... (..., N stream bytes), content digest verified").
fn stream_bytes_read(summary: &str) -> u64 {
    let before = &summary[..summary
        .find(" stream bytes")
        .unwrap_or_else(|| panic!("no stream bytes in {summary:?}"))];
    before
        .rsplit(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("no stream bytes in {summary:?}"))
}

/// The progress a resume token carries: bytes of the section's target
/// held (token bytes: version, flags, three GUIDs, then the progress).
fn token_progress(token: &str) -> u64 {
    let hex = token.strip_prefix("grove1-").unwrap();
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    u64::from_le_bytes(bytes[50..58].try_into().unwrap())
}

/// Part size asked of uploads in the URL tests; grove raises it to room
/// for two of the largest frames.
const TEST_PART_BYTES: &str = "1048576";
/// The largest stored part then: two frames of 1 MiB of data.
const TEST_PART_BYTES_MAX: u64 = 2 * ((1 << 20) + 8 + 9);

/// `grove receive r@1 --from URL` into fresh pools, each killed at a
/// random moment within the time an uncut receive takes, then run again:
/// the second run starts at the stored part holding the progress (when
/// the first kept any), reads at most one part again, and ends with the
/// snapshot's content digest.
fn killed_receive_from_url_resumes(a: &Pool, url: &str, seed: u64) {
    let expected = a.hash("v@1");
    let started = Instant::now();
    let uncut = Pool::init(&[]);
    let summary = uncut.ok(&["receive", "r@1", "--from", url]);
    let uncut_time = started.elapsed();
    assert_eq!(uncut.hash("r@1"), expected);
    let full = stream_bytes_read(&summary);

    let mut rng = Rng(seed);
    let (mut cut, mut resumed, mut largest_reread) = (0, 0, 0i64);
    for round in 0..6 {
        if cut == 3 {
            break;
        }
        let b = Pool::init(&[]);
        let mut child = b
            .command(&["receive", "r@1", "--from", url])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let fraction = 0.1 + rng.below(50) as f64 / 100.0;
        std::thread::sleep(uncut_time.mul_f64(fraction));
        if child.try_wait().unwrap().is_some() {
            println!("{url}: round {round}: the receive finished before the kill at {fraction:.2} of {uncut_time:?}; again");
            continue;
        }
        child.kill().unwrap();
        child.wait().unwrap();
        if b.has_volume("r@1") {
            // The kill landed after the receive's last commit, while it
            // was closing the pool: the snapshot must then be whole.
            assert_eq!(
                b.hash("r@1"),
                expected,
                "{url}: round {round}: a kill after the commit"
            );
            assert!(
                b.status("r@1").is_none(),
                "{url}: a partial receive is left beside r@1"
            );
            println!("{url}: round {round}: the kill at {fraction:.2} of {uncut_time:?} came after the commit; again");
            continue;
        }
        cut += 1;
        let progress = b.status("r@1").map(|token| token_progress(&token));

        let output = b.run(&["receive", "r@1", "--from", url]);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
        );
        assert!(
            output.status.success(),
            "{url}: the receive after the kill failed: {stdout}{stderr}"
        );
        assert_eq!(b.hash("r@1"), expected, "{url}: round {round}");
        assert!(
            b.status("r@1").is_none(),
            "{url}: a partial receive is left"
        );
        let read = stream_bytes_read(&stdout);
        match progress {
            Some(progress) => {
                resumed += 1;
                assert!(
                    stderr.contains(&format!("resuming at {progress} bytes")),
                    "{url}: the second receive did not resume at {progress}: {stderr}"
                );
                // Stream bytes past the progress are at least the volume
                // bytes past it: anything above is read again.
                let reread = read as i64 - (full - progress) as i64;
                largest_reread = largest_reread.max(reread);
                println!(
                    "{url}: round {round}: killed at {fraction:.2} of {uncut_time:?} holding {progress} bytes; the resume read {read} of {full} stream bytes ({reread} again)"
                );
                assert!(
                    read < full && reread <= (TEST_PART_BYTES_MAX + MIB as u64) as i64,
                    "{url}: the resume read {read} stream bytes, {reread} of them again"
                );
            }
            None => {
                println!(
                    "{url}: round {round}: killed at {fraction:.2} of {uncut_time:?} before any progress was kept; received again whole"
                );
                assert_eq!(read, full);
            }
        }
    }
    assert_eq!(cut, 3, "{url}: fewer than 3 receives were cut by the kill");
    assert!(
        resumed >= 1,
        "{url}: no killed receive had kept progress to resume from"
    );
    println!("{url}: {resumed} of {cut} killed receives resumed; largest read again {largest_reread} bytes");
}

/// S3's test bucket and a fresh prefix in it, when the gateway is
/// configured (scripts/ceph.sh env); otherwise a visible skip.
fn s3_prefix(what: &str) -> Option<String> {
    match (
        std::env::var("AWS_ENDPOINT_URL"),
        std::env::var("GROVE_TEST_S3_BUCKET"),
    ) {
        (Ok(_), Ok(bucket)) => Some(format!(
            "s3://{bucket}/grove-replication-test-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        )),
        _ => {
            skip(&format!(
                "AWS_ENDPOINT_URL and GROVE_TEST_S3_BUCKET are not set (scripts/ceph.sh env); skipping {what}"
            ));
            None
        }
    }
}

#[test]
fn a_receive_from_a_url_killed_resumes_to_a_verified_snapshot() {
    let (a, _) = source(48, &[(0, 40 * MIB)], 0x0f11_e5ee_d000_0001);
    let store = a.file("store");
    std::fs::create_dir_all(&store).unwrap();
    let mut urls = vec![format!("file://{}/s1", store.display())];
    if let Some(prefix) = s3_prefix("the s3:// part") {
        urls.push(format!("{prefix}/s1"));
    }
    for (i, url) in urls.iter().enumerate() {
        let output = a
            .command(&["send", "v@1", "--to", url])
            .env("GROVE_STREAM_PART_BYTES", TEST_PART_BYTES)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        killed_receive_from_url_resumes(&a, url, 0x00c0_ffee + i as u64);
    }
}

/// The stored parts of the stream at `url` (s3:// or file://), and
/// whether it is marked complete.
fn stored_parts(url: &str) -> (usize, bool) {
    let (parent, name) = url.rsplit_once('/').unwrap();
    let store = grove_objects::StreamStore::open(parent).unwrap();
    let listing = store.parts(name).unwrap();
    (listing.parts.len(), listing.complete)
}

/// Sends v@1 to `url` and kills the sender once three parts are stored,
/// which must leave the upload incomplete; sends again, which must store
/// only the rest; receives from the URL and compares hashes.
fn interrupted_upload_round_trip(a: &Pool, url: &str) {
    let mut sender = a
        .command(&["send", "v@1", "--to", url])
        .env("GROVE_STREAM_PART_BYTES", TEST_PART_BYTES)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        if let Some(status) = sender.try_wait().unwrap() {
            panic!("{url}: the first send ended ({status}) before three parts were seen: it was never cut");
        }
        if stored_parts(url).0 >= 3 {
            sender.kill().unwrap();
            sender.wait().unwrap();
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{url}: no three parts stored in 30 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let (parts_before, complete) = stored_parts(url);
    assert!(
        !complete,
        "{url}: the upload is complete after the kill: the first send was not cut"
    );
    let output = a
        .command(&["send", "v@1", "--to", url])
        .env("GROVE_STREAM_PART_BYTES", TEST_PART_BYTES)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "the second send failed: {text}");
    println!(
        "{url}: first send killed with {parts_before} parts stored; second send said: {}",
        text.trim()
    );
    assert!(
        text.contains(&format!(
            "holds {parts_before} part(s) of this stream; sending the rest"
        )),
        "{url}: the second send did not continue after the {parts_before} stored parts: {text}"
    );
    let (parts_after, complete) = stored_parts(url);
    assert!(
        complete && parts_after > parts_before,
        "{url}: {parts_after} parts, complete: {complete}"
    );
    let b = Pool::init(&[]);
    b.ok(&["receive", "r@1", "--from", url]);
    assert_eq!(b.hash("r@1"), a.hash("v@1"));
}

#[test]
fn streams_round_trip_through_file_urls_and_an_interrupted_upload_resumes() {
    let (a, _) = source(48, &[(0, 40 * MIB)], 0x0bad_5eed_0bad_5eed);
    let store = a.file("store");
    std::fs::create_dir_all(&store).unwrap();
    interrupted_upload_round_trip(&a, &format!("file://{}/s1", store.display()));
    if let Some(prefix) = s3_prefix("the s3:// part") {
        interrupted_upload_round_trip(&a, &format!("{prefix}/s1"));
    }
}

/// Sends `args` from `from` into a file, then receives it into `to` as
/// `name`; returns the receive's output.
fn pipe(from: &Pool, args: &[&str], to: &Pool, name: &str) -> Output {
    let stream = from.file("pipe.stream");
    let mut send = args.to_vec();
    send.extend(["-o", stream.to_str().unwrap()]);
    from.ok(&send);
    to.run(&["receive", name, stream.to_str().unwrap()])
}

#[test]
fn cursors_ranges_and_a_missing_base_name_what_to_send() {
    let (a, _) = source(8, &[(0, MIB)], 0x5eed_0001);
    let mut rng = Rng(7);
    for i in 2..=4 {
        a.write("v", i * MIB, &rng.bytes(MIB / 2));
        a.ok(&["snapshot", "v", &format!("v@{i}")]);
    }
    let b = Pool::init(&[]);
    // A full send starts the cursor; the next one goes from it.
    let out = pipe(&a, &["send", "v@1", "--cursor", "b"], &b, "v@1");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listing = a.ok(&["list"]);
    assert!(
        listing.contains(r#"cursor "b": last sent "v@1""#),
        "{listing}"
    );
    let out = pipe(&a, &["send", "v@3", "--cursor", "b"], &b, "v@3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The cursor holds its snapshot: listed among the holds, and refused
    // to rm without --force (issue 35: neither was true).
    let holds: Value = serde_json::from_str(&a.ok(&["holds", "--json"])).unwrap();
    let cursor_hold = holds
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["tag"] == "cursor:b")
        .unwrap_or_else(|| panic!("no cursor hold in {holds}"));
    assert_eq!(cursor_hold["snapshot"], "v@3", "{holds}");
    let refused = a.run(&["rm", "v@3"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("is held (cursor:b)") && stderr.contains("--force"),
        "{stderr}"
    );
    assert!(a.has_volume("v@3"));
    // Forced, the snapshot goes and the cursor still carries the next
    // incremental.
    a.ok(&["rm", "--force", "v@3"]);
    let listing = a.ok(&["list"]);
    assert!(listing.contains("kept as a bookmark"), "{listing}");
    let out = pipe(&a, &["send", "v@4", "--cursor", "b"], &b, "v@4");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(a.hash("v@4"), b.hash("v@4"));
    // Releasing a cursor's hold drops the cursor, and its snapshot is then
    // an ordinary one.
    a.ok(&["release", "v@4", "cursor:b"]);
    assert!(!a.ok(&["list"]).contains(r#"cursor "b""#));
    assert!(!a.ok(&["holds"]).contains("cursor:b"));

    // A range (`--from BASE..`) makes every snapshot between, named under
    // the receiver's prefix.
    let c = Pool::init(&[]);
    assert!(pipe(&a, &["send", "v@1"], &c, "c@1").status.success());
    let out = pipe(&a, &["send", "v@4", "--from", "v@1.."], &c, "c@4");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(c.has_volume("c@2") && c.has_volume("c@4"));
    assert_eq!(c.hash("c@2"), a.hash("v@2"));
    assert_eq!(c.hash("c@4"), a.hash("v@4"));

    // Missing base: one line naming it and an earlier snapshot both hold.
    let d = Pool::init(&[]);
    assert!(pipe(&a, &["send", "v@1"], &d, "d@1").status.success());
    let out = pipe(&a, &["send", "v@4", "--from", "v@2"], &d, "x@4");
    assert!(!out.status.success());
    let error = String::from_utf8_lossy(&out.stderr);
    assert_eq!(error.trim().lines().count(), 1, "{error}");
    assert!(
        error.contains(r#"snapshot "v@2""#)
            && error.contains("send --from v@1 instead")
            && error.contains(r#"as "d@1""#),
        "{error}"
    );
    assert!(!d.has_volume("x@4"));
}

/// A token whose bytes are edited (and its checksum made to match again)
/// to name another snapshot is refused by the sending pool, as is a token
/// taken to another pool; the token as given still works.
#[test]
fn an_edited_resume_token_sends_nothing() {
    let (a, full) = source(16, &[(0, 6 * MIB)], 11);
    a.ok(&["snapshot", "v", "v@other"]);
    let other_guid = a.list().iter().find(|v| v["name"] == "v@other").unwrap()["guid"]
        .as_str()
        .unwrap()
        .to_string();
    let b = Pool::init(&[]);
    let truncated = b.file("truncated.stream");
    std::fs::write(&truncated, &full[..full.len() * 3 / 4]).unwrap();
    assert!(!b
        .run(&["receive", "r@1", truncated.to_str().unwrap()])
        .status
        .success());
    let token = b.status("r@1").expect("a partial receive is kept");

    // Token bytes: version, flags, final target (16), section base (16),
    // section target (16), progress (8), tag (16), then a CRC-32C.
    let hex = token.strip_prefix("grove1-").unwrap();
    let mut bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    for (i, at) in (0..32).step_by(2).enumerate() {
        let byte = u8::from_str_radix(&other_guid[at..at + 2], 16).unwrap();
        bytes[2 + i] = byte;
        bytes[34 + i] = byte;
    }
    let crc = crc32c::crc32c(&bytes[..74]);
    bytes[74..78].copy_from_slice(&crc.to_le_bytes());
    let edited: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let output = a.run(&[
        "send",
        "--resume",
        &format!("grove1-{edited}"),
        "-o",
        "/dev/null",
    ]);
    assert!(!output.status.success());
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(
        error.contains("was not issued for a stream of this pool"),
        "{error}"
    );

    // Another pool does not accept it either.
    let c = Pool::init(&[]);
    let output = c.run(&["send", "--resume", &token, "-o", "/dev/null"]);
    assert!(!output.status.success());

    // The token as given resumes.
    let rest = a.file("rest.stream");
    a.ok(&["send", "--resume", &token, "-o", rest.to_str().unwrap()]);
    b.ok(&["receive", "r@1", rest.to_str().unwrap()]);
    assert_eq!(b.hash("r@1"), a.hash("v@1"));
}

/// How long the test's sshd may take to listen.
const SSHD_STARTUP_TIMEOUT: Duration = Duration::from_secs(10);

/// sshd, wherever it is installed (Debian puts it in /usr/sbin, which a
/// user's PATH may lack).
fn find_sshd() -> Option<PathBuf> {
    let found = Command::new("sh")
        .args(["-c", "command -v sshd"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    found.or_else(|| Some(PathBuf::from("/usr/sbin/sshd")).filter(|p| p.exists()))
}

/// A private sshd on 127.0.0.1 at a free port, run as root with its own
/// host key and one authorized client key, all in a temporary directory;
/// killed on drop.
struct Sshd {
    child: Child,
    dir: TempDir,
    port: u16,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Sshd {
    /// Starts one, or says (visibly) why this machine cannot.
    fn start() -> Option<Sshd> {
        let Some(sshd) = find_sshd() else {
            skip("sshd is not installed; skipping (scripts/test.sh installs openssh-server)");
            return None;
        };
        if !have("ssh") || !have("ssh-keygen") {
            return None;
        }
        if !rustix::process::geteuid().is_root() {
            skip("not root: the test's sshd logs in as root; skipping");
            return None;
        }
        let dir = TempDir::new().unwrap();
        for key in ["host_key", "client_key"] {
            let path = dir.path().join(key);
            let output = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-C", "grove-test", "-f"])
                .arg(&path)
                .output()
                .unwrap();
            assert!(
                output.status.success(),
                "ssh-keygen: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::fs::copy(
            dir.path().join("client_key.pub"),
            dir.path().join("authorized_keys"),
        )
        .unwrap();
        // sshd's privilege separation needs this directory, which only
        // its service (not installed as one here) would make.
        std::fs::create_dir_all("/run/sshd").unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = dir.path().join("sshd_config");
        let d = dir.path().display();
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\n\
                 AuthorizedKeysFile {d}/authorized_keys\nPidFile none\n\
                 StrictModes no\nUsePAM no\nPermitRootLogin prohibit-password\n\
                 PubkeyAuthentication yes\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nAllowUsers root\n"
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("sshd.log")).unwrap();
        let child = Command::new(&sshd)
            .arg("-f")
            .arg(&config)
            .args(["-D", "-e"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut server = Sshd { child, dir, port };
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = server.child.try_wait().unwrap() {
                panic!("sshd exited with {status}: {}", server.log());
            }
            assert!(
                started.elapsed() < SSHD_STARTUP_TIMEOUT,
                "sshd did not listen on port {port} within {SSHD_STARTUP_TIMEOUT:?}: {}",
                server.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(server)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }

    /// `ssh ... root@127.0.0.1 REMOTE`, as a user would type it (with
    /// ssh's own chatter, such as the host key warning, turned off so the
    /// remote side's stderr is all that reaches ours).
    fn ssh(&self, remote: &str) -> Command {
        let mut command = Command::new("ssh");
        command
            .args(["-p", &self.port.to_string(), "-i"])
            .arg(self.dir.path().join("client_key"))
            .args([
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "BatchMode=yes",
                "-o",
                "LogLevel=ERROR",
                "root@127.0.0.1",
                remote,
            ]);
        command
    }
}

/// `grove send ARGS` on `from` piped into `ssh HOST grove --pool TO
/// receive NAME`: the sender's output and ssh's (the remote receive's).
fn send_over_ssh(
    sshd: &Sshd,
    from: &Pool,
    args: &[&str],
    to: &Pool,
    name: &str,
) -> (Output, Output) {
    let mut sender = from
        .command(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let remote = format!("'{GROVE}' --pool '{}' receive '{name}'", to.path.display());
    let ssh = sshd
        .ssh(&remote)
        .stdin(sender.stdout.take().unwrap())
        .output()
        .unwrap();
    let sent = sender.wait_with_output().unwrap();
    (sent, ssh)
}

#[test]
fn send_piped_through_ssh_into_a_remote_receive() {
    let Some(sshd) = Sshd::start() else {
        return;
    };
    let runs = [(0, 5 * MIB), (9 * MIB + 4096, 3 * MIB)];
    let (a, _) = source(16, &runs, 0x55d0_0000_0000_0001);
    let b = Pool::init(&[]);

    // Full.
    let (sent, received) = send_over_ssh(&sshd, &a, &["send", "v@1"], &b, "r@1");
    let text = |o: &Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    assert!(sent.status.success(), "send: {}", text(&sent));
    assert!(
        received.status.success(),
        "ssh ... grove receive: {}\nsshd: {}",
        text(&received),
        sshd.log()
    );
    let said = String::from_utf8_lossy(&received.stdout);
    assert!(
        said.contains(r#"received "r@1""#) && said.contains("content digest verified"),
        "the remote receive's summary did not reach us: {said}"
    );
    assert_eq!(b.hash("r@1"), a.hash("v@1"));
    println!("full over ssh: {}", said.trim());

    // Incremental.
    a.write("v", 2 * MIB, &Rng(3).bytes(MIB));
    a.ok(&["snapshot", "v", "v@2"]);
    let (sent, received) = send_over_ssh(&sshd, &a, &["send", "v@2", "--from", "v@1"], &b, "r@2");
    assert!(sent.status.success(), "send: {}", text(&sent));
    assert!(received.status.success(), "receive: {}", text(&received));
    assert_eq!(b.hash("r@2"), a.hash("v@2"));
    println!(
        "incremental over ssh: {}",
        String::from_utf8_lossy(&received.stdout).trim()
    );

    // A base the far pool lacks: its one-line error comes back over ssh
    // on stderr, and ssh exits with the remote failure.
    let c = Pool::init(&[]);
    let (sent, received) = send_over_ssh(&sshd, &a, &["send", "v@2", "--from", "v@1"], &c, "x@2");
    assert!(
        !received.status.success(),
        "a receive without its base succeeded"
    );
    let error = String::from_utf8_lossy(&received.stderr).to_string();
    let lines: Vec<&str> = error.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "not one line: {error:?}");
    let guid = a.list().into_iter().find(|v| v["name"] == "v@1").unwrap()["guid"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        lines[0].starts_with("grove: error:")
            && lines[0].contains(r#"snapshot "v@1""#)
            && lines[0].to_lowercase().contains(&guid.to_lowercase())
            && lines[0].contains("send a full stream"),
        "{error}"
    );
    assert!(!c.has_volume("x@2"));
    println!(
        "missing base over ssh: ssh exit {:?}, stderr: {}; the sender: {:?}, {}",
        received.status.code(),
        lines[0],
        sent.status.code(),
        String::from_utf8_lossy(&sent.stderr).trim()
    );
}

/// Peak memory a receive or send may take, whatever the stream describes
/// (issue 35): a Zero or Hole record costs a fixed buffer, not its length.
const STREAM_PEAK_RSS_MAX_BYTES: u64 = 64 << 20;

/// Runs `grove ARGS` under python3, which reports the child's peak
/// resident set (getrusage of its one child, so nothing else this test
/// binary runs is counted). Returns the output and the peak in bytes.
fn run_measuring_peak_rss(pool: &Pool, args: &[&str], stdin: Option<&PathBuf>) -> (Output, u64) {
    const MEASURE: &str = "import resource, subprocess, sys\n\
        inp = open(sys.argv[1], 'rb') if sys.argv[1] else subprocess.DEVNULL\n\
        code = subprocess.run(sys.argv[2:], stdin=inp).returncode\n\
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n\
        print(f'peak-kib {peak}', file=sys.stderr)\n\
        sys.exit(code)";
    let input = stdin.map(|p| p.to_str().unwrap().to_string());
    let output = Command::new("python3")
        .args(["-c", MEASURE, input.as_deref().unwrap_or("")])
        .arg(GROVE)
        .arg("--pool")
        .arg(&pool.path)
        .args(args)
        .env_remove("GROVE_POOL")
        .current_dir(pool.dir.path())
        .output()
        .expect("python3 runs (the tests need it to measure memory)");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let peak_kib: u64 = stderr
        .lines()
        .find_map(|line| line.strip_prefix("peak-kib "))
        .unwrap_or_else(|| panic!("no peak reported: {stderr}"))
        .trim()
        .parse()
        .unwrap();
    (output, peak_kib * 1024)
}

/// A VM that zeroes half a GiB makes a tiny incremental stream; sending
/// and receiving it must not take memory in proportion to the range (it
/// took 532 MB of RSS), and neither may a forged full stream whose one
/// Zero record covers 8 GiB.
#[test]
fn zero_and_hole_records_over_large_ranges_take_bounded_memory() {
    const ZEROED: usize = 512 * MIB;
    let (a, full) = source(1024, &[(0, MIB), (100 * MIB, MIB), (700 * MIB, MIB)], 35);
    let b = Pool::init(&[]);
    let full_path = b.file("full.stream");
    std::fs::write(&full_path, &full).unwrap();
    b.ok(&["receive", "r@1", full_path.to_str().unwrap()]);
    // Half a GiB of zeros written over data and holes alike.
    let zeros = a.file("zeros.img");
    std::fs::File::create(&zeros)
        .unwrap()
        .set_len(ZEROED as u64)
        .unwrap();
    a.ok(&["write", "v", "--offset", "0", zeros.to_str().unwrap()]);
    a.ok(&["snapshot", "v", "v@2"]);
    let incremental = a.file("incremental.stream");
    let out = incremental.to_str().unwrap();
    let (sent, send_peak) =
        run_measuring_peak_rss(&a, &["send", "v@2", "--from", "v@1", "-o", out], None);
    assert!(sent.status.success(), "{sent:?}");
    let stream_len = std::fs::metadata(&incremental).unwrap().len();
    assert!(
        stream_len < 64 * 1024,
        "the zeroing took {stream_len} stream bytes"
    );
    let (received, receive_peak) =
        run_measuring_peak_rss(&b, &["receive", "r@2", "-"], Some(&incremental));
    assert!(received.status.success(), "{received:?}");
    assert_eq!(b.hash("r@2"), a.hash("v@2"));
    println!("zeroed 512 MiB: stream {stream_len} B, send peak {send_peak} B, receive peak {receive_peak} B");
    assert!(
        send_peak < STREAM_PEAK_RSS_MAX_BYTES,
        "send took {send_peak} bytes"
    );
    assert!(
        receive_peak < STREAM_PEAK_RSS_MAX_BYTES,
        "receive took {receive_peak} bytes"
    );
    let forged = b.file("forged.stream");
    std::fs::write(&forged, forged_zero_stream(8 << 30)).unwrap();
    let (forged_run, forged_peak) =
        run_measuring_peak_rss(&b, &["receive", "f@1", forged.to_str().unwrap()], None);
    println!("forged 8 GiB Zero record: receive peak {forged_peak} B, {forged_run:?}");
    assert!(
        forged_peak < STREAM_PEAK_RSS_MAX_BYTES,
        "receive took {forged_peak} bytes"
    );
    assert!(forged_run.status.success(), "{forged_run:?}");
    assert_eq!(u64_field(&b, "f@1", "size_bytes"), 8 << 30);
}

fn u64_field(pool: &Pool, name: &str, field: &str) -> u64 {
    let volume = pool.list().into_iter().find(|v| v["name"] == name);
    volume.unwrap_or_else(|| panic!("no {name}"))[field]
        .as_u64()
        .unwrap()
}

/// A well-formed full stream of one snapshot of `size` bytes that holds
/// one Zero record over all of it.
fn forged_zero_stream(size: u64) -> Vec<u8> {
    forged_stream(size, |_| {})
}

/// A change made to a forged stream's Begin frame.
type BeginEdit = fn(&mut grove_send::format::Begin);

/// Forged Begin fields are refused in one line naming the field, and
/// leave nothing.
#[test]
fn forged_begin_fields_are_refused_naming_the_field() {
    let b = Pool::init(&[]);
    let path = b.file("forged.stream");
    let cases: [(&str, BeginEdit); 6] = [
        ("block size is 0 bytes", |b| b.block_size_bytes = 0),
        ("block size is 3000 bytes", |b| b.block_size_bytes = 3000),
        ("block size is 2147483648 bytes", |b| {
            b.block_size_bytes = 1 << 31
        }),
        ("creation time is 18446744073709551615", |b| {
            b.target_created_unix_secs = u64::MAX
        }),
        ("past the largest volume", |b| b.size_bytes = 1 << 60),
        ("GUID is all zeros", |b| b.target_guid = [0; 16]),
    ];
    for (says, edit) in cases {
        std::fs::write(&path, forged_stream(1 << 20, edit)).unwrap();
        let output = b.run(&["receive", "f@1", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{says}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(says), "expected {says:?}: {stderr}");
        assert!(!b.has_volume("f@1") && b.status("f@1").is_none(), "{says}");
    }
    // The same stream unforged is taken.
    std::fs::write(&path, forged_stream(1 << 20, |_| {})).unwrap();
    b.ok(&["receive", "f@1", path.to_str().unwrap()]);
}

/// A full stream of one snapshot of `size` bytes holding one Zero record
/// over all of it, its Begin frame edited by `edit`.
fn forged_stream(size: u64, edit: impl FnOnce(&mut grove_send::format::Begin)) -> Vec<u8> {
    use grove_send::digest::ContentDigest;
    use grove_send::format::{Begin, Finish, Frame, FrameWriter, Header};
    let guid = *b"forged-zero-guid";
    let mut begin = Begin {
        section: 0,
        base_guid: None,
        base_generation: 0,
        target_guid: guid,
        target_generation: 1,
        target_created_unix_secs: 1_700_000_000,
        size_bytes: size,
        block_size_bytes: 4096,
        resume_tag: [7; 16],
        target_name: "f@1".into(),
        base_name: String::new(),
    };
    edit(&mut begin);
    let mut writer = FrameWriter::new(Vec::new());
    let frames = [
        Frame::Header(Header {
            range: false,
            resumed: false,
            sections: 1,
            resumed_offset: 0,
            final_target: guid,
            base_hints: Vec::new(),
        }),
        Frame::Begin(begin),
        Frame::Zero {
            offset: 0,
            length: size,
        },
        Frame::Finish(Finish {
            content_digest: ContentDigest::empty().finish(size),
            data_bytes: 0,
            zero_bytes: size,
            hole_bytes: 0,
        }),
        Frame::End { sections: 1 },
    ];
    for frame in &frames {
        writer.write(frame).unwrap();
    }
    writer.into_inner()
}

/// A stream damaged only after its last Finish record (its end frame cut,
/// its checksum flipped, a wrong section count, a Finish repeated) is
/// refused and leaves nothing: no snapshot, no partial, and the good
/// stream is received afterwards. Garbage is "not a grove stream".
#[test]
fn a_stream_damaged_in_its_trailer_leaves_nothing() {
    use grove_send::format::{Frame, FrameWriter};
    let (a, full) = source(4, &[(0, 300 * 1024), (2 * MIB, MIB)], 0x35);
    // The send's summary says what a full stream left out (it said "0 B
    // of holes as records" for a mostly empty volume).
    let again = a.file("again.stream");
    let sent = a.run(&["send", "v@1", "-o", again.to_str().unwrap()]);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&sent.stdout),
        String::from_utf8_lossy(&sent.stderr)
    );
    assert!(
        said.contains("a full stream of a 4.0 MiB volume: 1.3 MiB of data")
            && said.contains("2.7 MiB unmapped left out"),
        "{said}"
    );
    let layout = frames(&full);
    let (end_start, end_end) = *layout.last().unwrap();
    let (finish_start, _) = layout[layout.len() - 2];
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    cases.push(("end frame cut", full[..end_end - 3].to_vec()));
    cases.push(("end frame missing", full[..end_start].to_vec()));
    let mut flipped = full.clone();
    flipped[end_end - 1] ^= 0x40;
    cases.push(("end frame's checksum flipped", flipped));
    let mut miscounted = full[..end_start].to_vec();
    FrameWriter::new(&mut miscounted)
        .write(&Frame::End { sections: 2 })
        .unwrap();
    cases.push(("a wrong section count", miscounted));
    let mut repeated = full[..end_start].to_vec();
    repeated.extend_from_slice(&full[finish_start..end_start]);
    repeated.extend_from_slice(&full[end_start..]);
    cases.push(("a Finish repeated", repeated));
    let b = Pool::init(&[]);
    let path = b.file("trailer.stream");
    for (what, stream) in &cases {
        std::fs::write(&path, stream).unwrap();
        let output = b.run(&["receive", "r@1", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{what}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{what}: {stderr}");
        assert!(!b.has_volume("r@1"), "{what}: r@1 is visible");
        assert!(b.status("r@1").is_none(), "{what}: a partial is left");
        if *what == "a wrong section count" {
            assert!(
                stderr.contains("its end counts 2 sections, but it held 1"),
                "{stderr}"
            );
        }
    }
    std::fs::write(&path, &full).unwrap();
    b.ok(&["receive", "r@1", path.to_str().unwrap()]);
    assert_eq!(b.hash("r@1"), a.hash("v@1"));
    // Bytes that are no stream at all.
    let mut rng = Rng(0x35_35);
    for garbage in [rng.bytes(4096), b"hello, world\n".to_vec(), Vec::new()] {
        std::fs::write(&path, &garbage).unwrap();
        let output = b.run(&["receive", "g@1", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.starts_with("grove: error: ") && stderr.contains("not a grove stream"),
            "{stderr}"
        );
        assert!(!b.has_volume("g@1") && b.status("g@1").is_none());
    }
}
