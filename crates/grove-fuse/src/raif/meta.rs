//! Per-file metadata: a sidecar file on the file's authoritative branch
//! and on the next branch (one copy).
//!
//! Why a sidecar and not xattrs: branches may sit on NFS, tmpfs before
//! Linux 6.6 or other file systems without user xattrs; a sidecar works on
//! any of them, and is copied by any backup tool.
//!
//! For a file `DIR/NAME` the sidecar is `DIR/.grove-raif/NAME` (format 1
//! kept it as `DIR/.grove-raif.NAME`, still read) on the branches
//! `a = fnv1a(NAME) mod N` and `(a + 1) mod N` of the mount's N branches.
//! Its name is the user's name, in a directory of its own: metadata never
//! makes a name longer, so names up to the lower file system's limit work.
//! Names starting with [`RESERVED_PREFIX`], and [`META_DIR`] itself, are
//! hidden from the mount and refused there. A sidecar is written to a
//! temporary file of a unique name in the branch's [`WORK_DIR`] and
//! renamed over the old one, so a crash leaves the old or the new one (and
//! a temporary file the next mount removes).
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
//! link = "9c0e..."           only once the file has had two names (below)
//! nlink = 2                  only then too: the file's number of names
//! ```
//!
//! Hard links: a file given a second name gets a link record, the
//! document above with `link` (16 lowercase hex digits, its identity) and
//! `nlink`, kept at `.grove-raif.links/ID` in the root of the branches
//! `a = fnv1a(ID) mod N` and `(a + 1) mod N`. Each of its names then has a
//! name sidecar that only points there, written once and never changed:
//!
//! ```text
//! format = 1
//! link = "9c0e..."
//! ```
//!
//! so the metadata is one file whatever name reaches it, and a directory
//! rename (which moves no sidecar) changes nothing. The components of every
//! name are hard links of one lower file on each branch.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use grove_raif::Level;
use rustix::fs::OFlags;
use serde::{Deserialize, Serialize};

use super::lower;

/// Names of grove's own files on the branches begin with this.
pub const RESERVED_PREFIX: &str = ".grove-raif.";
/// The directory, in each directory of a branch, that holds the sidecars
/// of the files there.
pub const META_DIR: &str = ".grove-raif";
/// The directory, at the root of each branch, of temporary files: sidecars
/// before their rename, components being laid out again. Emptied at mount.
pub const WORK_DIR: &str = ".grove-raif.tmp";
/// The directory, at the root of each branch, of link records.
pub const LINKS_DIR: &str = ".grove-raif.links";
/// Hex digits of a link record's identity.
pub const LINK_ID_DIGITS: usize = 16;
/// The version of the sidecar format.
pub const META_FORMAT: u32 = 1;
/// Largest sidecar read: anything bigger is not one of ours.
const META_MAX_BYTES: u64 = 64 * 1024;
/// Tries of a sidecar's rename: an unlink in the same directory may
/// remove the emptied [`META_DIR`] between its creation and the rename.
const META_WRITE_TRIES: usize = 3;
/// Numbers temporary files uniquely within the process.
static TEMP_SERIAL: AtomicU64 = AtomicU64::new(0);

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
    /// The identity of the file's link record, once it has had two names;
    /// its metadata then lives in that record (see the module's text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
    /// How many names the file has: 1 until it gets a link record.
    #[serde(default = "one_name", skip_serializing_if = "is_one_name")]
    pub nlink: u32,
}

fn one_name() -> u32 {
    1
}

fn is_one_name(n: &u32) -> bool {
    *n == 1
}

/// What a name's sidecar holds: the file's whole metadata, or (for a file
/// with several names) the identity of its link record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sidecar {
    Whole(Meta),
    Link(String),
}

/// A name sidecar as written: see the module's text.
#[derive(Serialize, Deserialize)]
struct LinkName {
    format: u32,
    link: String,
}

/// Whether `id` is a link identity this code makes: never a path.
pub fn is_link_id(id: &str) -> bool {
    id.len() == LINK_ID_DIGITS
        && id
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
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
    meta_dir(root, rel).join(rel.file_name().unwrap_or_default())
}

/// Where format 1 kept the sidecar: `DIR/.grove-raif.NAME`. None for the
/// names `tmp` and `links` at the root, where that path is grove's own
/// [`WORK_DIR`] or [`LINKS_DIR`] (a directory: reading or removing it as a
/// sidecar failed with EISDIR, so no file of those names could be made).
pub fn legacy_sidecar_path(root: &Path, rel: &Path) -> Option<PathBuf> {
    let name = rel
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let legacy = format!("{RESERVED_PREFIX}{name}");
    let parent = rel.parent().unwrap_or(Path::new(""));
    if parent.as_os_str().is_empty() && [WORK_DIR, LINKS_DIR].contains(&legacy.as_str()) {
        return None;
    }
    Some(root.join(parent).join(legacy))
}

