//! Space levels end to end: a served pool filled to its hard limit through
//! a real NBD client (qemu-io) and through a FUSE file (`grove mount`)
//! gets ENOSPC, refuses snapshots, loses nothing acknowledged, and takes
//! writes again once space comes back (a removal and reclaim, or a higher
//! limit through `grove space set`); the daemon's watcher logs every level
//! change and runs the hook with the figures in its environment.
//!
//! qemu-io, root and /dev/fuse are needed; without them a test prints
//! SKIP, except under scripts/test.sh ($GROVE_REQUIRE_TOOLS), where a
//! missing tool fails it.

mod support;
use support::GroveOnPool;

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const GROVE: &str = env!("CARGO_BIN_EXE_grove");
/// How long a daemon may take to start, or the watcher to see a change.
const SETTLE_TIMEOUT_MS: u64 = 20_000;
const MIB: u64 = 1 << 20;

struct Daemon {
    dir: tempfile::TempDir,
    child: Option<Child>,
    mountpoint: Option<PathBuf>,
}

impl GroveOnPool for Daemon {
    fn pool_path(&self) -> PathBuf {
        self.pool()
    }
}

impl Daemon {
    /// A pool of 8 MiB that may grow to 12 MiB by 2 MiB steps, with a
    /// hook that appends the level and figures to `hook.log`.
    fn new() -> Daemon {
        let daemon = Daemon {
            dir: tempfile::tempdir().unwrap(),
            child: None,
            mountpoint: None,
        };
        let hook = format!(
            "echo \"$GROVE_SPACE_PREVIOUS_LEVEL $GROVE_SPACE_LEVEL $GROVE_SPACE_USED_BYTES $GROVE_SPACE_CEILING_BYTES\" >> {}",
            daemon.hook_log().display()
        );
        daemon.ok(&[
            "init",
            "--capacity",
            "8M",
            "--max-capacity",
            "12M",
            "--extend-step",
            "2M",
            "--host-reserve",
            "0",
            "--warn",
            "50%",
            "--prune",
            "70%",
            "--hook",
            &hook,
        ]);
        daemon.ok(&["create", "disk", "--size", "64M"]);
        daemon.ok(&["create", "scratch", "--size", "64M"]);
        daemon
    }

    fn pool(&self) -> PathBuf {
        self.dir.path().join("pool")
    }

    fn hook_log(&self) -> PathBuf {
        self.dir.path().join("hook.log")
    }

    fn daemon_log(&self) -> PathBuf {
        self.dir.path().join("daemon.log")
    }

