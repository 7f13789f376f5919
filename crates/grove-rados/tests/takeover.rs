//! Fenced takeover with two processes standing for two hosts: a child
//! process (this test binary again) holds the device and writes in a loop;
//! it is stopped (SIGSTOP), the parent takes the device over, and the child
//! is resumed. Not one of the child's writes may land after the takeover,
//! and the child must report, in one line, that it was fenced.

mod common;

use common::fresh_target;
use grove_rados::{Claim, RadosDevice, RadosTarget};
use grove_store::BlockDevice;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

/// Names the child's device; set only in the child.
const CHILD_ENV: &str = "GROVE_RADOS_TEST_HOLDER";
/// The blocks the child cycles through, one 4 KiB block each.
const CHILD_BLOCKS: u64 = 64;
const BLOCK: usize = 4096;
/// How long the child writes at most, so that a lost parent cannot leave it
/// running.
const CHILD_LIFETIME: Duration = Duration::from_secs(60);
/// How long the parent waits for each line from the child.
const LINE_WAIT: Duration = Duration::from_secs(30);

/// The child: opens the device, then writes block `i % 64` with `i` in it
/// for i = 1, 2, ..., printing each acknowledged write, until a write
/// fails; then tries once more, prints both errors, and exits.
#[test]
fn holder_child() {
    let Ok(location) = std::env::var(CHILD_ENV) else {
        return;
    };
    let target = RadosTarget::parse(&location).unwrap();
    let device = RadosDevice::open_exclusive(&target, Claim::Open).unwrap();
    println!("locked");
    let started = Instant::now();
    let mut i = 1u64;
    while started.elapsed() < CHILD_LIFETIME {
        let block = vec![i as u8; BLOCK];
        let mut data = block;
        data[..8].copy_from_slice(&i.to_le_bytes());
        match device.write_at(&data, (i % CHILD_BLOCKS) * BLOCK as u64) {
            Ok(()) => println!("wrote {i}"),
            Err(first) => {
                let again = device.write_at(&data, 0).unwrap_err();
                let flush = device.flush().unwrap_err();
                println!("error: {first}");
                println!("again: {again}");
                println!("flush: {flush}");
                println!("fenced: {}", device.is_fenced());
                return;
            }
        }
        i += 1;
    }
    println!("timeout");
}

fn spawn_child(target: &RadosTarget) -> (Child, Receiver<String>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["holder_child", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, target.location())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (lines, receiver) = mpsc::sync_channel(1024);
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    (child, receiver)
}

/// The next line holding `prefix`, from it on; other lines are skipped.
fn line_with(lines: &Receiver<String>, prefix: &str) -> String {
    let deadline = Instant::now() + LINE_WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            // libtest may have printed "test holder_child ... " first.
            Ok(line) => {
                if let Some(at) = line.find(prefix) {
                    return line[at..].to_string();
                }
            }
            Err(e) => panic!("no line starting with {prefix:?} from the child: {e}"),
        }
    }
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name} failed");
}

/// Kills the child if the test fails half-way.
struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn child_blocks(device: &RadosDevice) -> Vec<u8> {
    let mut all = vec![0u8; CHILD_BLOCKS as usize * BLOCK];
    device.read_at(&mut all, 0).unwrap();
    all
}

#[test]
fn a_stopped_holder_is_fenced_by_a_takeover_and_none_of_its_writes_land() {
    let Some(target) = fresh_target("takeover") else {
        return;
    };
    drop(
        RadosDevice::open_exclusive(
            &target,
            Claim::Create {
                object_size: 64 << 10,
            },
        )
        .unwrap(),
    );
    let (child, lines) = spawn_child(&target);
    let mut child = Reaper(child);
    line_with(&lines, "locked");
    line_with(&lines, "wrote 50");
    signal(&child.0, "STOP");

    let refused = RadosDevice::open_exclusive(&target, Claim::Open)
        .err()
        .expect("opened a held device");
    assert!(
        refused
            .to_string()
            .contains(&format!("pid {}", child.0.id())),
        "{refused}"
    );

    let started = Instant::now();
    let device = RadosDevice::open_exclusive(&target, Claim::Takeover).unwrap();
    let takeover = started.elapsed();
    let at_takeover = child_blocks(&device);
    let marker = vec![0xee; BLOCK];
    device
        .write_at(&marker, CHILD_BLOCKS * BLOCK as u64)
        .unwrap();
    device.flush().unwrap();

    signal(&child.0, "CONT");
    let error = line_with(&lines, "error: ");
    let again = line_with(&lines, "again: ");
    let flush = line_with(&lines, "flush: ");
    assert_eq!(line_with(&lines, "fenced: "), "fenced: true");
    let status = child.0.wait().unwrap();
    assert!(status.success(), "the child failed: {status}");
    for line in [&error, &again, &flush] {
        assert!(
            line.contains("this host was fenced: ") && line.contains(&target.location()),
            "{line}"
        );
    }

    let after = child_blocks(&device);
    let landed = (0..CHILD_BLOCKS as usize)
        .filter(|&b| at_takeover[b * BLOCK..(b + 1) * BLOCK] != after[b * BLOCK..(b + 1) * BLOCK])
        .count();
    assert_eq!(
        landed, 0,
        "{landed} of the fenced holder's writes landed after the takeover"
    );
    let mut back = vec![0u8; BLOCK];
    device
        .read_at(&mut back, CHILD_BLOCKS * BLOCK as u64)
        .unwrap();
    assert_eq!(back, marker);
    eprintln!(
        "takeover took {:.0} ms; {error}",
        takeover.as_secs_f64() * 1000.0
    );
}