/// Removes a format 1 sidecar of `rel`, if it has one.
fn remove_legacy(root: &Path, rel: &Path) -> std::io::Result<()> {
    match legacy_sidecar_path(root, rel).map(lower::remove_file) {
        Some(Err(e)) if !absent(&e) => Err(e),
        _ => Ok(()),
    }
}

/// Whether an error on a path means there is nothing there: not found, or
/// a name too long to exist (a format 1 sidecar of a long name).
fn absent(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(ENAMETOOLONG)
}

/// ENAMETOOLONG on Linux.
const ENAMETOOLONG: i32 = 36;

/// The [`META_DIR`] of the directory that holds `rel`.
pub fn meta_dir(root: &Path, rel: &Path) -> PathBuf {
    root.join(rel.parent().unwrap_or(Path::new("")))
        .join(META_DIR)
}

/// A fresh temporary path in the branch's [`WORK_DIR`], which is created.
pub fn temp_path(root: &Path) -> std::io::Result<PathBuf> {
    let dir = root.join(WORK_DIR);
    std::fs::create_dir_all(&dir)?;
    let serial = TEMP_SERIAL.fetch_add(1, Ordering::Relaxed);
    Ok(dir.join(format!("{}-{serial}", std::process::id())))
}

/// Removes what a crash left in a branch's [`WORK_DIR`].
pub fn clean_work_dir(root: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(root.join(WORK_DIR)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Encodes and writes a sidecar atomically; `durable` fsyncs it first.
pub fn write(root: &Path, rel: &Path, meta: &Meta, durable: bool) -> std::io::Result<()> {
    check_meta(meta);
    assert!(
        meta.link.is_none(),
        "a linked file's metadata is its record"
    );
    let text = toml::to_string(meta).map_err(std::io::Error::other)?;
    write_sidecar_text(root, rel, &text, durable)
}

/// Writes the name sidecar of `rel` that points at link record `id`.
pub fn write_link_name(root: &Path, rel: &Path, id: &str, durable: bool) -> std::io::Result<()> {
    assert!(is_link_id(id), "link identity {id:?}");
    let name = LinkName {
        format: META_FORMAT,
        link: id.to_string(),
    };
    let text = toml::to_string(&name).map_err(std::io::Error::other)?;
    write_sidecar_text(root, rel, &text, durable)
}

fn check_meta(meta: &Meta) {
    assert_eq!(meta.format, META_FORMAT);
    assert!(meta.start < meta.branches.len().max(1));
    assert!(
        meta.link.as_deref().is_none_or(is_link_id),
        "link identity {:?}",
        meta.link
    );
}

/// Writes `text` to a file atomically: a temporary file in `root`'s
/// [`WORK_DIR`], renamed over `target`, whose directory `make_dir` makes
/// if it is missing (it may vanish meanwhile: an unlink removes an emptied
/// sidecar directory).
fn write_atomically(
    root: &Path,
    target: &Path,
    make_dir: &Path,
    text: &str,
    durable: bool,
) -> std::io::Result<()> {
    let tmp = temp_path(root)?;
    {
        use std::io::Write;
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(text.as_bytes())?;
        if durable {
            file.sync_all()?;
        }
    }
    let mut tries = 0;
    let renamed = loop {
        tries += 1;
        let _ = lower::create_dir(make_dir);
        match lower::rename(&tmp, target) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries < META_WRITE_TRIES => {}
            other => break other,
        }
    };
    if renamed.is_err() {
        let _ = lower::remove_file(&tmp);
    }
    renamed
}

/// A name's sidecar, whole or pointer, written atomically.
fn write_sidecar_text(root: &Path, rel: &Path, text: &str, durable: bool) -> std::io::Result<()> {
    write_atomically(
        root,
        &sidecar_path(root, rel),
        &meta_dir(root, rel),
        text,
        durable,
    )?;
    // A format 1 sidecar would hide a later removal of this one.
    remove_legacy(root, rel)
}

/// Removes a file's sidecar (either format) and its [`META_DIR`] if that
/// is then empty.
pub fn remove(root: &Path, rel: &Path) -> std::io::Result<()> {
    let gone = |r: std::io::Result<()>| match r {
        Err(e) if absent(&e) => Ok(()),
        other => other,
    };
    gone(lower::remove_file(sidecar_path(root, rel)))?;
    remove_legacy(root, rel)?;
    // Fails while other sidecars live there, as it should.
    let _ = lower::remove_dir(meta_dir(root, rel));
    Ok(())
}

/// Reads and checks a name's sidecar: Ok(None) if there is none.
pub fn read(root: &Path, rel: &Path) -> std::io::Result<Option<Sidecar>> {
    use std::io::Read;
    let mut path = sidecar_path(root, rel);
    let file = match lower::open(&path, OFlags::RDONLY, 0) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let Some(legacy) = legacy_sidecar_path(root, rel) else {
                return Ok(None);
            };
            path = legacy;
            match lower::open(&path, OFlags::RDONLY, 0) {
                Err(e) if absent(&e) => return Ok(None),
                other => other?,
            }
        }
        other => other?,
    };
    let mut text = String::new();
    file.take(META_MAX_BYTES).read_to_string(&mut text)?;
    decode(&path, &text).map(Some)
}

