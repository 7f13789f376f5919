//! Back-in-time reads with real clients: a snapshot the pool no longer has,
//! only archived, is a read-only export of `grove serve` read from the
//! archive. qemu-img copies it byte for byte as it was; nbdinfo lists it
//! and maps its holes; a write is refused with EPERM; a snapshot still in
//! the pool is served from the pool; a flipped byte in a pack is a read
//! error, never data. Likewise as the file `archive/NAME` of `grove mount`
//! (with the real kernel: root and /dev/fuse, else a visible skip): its
//! bytes, SEEK_HOLE, EROFS for writers and EIO on damage; `archive/` lists
//! only what the pool no longer has, and is there from the start of the
//! mount of a pool set up to archive. `grove serve --export NAME` takes an
//! archived snapshot's name.

#[macro_use]
mod support;
use support::{have, unix_client, GroveOnPool};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use grove_nbd::codec::{Command as NbdCommand, *};

const GROVE: &str = env!("CARGO_BIN_EXE_grove");
const MIB: u64 = 1 << 20;

struct Served {
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl GroveOnPool for Served {
    fn pool_path(&self) -> PathBuf {
        self.dir.path().join("pool")
    }
}

impl Served {
    /// A new pool whose archive reads cache `cache_size` bytes.
    fn init_with_archive_cache(cache_size: &str) -> Served {
        let served = Served {
            dir: tempfile::tempdir().unwrap(),
            child: None,
        };
        served.ok(&["init"]);
        let toml = served.pool_path().join("grove.toml");
        let mut config = std::fs::read_to_string(&toml).unwrap();
        config.push_str(&format!("\n[archive]\ncache_size = \"{cache_size}\"\n"));
        std::fs::write(&toml, config).unwrap();
        served
    }

    fn spawn(&mut self) {
        self.spawn_with(&[]);
    }

    /// `grove serve` with `args`, once its socket answers.
    fn spawn_with(&mut self, args: &[&str]) {
        let child = Command::new(GROVE)
            .args(["--pool", self.pool_path().to_str().unwrap(), "serve"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let started = Instant::now();
        while std::os::unix::net::UnixStream::connect(self.socket()).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "grove serve did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn socket(&self) -> PathBuf {
        self.pool_path().join("nbd.sock")
    }

    fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.socket().display())
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes `len` bytes of a pattern seeded by `seed` at `offset` of vm.
    fn write(&self, offset: u64, len: usize, seed: u8) {
        let data: Vec<u8> = (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect();
        let file = self.file("data");
        std::fs::write(&file, data).unwrap();
        let offset = offset.to_string();
        self.ok(&["write", "vm", file.to_str().unwrap(), "--offset", &offset]);
    }

    /// `qemu-img convert` of an export into a file.
    fn copy_out(&self, export: &str, to: &Path) -> Output {
        Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "raw"])
            .arg(self.uri(export))
            .arg(to)
            .output()
            .unwrap()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `nbdinfo --map` of an export as (offset, length, flags), neighbours of
/// the same flags merged.
fn allocation_map(served: &Served, export: &str) -> Vec<(u64, u64, u32)> {
    let output = Command::new("nbdinfo")
        .arg("--map")
        .arg(served.uri(export))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "nbdinfo --map: {text}{output:?}");
    let mut map: Vec<(u64, u64, u32)> = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let number = |i: usize| -> u64 { fields[i].parse().unwrap() };
        let (offset, len, flags) = (number(0), number(1), number(2) as u32);
        match map.last_mut() {
            Some(last) if last.2 == flags && last.0 + last.1 == offset => last.1 += len,
            _ => map.push((offset, len, flags)),
        }
    }
    map
}

/// A pool (whose archive reads cache 256 KiB) whose vm had snapshot vm@old (1 MiB at 0 and at 4 MiB, holes
/// elsewhere), archived and then removed from the pool, and vm@new,
/// archived and still in the pool. `old.img` is vm@old as exported
/// before its removal.
fn pool_with_an_archived_only_snapshot() -> Served {
    // A cache smaller than the snapshot's data: reads go on past evictions.
    let served = Served::init_with_archive_cache("256K");
    served.ok(&["create", "vm", "--size", "8M"]);
    served.write(0, MIB as usize, 1);
    served.write(4 * MIB, MIB as usize, 2);
    served.ok(&["snapshot", "vm", "vm@old"]);
    let old = served.file("old.img");
    served.ok(&["export", "vm@old", old.to_str().unwrap()]);
    served.ok(&["archive", "push", "vm", "--snapshot", "vm@old"]);
    served.ok(&["rm", "vm@old"]);
    served.write(512 * 1024, MIB as usize, 3);
    served.ok(&["snapshot", "vm", "vm@new"]);
    served.ok(&["archive", "push", "vm", "--snapshot", "vm@new"]);
    served
}

#[test]
fn an_archived_only_snapshot_is_served_read_only_from_the_archive() {
    if !have("qemu-img") || !have("nbdinfo") {
        return;
    }
    let mut served = pool_with_an_archived_only_snapshot();
    assert!(!served.ok(&["list"]).contains("vm@old"));
    served.spawn();

    // Listed once, as archived; vm@new, still in the pool, is the pool's.
    let list = Command::new("nbdinfo")
        .args(["--list", &served.uri("")])
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&list.stdout).into_owned();
    assert!(list.contains("vm@old"), "{list}");
    assert_eq!(list.matches("archived snapshot").count(), 1, "{list}");