    /// Starts `grove ARGS` with its log in daemon.log, and waits for its
    /// control socket (and `ready` if given).
    fn start(&mut self, args: &[&str], ready: impl Fn(&Daemon) -> bool) {
        let log = std::fs::File::create(self.daemon_log()).unwrap();
        let child = Command::new(GROVE)
            .arg("--pool")
            .arg(self.pool())
            .args(args)
            .env("GROVE_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let control = self.pool().join("grove.control");
        self.wait_until("the daemon is ready", |d| {
            std::os::unix::net::UnixStream::connect(&control).is_ok() && ready(d)
        });
    }

    fn wait_until(&mut self, what: &str, done: impl Fn(&Daemon) -> bool) {
        let started = Instant::now();
        while !done(self) {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                panic!(
                    "the daemon exited with {status} before {what}: {}",
                    self.log()
                );
            }
            assert!(
                started.elapsed() < Duration::from_millis(SETTLE_TIMEOUT_MS),
                "timed out waiting until {what}; daemon log: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.daemon_log()).unwrap_or_default()
    }

    fn hook_lines(&self) -> Vec<String> {
        std::fs::read_to_string(self.hook_log())
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn space(&self) -> serde_json::Value {
        let info: serde_json::Value = serde_json::from_str(&self.ok(&["info", "--json"])).unwrap();
        info["space"].clone()
    }

    fn uri(&self, export: &str) -> String {
        format!(
            "nbd+unix:///{export}?socket={}",
            self.pool().join("nbd.sock").display()
        )
    }

    /// SIGTERM (serve) or umount (mount); the daemon must exit 0, and the
    /// pool must then check clean.
    fn stop(&mut self) {
        if let Some(mountpoint) = self.mountpoint.take() {
            let status = Command::new("umount").arg(&mountpoint).status().unwrap();
            assert!(status.success());
        } else if let Some(child) = &self.child {
            let status = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status()
                .unwrap();
            assert!(status.success());
        }
        let status = self.child.take().unwrap().wait().unwrap();
        assert!(
            status.success(),
            "the daemon exited with {status}: {}",
            self.log()
        );
        assert!(self.ok(&["check"]).contains("clean"));
    }

    /// The refusal of a snapshot at the hard limit, through the daemon.
    fn assert_snapshot_refused(&self) {
        let output = self.run(&["snapshot", "disk", "disk@full"]);
        assert_eq!(output.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.starts_with(
                "grove: error: cannot make \"disk@full\": the pool is at its hard limit"
            ) && stderr.lines().count() == 1,
            "{stderr}"
        );
    }

    /// Waits until the hook's last run reports `level`, and checks its
    /// figures: used and ceiling in bytes, as `grove info` says.
    fn wait_for_hook_level(&mut self, level: &str) {
        self.wait_until(&format!("the hook reports {level}"), |d| {
            d.hook_lines()
                .last()
                .is_some_and(|l| l.split(' ').nth(1) == Some(level))
        });
        let last = self.hook_lines().last().unwrap().clone();
        let fields: Vec<&str> = last.split(' ').collect();
        assert_eq!(fields.len(), 4, "{last}");
        let used: u64 = fields[2].parse().unwrap();
        assert!(used > 2 * MIB && used <= 14 * MIB, "{last}");
    }

    /// Fills scratch in stages, each seen by the watcher: past the
    /// warning level (the capacity is extended there too), past the
    /// pruning level, then 1 MiB writes until one fails. `write(from, to)`
    /// writes MiB `from..to` and returns how many landed.
    fn fill_in_stages(&mut self, write: &mut dyn FnMut(u64, u64) -> u64) {
        // disk holds 2 MiB; 5 more is past 50% of 12 MiB and 80% of 8 MiB.
        assert_eq!(write(0, 5), 5);
        self.wait_for_hook_level("warn");
        self.wait_until("the capacity is extended", |d| {
            d.log().contains("capacity extended from 8M to 10M")
        });
        assert_eq!(write(5, 7), 2);
        self.wait_for_hook_level("prune");
        self.wait_until("the pruning call", |d| {
            d.log().contains("past the pruning level")
                && d.log()
                    .contains("no snapshot is left that the policies let go")
        });
        let wrote = write(7, 16);
        assert!(wrote < 9, "the pool never filled");
    }

    /// After the last blocks are taken: the pool is full, for `grove info`,
    /// the hook and the log.
    fn assert_full_reported(&mut self) {
        assert_eq!(self.space()["level"], "full");
        assert_eq!(self.space()["capacity_bytes"], 12 * MIB);
        self.wait_for_hook_level("full");
        assert!(
            self.log().contains("space level full (was prune)"),
            "{}",
            self.log()
        );
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mountpoint) = self.mountpoint.take() {
            let _ = Command::new("umount").arg("-l").arg(&mountpoint).status();
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn have(tool: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        if std::env::var_os("GROVE_REQUIRE_TOOLS").is_some_and(|v| v != "0") {
            panic!("{tool} is not installed, and GROVE_REQUIRE_TOOLS is set: install it (scripts/test.sh does)");
        }
        eprintln!("SKIP: {tool} is not installed (scripts/test.sh installs it)");
    }
    found
}

fn qemu_io(uri: &str, commands: &[String]) -> String {
    let mut command = Command::new("qemu-io");
    command.args(["-f", "raw"]);
    for c in commands {
        command.args(["-c", c]);
    }
    let output = command.arg(uri).output().unwrap();
    String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr)
}

#[test]
fn a_served_pool_at_its_hard_limit_gives_nbd_clients_enospc_and_recovers() {
    if !have("qemu-io") {
        return;
    }
    let mut daemon = Daemon::new();
    daemon.start(&["serve"], |d| d.pool().join("nbd.sock").exists());
    let acknowledged = qemu_io(
        &daemon.uri("disk"),
        &["write -P 0x11 0 2M".into(), "flush".into()],
    );
    assert!(!acknowledged.contains("failed"), "{acknowledged}");
    // 1 MiB writes into scratch, each acknowledged or refused with
    // ENOSPC, never anything else.
    let uri = daemon.uri("scratch");
    let mut write = |from: u64, to: u64| {
        let writes: Vec<String> = (from..to)
            .map(|i| format!("write -P 0x22 {i}M 1M"))
            .collect();
        let output = qemu_io(&uri, &writes);
        let wrote = output.matches("wrote 1048576/1048576").count() as u64;
        let refused = output.matches("No space left on device").count() as u64;
        assert_eq!(wrote + refused, to - from, "{output}");
        wrote
    };
    daemon.fill_in_stages(&mut write);
    // Then 4K at a time up to the last block.
    let blocks: Vec<String> = (0..512)
        .map(|i| format!("write -P 0x22 {}k 4k", 20 * 1024 + i * 4))
        .collect();
    let output = qemu_io(&daemon.uri("scratch"), &blocks);
    assert!(
        output.contains("No space left on device"),
        "{}",
        &output[output.len().saturating_sub(2000)..]
    );
    daemon.assert_full_reported();
    daemon.assert_snapshot_refused();

    // A higher limit through the daemon: writes go on at once.
    daemon.ok(&["space", "set", "--max-capacity", "14M"]);
    let output = qemu_io(
        &daemon.uri("disk"),
        &["write -P 0x33 4M 1M".into(), "flush".into()],
    );
    assert!(!output.contains("failed"), "{output}");
    // Space given back: removal and reclaim, then a snapshot and writes.
    daemon.ok(&["rm", "scratch"]);
    daemon.ok(&["gc", "--wait"]);
    daemon.wait_for_hook_level("normal");
    daemon.ok(&["snapshot", "disk", "disk@after"]);
    let output = qemu_io(
        &daemon.uri("disk"),
        &[
            "write -P 0x44 6M 1M".into(),
            "flush".into(),
            "read -P 0x11 0 2M".into(),
            "read -P 0x33 4M 1M".into(),
            "read -P 0x44 6M 1M".into(),
        ],
    );
    assert!(
        !output.contains("failed") && !output.contains("Pattern verification"),
        "{output}"
    );
    daemon.stop();
    // Every acknowledged byte is there after the daemon is gone.
    let disk = daemon.ok(&["read", "disk", "--length", "7M"]);
    let bytes = disk.as_bytes();
    assert!(bytes[..2 << 20].iter().all(|&b| b == 0x11));
    assert!(bytes[4 << 20..5 << 20].iter().all(|&b| b == 0x33));
    assert!(bytes[6 << 20..7 << 20].iter().all(|&b| b == 0x44));
}

#[test]
fn a_fuse_file_at_the_hard_limit_gets_enospc_and_recovers() {
    if !rustix::process::geteuid().is_root() || !Path::new("/dev/fuse").exists() {
        eprintln!("SKIP: needs root and /dev/fuse");
        return;
    }
    let mut daemon = Daemon::new();
    let mountpoint = daemon.dir.path().join("mnt");
    std::fs::create_dir(&mountpoint).unwrap();
    let mounted = mountpoint.join("disk");
    daemon.start(
        &["mount", mountpoint.to_str().unwrap(), "--foreground"],
        |_| mounted.exists(),
    );
    daemon.mountpoint = Some(mountpoint.clone());
    let disk = std::fs::OpenOptions::new()
        .write(true)
        .read(true)
        .open(&mounted)
        .unwrap();
    disk.write_all_at(&[0x11; 2 << 20], 0).unwrap();
    disk.sync_all().unwrap();
    let scratch = std::fs::OpenOptions::new()
        .write(true)
        .open(mountpoint.join("scratch"))
        .unwrap();
    let mut write = |from: u64, to: u64| {
        for mib in from..to {
            if let Err(e) = scratch.write_all_at(&[0x22; 1 << 20], mib * MIB) {
                assert_eq!(e.raw_os_error(), Some(libc_enospc()), "{e}");
                return mib - from;
            }
        }
        to - from
    };
    daemon.fill_in_stages(&mut write);
    let mut block = 20 * MIB;
    let error = loop {
        match scratch.write_all_at(&[0x22; 4096], block) {
            Ok(()) => block += 4096,
            Err(e) => break e,
        }
        assert!(block < 40 * MIB, "4K writes never filled the pool");
    };
    assert_eq!(error.raw_os_error(), Some(libc_enospc()), "{error}");
    daemon.assert_full_reported();
    daemon.assert_snapshot_refused();
    drop(scratch);
    daemon.ok(&["rm", "scratch"]);
    daemon.ok(&["gc", "--wait"]);
    daemon.wait_for_hook_level("normal");
    disk.write_all_at(&[0x33; 1 << 20], 4 << 20).unwrap();
    disk.sync_all().unwrap();
    daemon.ok(&["snapshot", "disk", "disk@after"]);
    let mut back = vec![0u8; 5 << 20];
    disk.read_exact_at(&mut back, 0).unwrap();
    assert!(back[..2 << 20].iter().all(|&b| b == 0x11));
    assert!(back[4 << 20..].iter().all(|&b| b == 0x33));
    drop(disk);
    std::io::stderr().flush().unwrap();
    daemon.stop();
}

/// ENOSPC's number on Linux.
fn libc_enospc() -> i32 {
    rustix::io::Errno::NOSPC.raw_os_error()
}