/// A sidecar's text: a name pointing at a link record (no `level`), or
/// whole metadata, checked.
fn decode(path: &Path, text: &str) -> std::io::Result<Sidecar> {
    let invalid = |why: &str| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: {why}", path.display()),
        )
    };
    // Parsed once; the table is then read as one shape or the other.
    let table: toml::Table = toml::from_str(text).map_err(|e| invalid(e.message()))?;
    if !table.contains_key("level") && table.contains_key("link") {
        let name: LinkName = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| invalid(e.message()))?;
        if name.format != META_FORMAT || !is_link_id(&name.link) {
            return Err(invalid("not a valid grove-raif name sidecar"));
        }
        return Ok(Sidecar::Link(name.link));
    }
    let meta: Meta = toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| invalid(e.message()))?;
    let bad = meta.format != META_FORMAT
        || meta.start >= meta.branches.len()
        || meta.level.check_width(meta.branches.len()).is_err()
        || grove_raif::layout::check_stripe_unit(meta.stripe_unit_bytes).is_err()
        || !meta.link.as_deref().is_none_or(is_link_id);
    if bad {
        return Err(invalid("not a valid grove-raif sidecar"));
    }
    Ok(Sidecar::Whole(meta))
}

/// Where link record `id` lives under `root`.
pub fn record_path(root: &Path, id: &str) -> PathBuf {
    assert!(is_link_id(id), "link identity {id:?}");
    root.join(LINKS_DIR).join(id)
}

/// Writes a linked file's metadata to its record atomically.
pub fn write_record(root: &Path, meta: &Meta, durable: bool) -> std::io::Result<()> {
    check_meta(meta);
    let id = meta.link.as_deref().expect("a record is a linked file's");
    assert!(meta.nlink >= 1, "a record with no name is removed instead");
    let text = toml::to_string(meta).map_err(std::io::Error::other)?;
    let dir = root.join(LINKS_DIR);
    write_atomically(root, &record_path(root, id), &dir, &text, durable)
}

/// Reads and checks link record `id`: Ok(None) if it is not there.
pub fn read_record(root: &Path, id: &str) -> std::io::Result<Option<Meta>> {
    let path = record_path(root, id);
    let text = match std::fs::File::open(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
        Ok(file) => {
            use std::io::Read;
            let mut text = String::new();
            file.take(META_MAX_BYTES).read_to_string(&mut text)?;
            text
        }
    };
    match decode(&path, &text)? {
        Sidecar::Whole(m) if m.link.as_deref() == Some(id) => Ok(Some(m)),
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: not the link record {id}", path.display()),
        )),
    }
}

