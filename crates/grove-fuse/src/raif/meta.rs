//! Per-file metadata: a sidecar file beside the component on the file's
//! authoritative branch and on the next branch (one copy).
//!
//! Why a sidecar and not xattrs: branches may sit on NFS, tmpfs before
//! Linux 6.6 or other file systems without user xattrs; a sidecar works on
//! any of them, and is copied by any backup tool.
//!
//! For a file `DIR/NAME` the sidecar is `DIR/.grove-raif.NAME` on the
//! branches `a = fnv1a(NAME) mod N` and `(a + 1) mod N` of the mount's N
//! branches. Names starting with [`RESERVED_PREFIX`] are hidden from the
//! mount and refused there. A sidecar is written to `.grove-raif.tmp.NAME`
//! and renamed over the old one, so a crash leaves the old or the new one.
//! Writers of one sidecar take turns (see [`WRITE_LOCK_COUNT`]).
//!
//! Layout: a TOML document, one key per line:
//!
//! ```text
//! format = 1                 META_FORMAT
//! level = "raif5"            the level the file was created with
//! stripe_unit_bytes = 65536
//! start = 2                  starting position within `branches`
//! branches = ["a", "b", "c"] labels of the branch subset, in layout order
//! rule = "media"             the rule that chose this layout
//! size_bytes = 12345         logical size
//! mode = 33188               st_mode (type and permission bits)
//! uid = 0
//! gid = 0
//! atime_ns = ...             nanoseconds since the epoch
//! mtime_ns = ...
//! ctime_ns = ...
//! ```

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use grove_raif::Level;
use serde::{Deserialize, Serialize};

/// Names of grove's own files on the branches begin with this.
pub const RESERVED_PREFIX: &str = ".grove-raif.";
/// What a temporary sidecar is called before it is renamed into place.
pub const TMP_PREFIX: &str = ".grove-raif.tmp.";
/// The version of the sidecar format.
pub const META_FORMAT: u32 = 1;
/// Largest sidecar read: anything bigger is not one of ours.
const META_MAX_BYTES: u64 = 64 * 1024;
/// Locks taken by sidecar writers, by the hash of the temporary name. That
/// name is the same for every writer of a sidecar (a unique one would not
/// fit NAME_MAX beside the longest file names), and two FUSE threads may
/// write one file's sidecar at once (the release of one handle and the
/// flush of the next): sharing the temporary file, one of them failed its
/// rename with ENOENT, or renamed into place a file the other was still
/// truncating and writing, leaving a torn sidecar (EIO once the other copy
/// is on a lost branch).
const WRITE_LOCK_COUNT: usize = 64;
static WRITE_LOCKS: [Mutex<()>; WRITE_LOCK_COUNT] = [const { Mutex::new(()) }; WRITE_LOCK_COUNT];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    pub format: u32,
    pub level: Level,
    pub stripe_unit_bytes: u64,
    pub start: usize,
    pub branches: Vec<String>,
    pub rule: String,
    pub size_bytes: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime_ns: u64,
    pub mtime_ns: u64,
    pub ctime_ns: u64,
}

pub fn now_ns() -> u64 {
    to_ns(SystemTime::now())
}

