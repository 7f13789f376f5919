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

/// Encodes and writes a sidecar atomically; `durable` fsyncs it first.
pub fn write(root: &Path, rel: &Path, meta: &Meta, durable: bool) -> std::io::Result<()> {
    assert_eq!(meta.format, META_FORMAT);
    assert!(meta.start < meta.branches.len().max(1));
    let text = toml::to_string(meta).map_err(std::io::Error::other)?;
    let tmp = tmp_path(root, rel);
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