    let copied = served.file("copied.img");
    let output = served.copy_out("vm@old", &copied);
    assert!(output.status.success(), "{output:?}");
    assert!(
        std::fs::read(&copied).unwrap() == std::fs::read(served.file("old.img")).unwrap(),
        "vm@old read from the archive differs from what it held"
    );

    let hole = 3; // NBD_STATE_HOLE | NBD_STATE_ZERO
    assert_eq!(
        allocation_map(&served, "vm@old"),
        vec![
            (0, MIB, 0),
            (MIB, 3 * MIB, hole),
            (4 * MIB, MIB, 0),
            (5 * MIB, 3 * MIB, hole)
        ]
    );

    // A write is refused as on any read-only export.
    let mut client = unix_client(&served.socket());
    assert_eq!(client.go("vm@old").last(), Some(&REP_ACK));
    client.request(NbdCommand::Write, 7, 0, 512);
    std::io::Write::write_all(&mut client.s, &[9u8; 512]).unwrap();
    let (error, cookie) = decode_simple_reply(&client.recv(SIMPLE_REPLY_BYTES)).unwrap();
    assert_eq!((error, cookie), (NBD_EPERM, 7));
}

/// `grove serve --export NAME` takes an archived-only snapshot's name as
/// it takes a volume's (and as the default export): only it is offered,
/// read-only, its bytes as they were; a name neither has is refused.
#[test]
fn serve_exports_an_archived_only_snapshot_by_name() {
    if !have("qemu-img") || !have("nbdinfo") {
        return;
    }
    let mut served = pool_with_an_archived_only_snapshot();
    let refused = served.run(&["serve", "--export", "vm@nothing"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("cannot export \"vm@nothing\""),
        "{stderr}"
    );
    served.spawn_with(&["--export", "vm@old", "--default-export", "vm@old"]);
    let list = Command::new("nbdinfo")
        .args(["--list", &served.uri("")])
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&list.stdout).into_owned();
    assert!(list.contains("vm@old"), "{list}");
    assert!(
        !list.contains("vm@new") && !list.contains("export=\"vm\""),
        "{list}"
    );
    for export in ["vm@old", ""] {
        let copied = served.file("copied.img");
        let output = served.copy_out(export, &copied);
        assert!(output.status.success(), "{export:?}: {output:?}");
        assert!(
            std::fs::read(&copied).unwrap() == std::fs::read(served.file("old.img")).unwrap(),
            "{export:?}: vm@old read from the archive differs from what it held"
        );
    }
    let info = Command::new("nbdinfo")
        .arg(served.uri("vm@old"))
        .output()
        .unwrap();
    let info = String::from_utf8_lossy(&info.stdout).into_owned();
    assert!(info.contains("is_read_only: true"), "{info}");
}

#[test]
fn a_damaged_pack_is_a_read_error_never_data() {
    if !have("qemu-img") {
        return;
    }
    let mut served = pool_with_an_archived_only_snapshot();
    damage_every_pack(&served);
    served.spawn();
    let output = served.copy_out("vm@old", &served.file("copied.img"));
    assert!(
        !output.status.success(),
        "a damaged archive was read as data: {output:?}"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("Input/output error"), "{stderr}");
}