pub fn to_ns(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

pub fn from_ns(ns: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(ns)
}

/// The sidecar path of `rel` (a file path below the mount) under `root`.
pub fn sidecar_path(root: &Path, rel: &Path) -> PathBuf {
    let name = rel
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    root.join(rel.parent().unwrap_or(Path::new("")))
        .join(format!("{RESERVED_PREFIX}{name}"))
}

fn tmp_path(root: &Path, rel: &Path) -> PathBuf {
    let name = rel
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    root.join(rel.parent().unwrap_or(Path::new("")))
        .join(format!("{TMP_PREFIX}{name}"))
}

/// The lock a writer of the temporary file `tmp` holds while it uses it.
fn write_lock(tmp: &Path) -> MutexGuard<'static, ()> {
    let hash = grove_raif::name_hash(tmp.as_os_str().as_encoded_bytes());
    WRITE_LOCKS[(hash % WRITE_LOCK_COUNT as u64) as usize]
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Encodes and writes a sidecar atomically; `durable` fsyncs it first.
pub fn write(root: &Path, rel: &Path, meta: &Meta, durable: bool) -> std::io::Result<()> {
    assert_eq!(meta.format, META_FORMAT);
    assert!(meta.start < meta.branches.len().max(1));
    let text = toml::to_string(meta).map_err(std::io::Error::other)?;
    let tmp = tmp_path(root, rel);
    let _turn = write_lock(&tmp);
    {
        use std::io::Write;
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(text.as_bytes())?;
        if durable {
            file.sync_all()?;
        }
    }
    std::fs::rename(&tmp, sidecar_path(root, rel))
}

/// Reads and checks a sidecar: Ok(None) if there is none.
pub fn read(root: &Path, rel: &Path) -> std::io::Result<Option<Meta>> {
    use std::io::Read;
    let path = sidecar_path(root, rel);
    let file = match std::fs::File::open(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        other => other?,
    };
    let mut text = String::new();
    file.take(META_MAX_BYTES).read_to_string(&mut text)?;
    let meta: Meta = toml::from_str(&text).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: {}", path.display(), e.message()),
        )
    })?;
    let bad = meta.format != META_FORMAT
        || meta.start >= meta.branches.len()
        || meta.level.check_width(meta.branches.len()).is_err()
        || grove_raif::layout::check_stripe_unit(meta.stripe_unit_bytes).is_err();
    if bad {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: not a valid grove-raif sidecar", path.display()),
        ));
    }
    Ok(Some(meta))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Writers of one sidecar at once in the regression test below.
    const WRITERS: u64 = 4;
    /// Writes each of them makes.
    const WRITES_EACH: u64 = 500;

    fn sample(size_bytes: u64) -> Meta {
        Meta {
            format: META_FORMAT,
            level: Level::Raif5,
            stripe_unit_bytes: 4096,
            start: 0,
            branches: vec!["b0".into(), "b1".into(), "b2".into()],
            rule: "default".into(),
            size_bytes,
            mode: 0o100_644,
            uid: 0,
            gid: 0,
            atime_ns: 1,
            mtime_ns: 2,
            ctime_ns: 3,
        }
    }

    /// Two FUSE threads may write one file's sidecar at once (the release
    /// of one handle and the flush of another): no write may fail, and a
    /// reader meanwhile and afterwards must find a whole sidecar. Sharing
    /// the temporary name unserialized, renames failed with ENOENT and
    /// readers found torn sidecars: one text with another's tail.
    #[test]
    fn concurrent_writes_of_one_sidecar_all_succeed_and_never_tear_it() {
        let dir = tempfile::tempdir().unwrap();
        let rel = Path::new("f");
        write(dir.path(), rel, &sample(0), false).unwrap();
        let writing = AtomicBool::new(true);
        std::thread::scope(|s| {
            let writers: Vec<_> = (0..WRITERS)
                .map(|writer| {
                    let root = dir.path();
                    s.spawn(move || {
                        for i in 0..WRITES_EACH {
                            // Sizes of other lengths give texts of other lengths.
                            let size = 10u64.pow(((writer + i) % 12) as u32);
                            write(root, rel, &sample(size), false).unwrap();
                        }
                    })
                })
                .collect();
            let reader = s.spawn(|| {
                while writing.load(Ordering::Relaxed) {
                    read(dir.path(), rel).unwrap().unwrap();
                }
            });
            let written: Vec<_> = writers.into_iter().map(|w| w.join()).collect();
            // Stopped before any unwrap, so that a failed writer cannot hang the test.
            writing.store(false, Ordering::Relaxed);
            let read = reader.join();
            assert!(written.iter().all(Result::is_ok), "a write failed");
            assert!(read.is_ok(), "a reader found a torn sidecar");
        });
        let m = read(dir.path(), rel).unwrap().unwrap();
        assert_eq!(m, sample(m.size_bytes));
        assert!(
            !tmp_path(dir.path(), rel).exists(),
            "no temporary file left"
        );
    }
}