/// Removes link record `id` under `root` (fine if it is not there).
pub fn remove_record(root: &Path, id: &str) -> std::io::Result<()> {
    match lower::remove_file(record_path(root, id)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The identities of the link records under `root`.
pub fn record_ids(root: &Path) -> std::io::Result<Vec<String>> {
    let entries = match std::fs::read_dir(root.join(LINKS_DIR)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        other => other?,
    };
    let mut ids = Vec::new();
    for entry in entries {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if is_link_id(&name) {
            ids.push(name);
        }
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    /// The longest name ext4 and most others take.
    const NAME_MAX_BYTES: usize = 255;

    /// A sidecar's name is the file's: a name of the longest length the
    /// lower file system takes still has one (format 1 prefixed it with
    /// `.grove-raif.`, and such names failed with ENAMETOOLONG).
    #[test]
    fn a_name_of_the_longest_length_has_a_sidecar() {
        let dir = tempfile::tempdir().unwrap();
        let rel = PathBuf::from("x".repeat(NAME_MAX_BYTES));
        write(dir.path(), &rel, &sample(7), true).unwrap();
        assert_eq!(whole(read(dir.path(), &rel)).size_bytes, 7);
        remove(dir.path(), &rel).unwrap();
        assert!(read(dir.path(), &rel).unwrap().is_none());
        assert!(
            !dir.path().join(META_DIR).exists(),
            "the empty meta dir goes"
        );
    }

    /// A temporary file a crash left (a sidecar before its rename) is gone
    /// after the next mount's clean-up, and the sidecar is untouched.
    #[test]
    fn a_crash_leftover_goes_at_the_next_mount() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), Path::new("f"), &sample(1), false).unwrap();
        std::fs::write(temp_path(dir.path()).unwrap(), b"torn").unwrap();
        clean_work_dir(dir.path()).unwrap();
        assert!(!dir.path().join(WORK_DIR).exists());
        assert!(read(dir.path(), Path::new("f")).unwrap().is_some());
        clean_work_dir(dir.path()).unwrap();
    }

    /// A format 1 sidecar is read, and replaced by the first write.
    #[test]
    fn a_format_1_sidecar_is_read_and_moved_on_write() {
        let dir = tempfile::tempdir().unwrap();
        let rel = Path::new("f");
        let text = toml::to_string(&sample(5)).unwrap();
        let legacy = legacy_sidecar_path(dir.path(), rel).unwrap();
        std::fs::write(&legacy, text).unwrap();
        assert_eq!(whole(read(dir.path(), rel)).size_bytes, 5);
        write(dir.path(), rel, &sample(6), false).unwrap();
        assert!(!legacy.exists());
        assert_eq!(whole(read(dir.path(), rel)).size_bytes, 6);
    }

    /// Files named `tmp` and `links` at the root: format 1's sidecar path
    /// of those names is grove's work directory or link record directory,
    /// which must be neither read nor removed as a sidecar (creating such
    /// a file failed with EISDIR). In a subdirectory they are plain names.
    #[test]
    fn files_named_like_groves_own_directories_have_sidecars() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(WORK_DIR)).unwrap();
        std::fs::create_dir(dir.path().join(LINKS_DIR)).unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        for (i, rel) in ["tmp", "links", "d/tmp", "d/links"].iter().enumerate() {
            let rel = Path::new(rel);
            assert!(read(dir.path(), rel).unwrap().is_none(), "{rel:?}");
            write(dir.path(), rel, &sample(i as u64), true).unwrap();
            assert_eq!(whole(read(dir.path(), rel)).size_bytes, i as u64);
            remove(dir.path(), rel).unwrap();
            assert!(read(dir.path(), rel).unwrap().is_none(), "{rel:?}");
        }
        assert!(dir.path().join(WORK_DIR).is_dir());
        assert!(dir.path().join(LINKS_DIR).is_dir());
    }

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
            link: None,
            nlink: 1,
        }
    }

    /// The whole metadata a sidecar read found.
    fn whole(read: std::io::Result<Option<Sidecar>>) -> Meta {
        match read.unwrap() {
            Some(Sidecar::Whole(m)) => m,
            other => panic!("not whole metadata: {other:?}"),
        }
    }

    /// A linked file: its record holds the metadata, each name a pointer;
    /// a file without links is written exactly as before (no new keys).
    #[test]
    fn a_link_record_and_its_names_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let plain = toml::to_string(&sample(1)).unwrap();
        assert!(!plain.contains("link"), "{plain}");
        let id = "0123456789abcdef";
        let mut m = sample(9);
        m.link = Some(id.into());
        m.nlink = 3;
        write_record(dir.path(), &m, true).unwrap();
        assert_eq!(read_record(dir.path(), id).unwrap(), Some(m));
        std::fs::create_dir(dir.path().join("d")).unwrap();
        write_link_name(dir.path(), Path::new("d/a"), id, false).unwrap();
        assert_eq!(
            read(dir.path(), Path::new("d/a")).unwrap(),
            Some(Sidecar::Link(id.into()))
        );
        assert_eq!(record_ids(dir.path()).unwrap(), vec![id.to_string()]);
        remove_record(dir.path(), id).unwrap();
        assert_eq!(read_record(dir.path(), id).unwrap(), None);
    }

    /// A name sidecar whose identity is not one grove makes (a path, say)
    /// is refused as invalid, never followed.
    #[test]
    fn a_name_pointing_anywhere_else_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let rel = Path::new("f");
        std::fs::create_dir(meta_dir(dir.path(), rel)).unwrap();
        std::fs::write(
            sidecar_path(dir.path(), rel),
            "format = 1\nlink = \"../../etc/passwd\"\n",
        )
        .unwrap();
        let err = read(dir.path(), rel).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{err}");
    }

    /// Two FUSE threads may write one file's sidecar at once (the release
    /// of one handle and the flush of another): no write may fail, and a
    /// reader meanwhile and afterwards must find a whole sidecar. Sharing
    /// one temporary name, renames failed with ENOENT and readers found
    /// torn sidecars: one text with another's tail.
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
        let m = whole(read(dir.path(), rel));
        assert_eq!(m, sample(m.size_bytes));
        assert_eq!(
            sidecar_path(dir.path(), rel),
            dir.path().join(".grove-raif/f")
        );
        let left = std::fs::read_dir(dir.path().join(WORK_DIR))
            .unwrap()
            .count();
        assert_eq!(left, 0, "no temporary file left");
    }
}