/// Flips a byte near the end of every pack of vm's archive: in the last
/// block each holds.
fn damage_every_pack(served: &Served) {
    let archive = format!("{}.archive", served.pool_path().display());
    for entry in std::fs::read_dir(Path::new(&archive).join("archive=vm")).unwrap() {
        let path = entry.unwrap().path();
        if path
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("pack-")
        {
            let mut bytes = std::fs::read(&path).unwrap();
            let at = bytes.len() - 10;
            bytes[at] ^= 0x40;
            std::fs::write(&path, bytes).unwrap();
        }
    }
}

/// `grove mount --foreground` of the pool on `mountpoint`, until it shows
/// its archive directory.
fn mount(served: &mut Served, mountpoint: &Path) {
    std::fs::create_dir_all(mountpoint).unwrap();
    let child = Command::new(GROVE)
        .args(["--pool", served.pool_path().to_str().unwrap(), "mount"])
        .arg(mountpoint)
        .arg("--foreground")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    served.child = Some(child);
    let started = Instant::now();
    while !mountpoint.join("archive").is_dir() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "grove mount did not show archive/"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn unmount(served: &mut Served, mountpoint: &Path) {
    let status = Command::new("umount").arg(mountpoint).status().unwrap();
    assert!(status.success());
    let status = served.child.take().unwrap().wait().unwrap();
    assert!(status.success(), "grove mount exited with {status}");
}

#[test]
fn an_archived_only_snapshot_is_a_read_only_file_of_the_mount() {
    require_fuse!("timeout");
    let mut served = pool_with_an_archived_only_snapshot();
    let mountpoint = served.file("mnt");
    mount(&mut served, &mountpoint);
    let file = mountpoint.join("archive").join("vm@old");
    let read = std::fs::read(&file);
    let names: Vec<String> = std::fs::read_dir(mountpoint.join("archive"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let writer = std::fs::OpenOptions::new().write(true).open(&file);
    let hole = {
        let opened = std::fs::File::open(&file).unwrap();
        rustix::fs::seek(&opened, rustix::fs::SeekFrom::Hole(0))
    };
    let in_pool = std::fs::metadata(mountpoint.join("archive").join("vm@new"));
    unmount(&mut served, &mountpoint);
    // Only what the pool no longer has; vm@new is the pool's own file.
    assert_eq!(names, ["vm@old"]);
    assert_eq!(in_pool.err().and_then(|e| e.raw_os_error()), Some(2)); // ENOENT
    assert!(
        read.unwrap() == std::fs::read(served.file("old.img")).unwrap(),
        "archive/vm@old differs from what vm@old held"
    );
    assert_eq!(writer.err().and_then(|e| e.raw_os_error()), Some(30)); // EROFS
    assert_eq!(hole.ok(), Some(MIB));

    damage_every_pack(&served);
    mount(&mut served, &mountpoint);
    let damaged = std::fs::read(&file);
    unmount(&mut served, &mountpoint);
    assert_eq!(damaged.err().and_then(|e| e.raw_os_error()), Some(5)); // EIO
}

/// A pool set up to archive (grove.toml's `[archive]`) shows `archive/`
/// from the start of the mount, empty while nothing is archived; it then
/// follows the archive: a snapshot pushed (through the mount's daemon)
/// appears there once the pool no longer has it, with its bytes.
#[test]
fn the_mounts_archive_dir_is_there_when_the_pool_archives_and_follows_the_archive() {
    require_fuse!("timeout");
    let mut served = Served::init_with_archive_cache("1M");
    served.ok(&["create", "vm", "--size", "4M"]);
    served.write(MIB, MIB as usize, 5);
    served.ok(&["snapshot", "vm", "vm@a"]);
    let image = served.file("a.img");
    served.ok(&["export", "vm@a", image.to_str().unwrap()]);
    let mountpoint = served.file("mnt");
    mount(&mut served, &mountpoint);
    let dir = mountpoint.join("archive");
    let names = || -> Vec<String> {
        std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect()
    };
    let empty = names();
    served.ok(&["archive", "push", "vm", "--snapshot", "vm@a"]);
    let pushed_still_in_pool = names();
    served.ok(&["rm", "vm@a"]);
    let archived_only = names();
    let read = std::fs::read(dir.join("vm@a"));
    unmount(&mut served, &mountpoint);
    assert!(empty.is_empty(), "{empty:?}");
    assert!(pushed_still_in_pool.is_empty(), "{pushed_still_in_pool:?}");
    assert_eq!(archived_only, ["vm@a"]);
    assert!(
        read.unwrap() == std::fs::read(&image).unwrap(),
        "archive/vm@a differs from what vm@a held"
    );
}
