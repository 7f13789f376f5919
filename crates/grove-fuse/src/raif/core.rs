//! The RAIF file system's state, apart from the FUSE glue: branches and
//! their health, the inode table (inode number to path below the mount),
//! open files with their component handles, and the operations on
//! files, directories and symlinks across the branches.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use grove_raif::config::{Config, FileFacts, Rule};
use grove_raif::{raid, start_branch, Balancer, BranchIo, Layout};
use rustix::fs::{FileType, OFlags};

use super::lower;
use super::meta::{self, Meta, META_DIR, META_FORMAT, RESERVED_PREFIX};

/// Mode bits of a component file on a branch: only root reads it there.
const COMPONENT_MODE: u32 = 0o600;
/// The root directory's inode.
pub const ROOT_INO: u64 = 1;
/// A test hook: `LABEL=MS[,LABEL=MS...]` delays every component read on
/// those branches, so that tests can make a branch slow through a real mount.
pub const READ_DELAY_ENV: &str = "GROVE_RAIF_READ_DELAY";
/// A test hook: `N` makes the mount's Nth write request (counting from 1)
/// stop for good in the RAID write hole, its new data written and its
/// parity or other mirror copies not, so that a test can kill -9 the mount
/// at exactly that point and show that scrub finds and repairs the stripe.
pub const WRITE_HOLE_ENV: &str = "GROVE_RAIF_WRITE_HOLE";
/// Bytes copied at a time when a file is laid out again.
const RELAYOUT_CHUNK_BYTES: u64 = 1024 * 1024;

/// Branches, their health and read latencies: shared by every open file.
pub struct Branches {
    pub config: Config,
    /// Each branch's directory: the config's, until a rebuild replaces it.
    roots: RwLock<Vec<PathBuf>>,
    failed: Vec<AtomicBool>,
    pub balancer: Balancer,
    /// Injected read delay per branch ([`READ_DELAY_ENV`]), zero normally.
    read_delay: Vec<Duration>,
    /// The branch a rebuild is refilling, if any: failed until it is
    /// whole, and shown as rebuilding meanwhile.
    rebuilding: Mutex<Option<usize>>,
}

impl Branches {
    pub fn new(config: Config) -> Branches {
        let n = config.branches.len();
        let read_delay = read_delays(&config);
        Branches {
            roots: RwLock::new(config.branches.iter().map(|b| b.path.clone()).collect()),
            config,
            failed: (0..n).map(|_| AtomicBool::new(false)).collect(),
            balancer: Balancer::new(n),
            read_delay,
            rebuilding: Mutex::new(None),
        }
    }

    pub fn root(&self, branch: usize) -> PathBuf {
        self.roots.read().unwrap_or_else(|e| e.into_inner())[branch].clone()
    }

    /// Points a branch at a new directory (a rebuild's replacement).
    pub fn set_root(&self, branch: usize, path: PathBuf) {
        self.roots.write().unwrap_or_else(|e| e.into_inner())[branch] = path;
    }

    pub fn set_rebuilding(&self, branch: Option<usize>) {
        assert!(
            branch.is_none_or(|b| self.is_failed(b)),
            "a branch being rebuilt is failed"
        );
        *lock(&self.rebuilding) = branch;
    }

    /// What `status` says of a branch: ok, failed, or rebuilding.
    pub fn state(&self, branch: usize) -> &'static str {
        if *lock(&self.rebuilding) == Some(branch) {
            "rebuilding"
        } else if self.is_failed(branch) {
            "failed"
        } else {
            "ok"
        }
    }

    /// Marks a rebuilt branch healthy again.
    pub fn revive(&self, branch: usize) {
        self.failed[branch].store(false, Ordering::Relaxed);
        tracing::info!(
            "branch {} ({}) rebuilt: redundancy restored",
            self.config.branches[branch].label,
            self.root(branch).display()
        );
    }

    pub fn count(&self) -> usize {
        self.config.branches.len()
    }

    pub fn is_failed(&self, branch: usize) -> bool {
        self.failed[branch].load(Ordering::Relaxed)
    }

    /// Marks a branch failed, once, with a log line: the mount is degraded.
    pub fn fail(&self, branch: usize, error: &io::Error) {
        if !self.failed[branch].swap(true, Ordering::Relaxed) {
            tracing::error!(
                "branch {} ({}) failed: {error}; the mount is degraded (see `grove raif status`)",
                self.config.branches[branch].label,
                self.root(branch).display()
            );
        }
    }

    pub fn healthy(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.count()).filter(|&b| !self.is_failed(b))
    }

    /// Fails every branch whose directory is gone. Needed besides
    /// [`Branches::check_error`]: an open file's component handles outlive
    /// the directory, and writes and fsyncs through them succeed on files
    /// nobody can reach any more.
    pub fn check_roots(&self) {
        for branch in self.healthy().collect::<Vec<_>>() {
            if !self.root(branch).is_dir() {
                let gone = io::Error::new(io::ErrorKind::NotFound, "its directory is gone");
                self.fail(branch, &gone);
            }
        }
    }

    /// Whether an error on a branch means the branch itself is gone: its
    /// root directory vanished, or the lower file system fails I/O.
    pub fn check_error(&self, branch: usize, error: &io::Error) {
        let gone = !self.root(branch).is_dir();
        let fatal =
            matches!(error.raw_os_error(), Some(libc_eio) if libc_eio == 5 || libc_eio == 30);
        if gone || fatal {
            self.fail(branch, error);
        }
    }

    /// The authoritative branch of a file name, and the one metadata copy.
    pub fn meta_branches(&self, rel: &Path) -> [usize; 2] {
        let name = rel.file_name().map(|n| n.as_encoded_bytes()).unwrap_or(b"");
        self.pair(name)
    }

    /// The branches of link record `id`: chosen as a name's are.
    pub fn record_branches(&self, id: &str) -> [usize; 2] {
        self.pair(id.as_bytes())
    }

    fn pair(&self, key: &[u8]) -> [usize; 2] {
        let n = self.count();
        let a = start_branch(key, n);
        [a, (a + 1) % n]
    }
}

/// An open regular file: its metadata and one handle per subset branch.
pub struct OpenFile {
    pub meta: RwLock<Meta>,
    /// Global branch indices of the layout's subset, in layout order.
    pub subset: Vec<usize>,
    /// One handle per subset branch (None: failed); a rebuild replaces one.
    pub components: Vec<RwLock<Option<File>>>,
    pub opens: Mutex<usize>,
    pub dirty: AtomicBool,
    /// Held while the metadata is written back: two FUSE threads may write
    /// it at once (one handle's release, the next one's flush), and the
    /// one that takes the metadata last must also write it last, or the
    /// sidecar keeps an older size.
    pub persisting: Mutex<()>,
    pub unlinked: AtomicBool,
}

impl OpenFile {
    pub fn layout(meta: &Meta) -> io::Result<Layout> {
        Layout::new(
            meta.level,
            meta.branches.len(),
            meta.stripe_unit_bytes,
            meta.start,
        )
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
    }
}

/// The components of one open file as the layout code sees them.
pub struct FileIo<'a> {
    pub branches: &'a Branches,
    pub file: &'a OpenFile,
}

impl FileIo<'_> {
    /// Runs `op` on the component handle of subset position `branch`.
    fn with_component<T>(
        &self,
        branch: usize,
        op: impl FnOnce(&File) -> io::Result<T>,
    ) -> io::Result<T> {
        let guard = self.file.components[branch]
            .read()
            .unwrap_or_else(|e| e.into_inner());
        op(guard
            .as_ref()
            .ok_or_else(|| io::Error::other("no component"))?)
    }

    /// A component read, delayed by the test hook and timed for the
    /// balancer; bytes past the component's end read as zeros.
    fn read_component(
        &self,
        file: &File,
        branch: usize,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<()> {
        let started = Instant::now();
        let delay = self.branches.read_delay[self.file.subset[branch]];
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let mut done = 0;
        while done < buf.len() {
            let n = file.read_at(&mut buf[done..], offset + done as u64)?;
            if n == 0 {
                break;
            }
            done += n;
        }
        buf[done..].fill(0);
        self.branches
            .balancer
            .record(self.file.subset[branch], started.elapsed());
        Ok(())
    }
}

impl BranchIo for FileIo<'_> {
    fn read_at(&self, branch: usize, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.with_component(branch, |file| {
            self.read_component(file, branch, offset, buf)
        })
    }

    fn write_at(&self, branch: usize, offset: u64, data: &[u8]) -> io::Result<()> {
        self.with_component(branch, |file| file.write_all_at(data, offset))
    }

    fn is_failed(&self, branch: usize) -> bool {
        self.file.components[branch]
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
            || self.branches.is_failed(self.file.subset[branch])
    }

    fn fail(&self, branch: usize, error: &io::Error) {
        self.branches.fail(self.file.subset[branch], error);
    }

    fn choose(&self, copies: &[usize]) -> usize {
        let global: Vec<usize> = copies.iter().map(|&b| self.file.subset[b]).collect();
        let chosen = self.branches.balancer.choose(&global);
        copies[global.iter().position(|&g| g == chosen).unwrap_or(0)]
    }
}

/// [`FileIo`] for the write [`WRITE_HOLE_ENV`] picks: it never leaves the
/// write hole.
struct HoleIo<'a>(FileIo<'a>);

impl BranchIo for HoleIo<'_> {
    fn read_at(&self, branch: usize, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.0.read_at(branch, offset, buf)
    }

    fn write_at(&self, branch: usize, offset: u64, data: &[u8]) -> io::Result<()> {
        self.0.write_at(branch, offset, data)
    }

    fn is_failed(&self, branch: usize) -> bool {
        self.0.is_failed(branch)
    }

    fn fail(&self, branch: usize, error: &io::Error) {
        self.0.fail(branch, error)
    }

    fn choose(&self, copies: &[usize]) -> usize {
        self.0.choose(copies)
    }

    fn data_written(&self, stripe: u64) {
        tracing::warn!(
            "{WRITE_HOLE_ENV}: this write stops for good in stripe {stripe}: data written, redundancy not"
        );
        loop {
            std::thread::park();
        }
    }
}

/// Inode numbers for paths below the mount, never reused while mounted.
/// A file with several names has one number for all of them: its names
/// are found by an identity (a link record's, or a lower inode's for a
/// replicated entry) as well as by path.
#[derive(Default)]
pub struct Inodes {
    /// The names known for each inode (one, unless it has hard links).
    by_ino: HashMap<u64, Vec<PathBuf>>,
    by_path: HashMap<PathBuf, u64>,
    /// The inode of each identity seen, kept while mounted (an open file
    /// whose known names all went must keep its number for another name).
    by_identity: HashMap<String, u64>,
    next: u64,
}

/// Identities of replicated entries (see [`Core::ino_of`]) begin with
/// this: they are lower inode numbers, reused by the lower file system, so
/// they are forgotten with their inode's last name.
const LOWER_IDENTITY_PREFIX: &str = "lower-";

impl Inodes {
    pub fn new() -> Inodes {
        let mut inodes = Inodes {
            next: ROOT_INO + 1,
            ..Inodes::default()
        };
        inodes.by_ino.insert(ROOT_INO, vec![PathBuf::new()]);
        inodes.by_path.insert(PathBuf::new(), ROOT_INO);
        inodes
    }

    /// A name of inode `ino`.
    pub fn path_of(&self, ino: u64) -> Option<&PathBuf> {
        self.by_ino.get(&ino).and_then(|names| names.first())
    }

    /// The inode `rel` already has, if any.
    pub fn known(&self, rel: &Path) -> Option<u64> {
        self.by_path.get(rel).copied()
    }

    /// The inode of `rel`, by its path alone (a file with one name).
    pub fn ino_for(&mut self, rel: &Path) -> u64 {
        if let Some(ino) = self.by_path.get(rel) {
            return *ino;
        }
        let ino = self.next;
        self.next += 1;
        self.add_name(ino, rel);
        ino
    }

    /// The inode of `rel`, a name of the file known by `identity`: the one
    /// that identity has, else the one the path has, else a new one.
    pub fn ino_for_identity(&mut self, rel: &Path, identity: &str) -> u64 {
        let by_path = self.by_path.get(rel).copied();
        match self.by_identity.get(identity).copied() {
            Some(ino) if by_path == Some(ino) => ino,
            Some(ino) => {
                self.forget_path(rel);
                self.add_name(ino, rel);
                ino
            }
            None => {
                let ino = self.ino_for(rel);
                self.by_identity.insert(identity.to_string(), ino);
                ino
            }
        }
    }

    /// `rel` becomes one more name of `ino` (a hard link).
    pub fn add_name(&mut self, ino: u64, rel: &Path) {
        assert!(
            !self.by_path.contains_key(rel),
            "{} has an inode",
            rel.display()
        );
        self.by_path.insert(rel.to_path_buf(), ino);
        self.by_ino.entry(ino).or_default().push(rel.to_path_buf());
        assert_eq!(self.by_path.get(rel), Some(&ino));
    }

    /// The inode of the file known by `identity`, if it has one.
    pub fn of_identity(&self, identity: &str) -> Option<u64> {
        self.by_identity.get(identity).copied()
    }

    /// Records that inode `ino` is the file known by `identity`.
    pub fn set_identity(&mut self, ino: u64, identity: &str) {
        self.by_identity.insert(identity.to_string(), ino);
    }

    pub fn forget_path(&mut self, rel: &Path) {
        let Some(ino) = self.by_path.remove(rel) else {
            return;
        };
        let names = self.by_ino.entry(ino).or_default();
        names.retain(|n| n != rel);
        if names.is_empty() {
            self.by_ino.remove(&ino);
            self.by_identity
                .retain(|id, i| *i != ino || !id.starts_with(LOWER_IDENTITY_PREFIX));
        }
        assert!(!self.by_path.contains_key(rel));
    }

    /// Moves `from` and everything below it to `to`.
    pub fn rename(&mut self, from: &Path, to: &Path) {
        self.forget_path(to);
        let moved: Vec<(PathBuf, u64)> = self
            .by_path
            .iter()
            .filter(|(p, _)| p.starts_with(from))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        for (old, ino) in moved {
            // join("") would add a trailing slash: the renamed entry itself is `to`.
            let rest = old.strip_prefix(from).unwrap_or(Path::new(""));
            let new = if rest.as_os_str().is_empty() {
                to.to_path_buf()
            } else {
                to.join(rest)
            };
            self.by_path.remove(&old);
            self.by_path.insert(new.clone(), ino);
            for name in self.by_ino.entry(ino).or_default() {
                if *name == old {
                    *name = new.clone();
                }
            }
        }
    }
}

/// The identity under which [`Inodes`] knows a replicated entry with
/// several names: its lower device and inode on the branch it was read
/// from.
pub fn lower_identity(m: &std::fs::Metadata) -> String {
    format!("{LOWER_IDENTITY_PREFIX}{}-{}", m.dev(), m.ino())
}

/// What a path below the mount is.
pub enum Node {
    File(Meta),
    /// A directory or symlink: the lower entry's metadata on one branch.
    Plain(std::fs::Metadata),
}

pub struct Core {
    pub branches: Arc<Branches>,
    pub inodes: Mutex<Inodes>,
    pub open: Mutex<HashMap<u64, Arc<OpenFile>>>,
    /// Taken shared by every FUSE request that changes something, and
    /// exclusively by a rebuild: a rebuild sees no write it could miss.
    pub gate: RwLock<()>,
    /// The last maintenance job (rebuild or scrub) and its progress.
    pub job: Mutex<Option<super::job::Job>>,
    /// Write requests so far, and the one [`WRITE_HOLE_ENV`] stops, if any.
    writes: AtomicU64,
    write_hole: Option<u64>,
}

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether a name is grove's own: a sidecar directory, a format 1 sidecar,
/// the work directory.
pub fn is_reserved(name: &std::ffi::OsStr) -> bool {
    name == META_DIR
        || name
            .as_encoded_bytes()
            .starts_with(RESERVED_PREFIX.as_bytes())
}

impl Core {
    pub fn new(config: Config) -> Core {
        Core {
            branches: Arc::new(Branches::new(config)),
            inodes: Mutex::new(Inodes::new()),
            open: Mutex::new(HashMap::new()),
            gate: RwLock::new(()),
            job: Mutex::new(None),
            writes: AtomicU64::new(0),
            write_hole: write_hole(),
        }
    }

    pub fn path_of(&self, ino: u64) -> io::Result<PathBuf> {
        lock(&self.inodes)
            .path_of(ino)
            .cloned()
            .ok_or_else(|| io::Error::from_raw_os_error(2))
    }

    /// The inode of a name whose node has not been read (a new file).
    pub fn ino_for(&self, rel: &Path) -> u64 {
        lock(&self.inodes).ino_for(rel)
    }

    /// The inode of `rel`, whose node is `node`: every name of a file with
    /// hard links gets the same one.
    pub fn ino_of(&self, rel: &Path, node: &Node) -> u64 {
        let identity = match node {
            Node::File(m) => m.link.clone(),
            Node::Plain(m) if !m.is_dir() && m.nlink() > 1 => Some(lower_identity(m)),
            Node::Plain(_) => None,
        };
        let mut inodes = lock(&self.inodes);
        match identity {
            Some(id) => inodes.ino_for_identity(rel, &id),
            None => inodes.ino_for(rel),
        }
    }

    /// The inode of a name a directory listing shows, reading no more than
    /// its sidecar (a link names its record) or its lower entry.
    pub fn ino_listed(&self, rel: &Path, is_file: bool) -> u64 {
        if let Some(ino) = lock(&self.inodes).known(rel) {
            return ino;
        }
        let identity = if is_file {
            self.read_sidecar(rel).ok().flatten().and_then(|s| match s {
                meta::Sidecar::Link(id) => Some(id),
                meta::Sidecar::Whole(_) => None,
            })
        } else {
            self.lower_metadata(rel)
                .ok()
                .filter(|m| !m.is_dir() && m.nlink() > 1)
                .map(|m| lower_identity(&m))
        };
        let mut inodes = lock(&self.inodes);
        match identity {
            Some(id) => inodes.ino_for_identity(rel, &id),
            None => inodes.ino_for(rel),
        }
    }

    pub fn open_file(&self, ino: u64) -> Option<Arc<OpenFile>> {
        lock(&self.open).get(&ino).cloned()
    }

    /// The metadata of a file: its name's sidecar, and the link record
    /// that sidecar points at if the file has had several names.
    pub fn read_meta(&self, rel: &Path) -> io::Result<Option<Meta>> {
        match self.read_sidecar(rel)? {
            None => Ok(None),
            Some(meta::Sidecar::Whole(m)) => Ok(Some(m)),
            Some(meta::Sidecar::Link(id)) => {
                let what = format!("the link record {id} of {}", rel.display());
                let found =
                    self.read_copies(self.branches.record_branches(&id), &what, |root| {
                        meta::read_record(root, &id)
                    })?;
                found.map(Some).ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidData, format!("{what} is missing"))
                })
            }
        }
    }

    /// A name's sidecar: the authoritative branch, its copy, then any
    /// branch (a file whose metadata branches failed).
    pub fn read_sidecar(&self, rel: &Path) -> io::Result<Option<meta::Sidecar>> {
        let what = format!("the metadata of {}", rel.display());
        self.read_copies(self.branches.meta_branches(rel), &what, |root| {
            meta::read(root, rel)
        })
    }

    /// The first copy `read` finds on the `preferred` branches, then on
    /// any other healthy one.
    fn read_copies<T>(
        &self,
        preferred: [usize; 2],
        what: &str,
        read: impl Fn(&Path) -> io::Result<Option<T>>,
    ) -> io::Result<Option<T>> {
        let b = &self.branches;
        let order = preferred
            .into_iter()
            .chain((0..b.count()).filter(|x| !preferred.contains(x)));
        let mut last_error = None;
        for branch in order.filter(|&x| !b.is_failed(x)) {
            match read(&b.root(branch)) {
                Ok(Some(found)) => return Ok(Some(found)),
                Ok(None) => {}
                Err(e) => {
                    // Said, since the next copy may hide it until that one is lost too.
                    tracing::warn!(
                        "cannot read {what} on branch {}: {e}",
                        b.config.branches[branch].label
                    );
                    b.check_error(branch, &e);
                    last_error = Some(e);
                }
            }
        }
        last_error.map_or(Ok(None), Err)
    }

    /// Writes a file's metadata: to its link record if it has one (see
    /// [`Core::write_record`]), else to the sidecar of its name `rel`.
    pub fn write_meta(&self, rel: &Path, m: &Meta, durable: bool) -> io::Result<()> {
        if m.link.is_some() {
            return self.write_record(m, durable);
        }
        self.write_copies(self.branches.meta_branches(rel), |root| {
            meta::write(root, rel, m, durable)
        })
    }

    /// Writes a linked file's metadata to its record's two branches.
    pub fn write_record(&self, m: &Meta, durable: bool) -> io::Result<()> {
        let id = m.link.as_deref().expect("a linked file");
        self.write_copies(self.branches.record_branches(id), |root| {
            meta::write_record(root, m, durable)
        })
    }

    /// Writes the sidecar of name `rel` of linked file `id` (a pointer).
    pub fn write_link_name(&self, rel: &Path, id: &str, durable: bool) -> io::Result<()> {
        self.write_copies(self.branches.meta_branches(rel), |root| {
            meta::write_link_name(root, rel, id, durable)
        })
    }

    /// What name `rel`'s sidecar says of `m`: all of it, or where its
    /// link record is.
    pub fn write_name(&self, root: &Path, rel: &Path, m: &Meta, durable: bool) -> io::Result<()> {
        match &m.link {
            Some(id) => meta::write_link_name(root, rel, id, durable),
            None => meta::write(root, rel, m, durable),
        }
    }

    /// Runs `write` on the two `preferred` branches; if both are lost,
    /// on the first healthy one, so that the metadata is kept somewhere.
    fn write_copies(
        &self,
        preferred: [usize; 2],
        write: impl Fn(&Path) -> io::Result<()>,
    ) -> io::Result<()> {
        let b = &self.branches;
        let mut written = 0;
        let mut last_error = None;
        for branch in preferred {
            if b.is_failed(branch) {
                continue;
            }
            match write(&b.root(branch)) {
                Ok(()) => written += 1,
                Err(e) => {
                    b.check_error(branch, &e);
                    last_error = Some(e);
                }
            }
        }
        if written == 0 {
            if let Some(branch) = b.healthy().next() {
                return write(&b.root(branch));
            }
            return Err(last_error.unwrap_or_else(|| io::Error::from_raw_os_error(5)));
        }
        Ok(())
    }

    pub fn node(&self, rel: &Path) -> io::Result<Node> {
        if let Some(ino) = lock(&self.inodes).known(rel) {
            if let Some(file) = self.open_file(ino) {
                return Ok(Node::File(
                    file.meta.read().unwrap_or_else(|e| e.into_inner()).clone(),
                ));
            }
        }
        if rel.as_os_str().is_empty() {
            return self.lower_metadata(rel).map(Node::Plain);
        }
        if let Some(m) = self.read_meta(rel)? {
            // A name not seen yet of a linked file open under another one:
            // the open state is newer than the record (sizes not written back).
            let ino = m
                .link
                .as_deref()
                .and_then(|id| lock(&self.inodes).of_identity(id));
            if let Some(file) = ino.and_then(|ino| self.open_file(ino)) {
                return Ok(Node::File(
                    file.meta.read().unwrap_or_else(|e| e.into_inner()).clone(),
                ));
            }
            return Ok(Node::File(m));
        }
        self.lower_metadata(rel).map(Node::Plain)
    }

    /// A directory's link count as the user sees it, from the first
    /// healthy branch that has it (directories are on every branch).
    pub fn dir_nlink(&self, rel: &Path, m: &std::fs::Metadata) -> u32 {
        self.branches
            .healthy()
            .map(|b| self.branches.root(b).join(rel))
            .find(|p| lower::is_dir(p))
            .map_or(2, |p| super::plain::dir_nlink(&p, m))
    }

    /// lstat of a directory, symlink or special file (anything but a
    /// regular file, which is a component) on the first healthy branch
    /// with it.
    pub fn lower_metadata(&self, rel: &Path) -> io::Result<std::fs::Metadata> {
        let mut last = io::Error::from_raw_os_error(2);
        for branch in self.branches.healthy() {
            match lower::symlink_metadata(self.branches.root(branch).join(rel)) {
                Ok(m) if !m.is_file() => return Ok(m),
                Ok(_) => {}
                Err(e) => {
                    self.branches.check_error(branch, &e);
                    last = e;
                }
            }
        }
        Err(last)
    }

    /// Names in a directory, over every healthy branch: sidecars stand for
    /// their files; component files and grove's own files are hidden.
    pub fn list(&self, rel: &Path) -> io::Result<BTreeMap<String, bool>> {
        let mut names = BTreeMap::new();
        let mut any = false;
        for branch in self.branches.healthy() {
            let dir = self.branches.root(branch).join(rel);
            let Ok(entries) = lower::read_dir(&dir) else {
                continue;
            };
            any = true;
            for entry in entries {
                let name = entry.name.to_string_lossy().into_owned();
                let kind = entry.kind;
                if let Some(file) = name.strip_prefix(RESERVED_PREFIX) {
                    // A format 1 sidecar.
                    if !file.starts_with("tmp.") && kind == FileType::RegularFile {
                        names.insert(file.to_string(), true);
                    }
                } else if name == META_DIR && kind == FileType::Directory {
                    for sidecar in lower::read_dir(dir.join(META_DIR))? {
                        names.insert(sidecar.name.to_string_lossy().into_owned(), true);
                    }
                } else if kind != FileType::RegularFile {
                    names.entry(name).or_insert(false);
                }
            }
        }
        if !any {
            return Err(io::Error::from_raw_os_error(2));
        }
        Ok(names)
    }

    /// Creates an empty file with the layout its rule gives.
    pub fn create(&self, rel: &Path, mode: u32, uid: u32, gid: u32) -> io::Result<Meta> {
        if self.read_meta(rel)?.is_some() || self.lower_metadata(rel).is_ok() {
            return Err(io::Error::from_raw_os_error(17));
        }
        let config = &self.branches.config;
        let path_text = rel.to_string_lossy();
        let rule = config.rule_for(&FileFacts {
            path: &path_text,
            uid,
            gid,
            size_bytes: 0,
        });
        let name = rel.file_name().map(|n| n.as_encoded_bytes()).unwrap_or(b"");
        let now = meta::now_ns();
        let m = Meta {
            format: META_FORMAT,
            level: rule.level,
            stripe_unit_bytes: rule.stripe_unit_bytes,
            start: start_branch(name, rule.branches.len()),
            branches: rule
                .branches
                .iter()
                .map(|&b| config.branches[b].label.clone())
                .collect(),
            rule: rule.name.clone(),
            size_bytes: 0,
            mode: libc_s_ifreg() | (mode & 0o7777),
            uid,
            gid,
            atime_ns: now,
            mtime_ns: now,
            ctime_ns: now,
            link: None,
            nlink: 1,
        };
        let layout = OpenFile::layout(&m)?;
        let mut made = 0;
        for &branch in &rule.branches {
            if self.branches.is_failed(branch) {
                continue;
            }
            match create_component(&self.branches.root(branch).join(rel)) {
                Ok(_) => made += 1,
                Err(e) => self.branches.check_error(branch, &e),
            }
        }
        let lost = rule.branches.len() - made;
        if lost > 0 && !raid::survives(&layout, &lost_positions(&self.branches, &rule.branches)) {
            return Err(io::Error::from_raw_os_error(5));
        }
        self.write_meta(rel, &m, false)?;
        Ok(m)
    }

    /// Opens (or shares) the file state of a regular file.
    pub fn open(&self, ino: u64, rel: &Path) -> io::Result<Arc<OpenFile>> {
        self.branches.check_roots();
        let mut open = lock(&self.open);
        if let Some(file) = open.get(&ino) {
            *lock(&file.opens) += 1;
            return Ok(file.clone());
        }
        let m = self
            .read_meta(rel)?
            .ok_or_else(|| io::Error::from_raw_os_error(2))?;
        let subset = self.subset_of(&m)?;
        let components = subset
            .iter()
            .map(|&branch| {
                if self.branches.is_failed(branch) {
                    return None;
                }
                let path = self.branches.root(branch).join(rel);
                match lower::open(&path, OFlags::RDWR, 0) {
                    Ok(f) => Some(f),
                    Err(e) => {
                        tracing::warn!("cannot open {}: {e}", path.display());
                        self.branches.check_error(branch, &e);
                        None
                    }
                }
            })
            .map(RwLock::new)
            .collect();
        let file = Arc::new(OpenFile {
            meta: RwLock::new(m),
            subset,
            components,
            opens: Mutex::new(1),
            dirty: AtomicBool::new(false),
            persisting: Mutex::new(()),
            unlinked: AtomicBool::new(false),
        });
        open.insert(ino, file.clone());
        Ok(file)
    }

    /// Global branch indices of a file's subset, from its labels.
    pub fn subset_of(&self, m: &Meta) -> io::Result<Vec<usize>> {
        m.branches
            .iter()
            .map(|label| {
                self.branches.config.branch_index(label).ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("unknown branch {label}"),
                    )
                })
            })
            .collect()
    }

    /// Lets go of one open; the last one writes metadata back and, if a
    /// rule with a size threshold now picks another layout for the file,
    /// lays it out again (see [`Core::relayout`]).
    pub fn release(&self, ino: u64) -> io::Result<()> {
        // Before the open table's lock: node() takes the inode lock first.
        let rel = self.path_of(ino);
        // Held to the end: nobody opens the file while it is laid out
        // again. Nothing below takes the inode lock (node() takes that
        // one first, then this one).
        let mut open = lock(&self.open);
        let Some(file) = open.get(&ino).cloned() else {
            return Ok(());
        };
        let mut opens = lock(&file.opens);
        *opens = opens.saturating_sub(1);
        let last = *opens == 0;
        drop(opens);
        if file.unlinked.load(Ordering::Relaxed) {
            // Its names are gone: the last close drops the component
            // handles, and the lower file systems free the space.
            if last {
                open.remove(&ino);
            }
            return Ok(());
        }
        // A linked file's metadata is its record: no name is needed (and
        // the names this mount knows may all be gone, another left).
        let rel = rel.ok();
        if !last {
            drop(open);
            return self.persist_at(rel.as_deref(), &file, false);
        }
        let result = self.persist_at(rel.as_deref(), &file, false);
        if let (true, Some(rel)) = (result.is_ok(), &rel) {
            if let Err(e) = self.relayout(rel, &file) {
                tracing::warn!(
                    "{}: kept its layout, cannot lay it out again: {e}",
                    rel.display()
                );
            }
        }
        open.remove(&ino);
        result
    }

    /// Lays a closed file out again when the rule that applies to it now
    /// (its size having crossed a rule's `min_size`) is not the one that
    /// laid it out: the data is copied into hidden components (in each new
    /// branch's [`meta::WORK_DIR`]) and synced; then the components are
    /// renamed into place, the old rule's other components removed, and the
    /// sidecars rewritten durably. A crash during those last renames can
    /// leave sidecars and components of different layouts: the same window
    /// as a rename's.
    pub fn relayout(&self, rel: &Path, file: &OpenFile) -> io::Result<()> {
        let old = file.meta.read().unwrap_or_else(|e| e.into_inner()).clone();
        let config = &self.branches.config;
        let text = rel.to_string_lossy();
        let rule = config.rule_for(&FileFacts {
            path: &text,
            uid: old.uid,
            gid: old.gid,
            size_bytes: old.size_bytes,
        });
        if rule.name == old.rule {
            return Ok(());
        }
        if old.link.is_some() {
            // Its components are hard links at every name, and not every
            // name is known here: it keeps the layout it was made with.
            tracing::info!(
                "{}: has hard links, keeps its layout (rule {}, {} now)",
                rel.display(),
                old.rule,
                rule.name
            );
            return Ok(());
        }
        let new = meta_under_rule(&old, rule, config, rel);
        let (temps, temp) = self.staging_file(&new, rule);
        if let Err(e) = self.copy_into(file, &old, &temp, &new) {
            for t in temps.iter().flatten() {
                let _ = remove_if_there(t);
            }
            return Err(e);
        }
        self.move_into_place(rel, rule, &temps, &temp, &old)?;
        self.write_meta(rel, &new, true)?;
        *file.meta.write().unwrap_or_else(|e| e.into_inner()) = new;
        tracing::info!("{}: laid out again by rule {}", rel.display(), rule.name);
        Ok(())
    }

    /// A file of `new`'s layout whose components start in the work
    /// directories of the rule's branches (none on a failed branch), and
    /// their paths there.
    fn staging_file(&self, new: &Meta, rule: &Rule) -> (Vec<Option<PathBuf>>, OpenFile) {
        let temps: Vec<Option<PathBuf>> = rule
            .branches
            .iter()
            .map(|&b| {
                (!self.branches.is_failed(b))
                    .then(|| meta::temp_path(&self.branches.root(b)).ok())
                    .flatten()
            })
            .collect();
        let temp = OpenFile {
            meta: RwLock::new(new.clone()),
            subset: rule.branches.clone(),
            components: temps
                .iter()
                .map(|t| RwLock::new(t.as_ref().and_then(|t| create_component(t).ok())))
                .collect(),
            opens: Mutex::new(1),
            dirty: AtomicBool::new(false),
            persisting: Mutex::new(()),
            unlinked: AtomicBool::new(false),
        };
        (temps, temp)
    }

    /// Renames the staged components over the file's name on the rule's
    /// branches, and removes the old layout's components from the others.
    fn move_into_place(
        &self,
        rel: &Path,
        rule: &Rule,
        temps: &[Option<PathBuf>],
        temp: &OpenFile,
        old: &Meta,
    ) -> io::Result<()> {
        for (position, &b) in rule.branches.iter().enumerate() {
            let made = temp.components[position]
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .is_some();
            if let (true, Some(t)) = (made, &temps[position]) {
                lower::rename(t, self.branches.root(b).join(rel))?;
            }
        }
        for b in self.subset_of(old)? {
            if !rule.branches.contains(&b) && !self.branches.is_failed(b) {
                let _ = remove_if_there(&self.branches.root(b).join(rel));
            }
        }
        Ok(())
    }

    /// Copies a file's data from its layout into another one, and syncs it.
    fn copy_into(&self, from: &OpenFile, old: &Meta, to: &OpenFile, new: &Meta) -> io::Result<()> {
        let lost = lost_positions(&self.branches, &to.subset);
        let new_layout = OpenFile::layout(new)?;
        if !raid::survives(&new_layout, &lost) {
            return Err(io::Error::from_raw_os_error(5));
        }
        let old_layout = OpenFile::layout(old)?;
        let (source, target) = (
            FileIo {
                branches: &self.branches,
                file: from,
            },
            FileIo {
                branches: &self.branches,
                file: to,
            },
        );
        let mut offset = 0;
        while offset < old.size_bytes {
            let len = RELAYOUT_CHUNK_BYTES.min(old.size_bytes - offset);
            let mut buf = vec![0u8; len as usize];
            raid::read(&old_layout, &source, offset, &mut buf).map_err(raid_error)?;
            raid::write(&new_layout, &target, offset, &buf).map_err(raid_error)?;
            offset += len;
        }
        for c in &to.components {
            if let Some(c) = c.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
                c.set_len(new_layout.component_bytes(new.size_bytes))?;
                c.sync_all()?;
            }
        }
        Ok(())
    }

    /// Lets go of one open without anything else (maintenance jobs).
    pub fn close(&self, ino: u64) -> io::Result<()> {
        let mut open = lock(&self.open);
        let Some(file) = open.get(&ino).cloned() else {
            return Ok(());
        };
        let mut opens = lock(&file.opens);
        *opens = opens.saturating_sub(1);
        if *opens == 0 {
            open.remove(&ino);
        }
        drop(opens);
        drop(open);
        self.persist(ino, &file, false)
    }

    /// Writes a dirty file's metadata back (durably for fsync).
    pub fn persist(&self, ino: u64, file: &OpenFile, durable: bool) -> io::Result<()> {
        if file.unlinked.load(Ordering::Relaxed) || !(file.dirty.load(Ordering::Relaxed) || durable)
        {
            return Ok(());
        }
        self.persist_at(self.path_of(ino).ok().as_deref(), file, durable)
    }

    /// [`Core::persist`] for a file whose name `rel` is known (a linked
    /// file's metadata is its record: it needs none).
    fn persist_at(&self, rel: Option<&Path>, file: &OpenFile, durable: bool) -> io::Result<()> {
        let _turn = lock(&file.persisting);
        if file.unlinked.load(Ordering::Relaxed)
            || !(file.dirty.swap(false, Ordering::Relaxed) || durable)
        {
            return Ok(());
        }
        let m = file.meta.read().unwrap_or_else(|e| e.into_inner()).clone();
        match (&m.link, rel) {
            (Some(_), _) => self.write_record(&m, durable),
            (None, Some(rel)) => self.write_meta(rel, &m, durable),
            (None, None) => {
                // Not written: mark it dirty again for a later write-back.
                file.dirty.store(true, Ordering::Relaxed);
                Err(io::Error::from_raw_os_error(2))
            }
        }
    }

    pub fn read(&self, file: &OpenFile, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        let m = file.meta.read().unwrap_or_else(|e| e.into_inner());
        if offset >= m.size_bytes {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; len.min(m.size_bytes - offset) as usize];
        let layout = OpenFile::layout(&m)?;
        let io = FileIo {
            branches: &self.branches,
            file,
        };
        raid::read(&layout, &io, offset, &mut buf).map_err(raid_error)?;
        Ok(buf)
    }

    pub fn write(&self, file: &OpenFile, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut m = file.meta.write().unwrap_or_else(|e| e.into_inner());
        let layout = OpenFile::layout(&m)?;
        let io = FileIo {
            branches: &self.branches,
            file,
        };
        let n = self.writes.fetch_add(1, Ordering::Relaxed) + 1;
        let written = if self.write_hole == Some(n) {
            raid::write(&layout, &HoleIo(io), offset, data)
        } else {
            raid::write(&layout, &io, offset, data)
        };
        written.map_err(raid_error)?;
        m.size_bytes = m.size_bytes.max(offset + data.len() as u64);
        m.mtime_ns = meta::now_ns();
        m.ctime_ns = m.mtime_ns;
        file.dirty.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Sets a file's size. Shrinking zeroes the rest of the last stripe
    /// first, so that parity stays right and growing again reads zeros.
    pub fn truncate(&self, file: &OpenFile, size_bytes: u64) -> io::Result<()> {
        let mut m = file.meta.write().unwrap_or_else(|e| e.into_inner());
        let layout = OpenFile::layout(&m)?;
        let io = FileIo {
            branches: &self.branches,
            file,
        };
        if size_bytes < m.size_bytes {
            let stripe_end = layout.stripe_count(size_bytes) * layout.stripe_data_bytes();
            let zero_end = stripe_end.min(m.size_bytes);
            if zero_end > size_bytes {
                let zeros = vec![0u8; (zero_end - size_bytes) as usize];
                raid::write(&layout, &io, size_bytes, &zeros).map_err(raid_error)?;
            }
            let component_bytes = layout.component_bytes(size_bytes);
            for (b, component) in file.components.iter().enumerate() {
                if let Some(c) = component.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
                    if let Err(e) = c.set_len(component_bytes) {
                        io.fail(b, &e);
                    }
                }
            }
        }
        m.size_bytes = size_bytes;
        m.mtime_ns = meta::now_ns();
        m.ctime_ns = m.mtime_ns;
        file.dirty.store(true, Ordering::Relaxed);
        Ok(())
    }

    pub fn fsync(&self, ino: u64, file: &OpenFile) -> io::Result<()> {
        // What went to a vanished branch is not durable: fail it first.
        self.branches.check_roots();
        for (b, component) in file.components.iter().enumerate() {
            if let Some(c) = component.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
                if let Err(e) = c.sync_all() {
                    self.branches.fail(file.subset[b], &e);
                }
            }
        }
        self.persist(ino, file, true)
    }

    /// Does `op` on every healthy branch; fine if it worked on one.
    pub fn on_all(&self, mut op: impl FnMut(&Path) -> io::Result<()>) -> io::Result<()> {
        let mut ok = 0;
        let mut last = None;
        for branch in self.branches.healthy().collect::<Vec<_>>() {
            match op(&self.branches.root(branch)) {
                Ok(()) => ok += 1,
                Err(e)
                    if e.kind() == io::ErrorKind::NotFound
                        && self.branches.root(branch).is_dir() => {}
                Err(e) => {
                    self.branches.check_error(branch, &e);
                    last = Some(e);
                }
            }
        }
        match (ok, last) {
            (0, Some(e)) => Err(e),
            (0, None) => Err(io::Error::from_raw_os_error(2)),
            _ => Ok(()),
        }
    }

    /// Removes a directory or symlink from every branch with `remove`
    /// (`remove_dir` or `remove_file`), and forgets its inode.
    pub fn remove_plain(&self, rel: &Path, remove: fn(&Path) -> io::Result<()>) -> io::Result<()> {
        self.on_all(|root| remove(&root.join(rel)))?;
        lock(&self.inodes).forget_path(rel);
        Ok(())
    }

    /// Removes an empty directory from every branch (ENOTEMPTY if it has
    /// any entry on any healthy branch), with the sidecar directory that
    /// may be left in it.
    pub fn remove_empty_dir(&self, rel: &Path) -> io::Result<()> {
        self.check_empty_dir(rel)?;
        self.remove_plain(rel, |p| lower::remove_dir(p))
    }

    /// ENOTEMPTY unless the directory has no entry; its (then empty)
    /// sidecar directories go, since the lower file systems count them.
    pub fn check_empty_dir(&self, rel: &Path) -> io::Result<()> {
        if !self.list(rel)?.is_empty() {
            return Err(io::Error::from_raw_os_error(39));
        }
        for branch in self.branches.healthy().collect::<Vec<_>>() {
            let ours = self.branches.root(branch).join(rel).join(META_DIR);
            match lower::remove_dir(&ours) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    /// Removes a regular file's components and sidecars everywhere. A file
    /// still open stays readable and writable through its component
    /// handles (the lower files live on, nameless, until those close), and
    /// its inode answers fstat until the last close: nothing is renamed or
    /// kept on the branches, so a crash meanwhile leaves nothing behind.
    pub fn unlink_file(&self, rel: &Path, m: &Meta) -> io::Result<()> {
        if m.link.is_some() {
            return self.unlink_linked(rel, m);
        }
        self.on_all(|root| {
            let component = remove_if_there(&root.join(rel));
            meta::remove(root, rel).and(component)
        })?;
        let mut inodes = lock(&self.inodes);
        let ino = inodes.known(rel);
        if let Some(file) = ino.and_then(|i| self.open_file(i)) {
            file.unlinked.store(true, Ordering::Relaxed);
            let mut m = file.meta.write().unwrap_or_else(|e| e.into_inner());
            m.ctime_ns = meta::now_ns();
        }
        inodes.forget_path(rel);
        Ok(())
    }

    /// An open file whose every name is gone, by inode.
    pub fn unlinked_open(&self, ino: u64) -> Option<Arc<OpenFile>> {
        self.open_file(ino)
            .filter(|f| f.unlinked.load(Ordering::Relaxed))
    }

    /// Renames a regular file: components on every branch, and metadata
    /// to the new name's authoritative branch and copy.
    pub fn rename_file(&self, from: &Path, to: &Path, m: &Meta) -> io::Result<()> {
        match &m.link {
            // A name of a linked file: only its pointer moves.
            Some(id) => self.write_link_name(to, id, false)?,
            None => self.write_meta(to, m, false)?,
        }
        let new_meta = self.branches.meta_branches(to);
        self.on_all(|root| {
            if lower::exists(root.join(from)) {
                lower::rename(root.join(from), root.join(to))?;
            }
            Ok(())
        })?;
        for branch in self.branches.healthy().collect::<Vec<_>>() {
            let root = self.branches.root(branch);
            let _ = meta::remove(&root, from);
            if !new_meta.contains(&branch) {
                let _ = meta::remove(&root, to);
            }
        }
        lock(&self.inodes).rename(from, to);
        Ok(())
    }
}

/// Parses [`READ_DELAY_ENV`]: a delay per branch, zero where not named.
fn read_delays(config: &Config) -> Vec<Duration> {
    let mut delays = vec![Duration::ZERO; config.branches.len()];
    let text = std::env::var(READ_DELAY_ENV).unwrap_or_default();
    for item in text.split(',').filter(|i| !i.is_empty()) {
        let parsed = item
            .split_once('=')
            .and_then(|(label, ms)| Some((config.branch_index(label)?, ms.parse::<u64>().ok()?)));
        match parsed {
            Some((branch, ms)) => delays[branch] = Duration::from_millis(ms),
            None => tracing::warn!("{READ_DELAY_ENV}: ignoring {item:?} (want LABEL=MS)"),
        }
    }
    delays
}

/// Parses [`WRITE_HOLE_ENV`]: the write request to stop, if any.
fn write_hole() -> Option<u64> {
    let text = std::env::var(WRITE_HOLE_ENV).ok()?;
    match text.parse::<u64>() {
        Ok(n) if n > 0 => Some(n),
        _ => {
            tracing::warn!("{WRITE_HOLE_ENV}: ignoring {text:?} (want a request number from 1)");
            None
        }
    }
}

pub fn remove_if_there(path: &Path) -> io::Result<()> {
    match lower::remove_file(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// A new, empty component at `path`. Whatever a crash left there is
/// unlinked first, never truncated: it may be a hard link of another
/// file's component (a link cut short).
pub fn create_component(path: &Path) -> io::Result<File> {
    remove_if_there(path)?;
    let flags = OFlags::RDWR | OFlags::CREATE | OFlags::EXCL;
    lower::open(path, flags, COMPONENT_MODE)
}

/// Positions within a subset whose branches are failed.
pub fn lost_positions(branches: &Branches, subset: &[usize]) -> Vec<usize> {
    (0..subset.len())
        .filter(|&p| branches.is_failed(subset[p]))
        .collect()
}

pub fn raid_error(e: raid::RaidError) -> io::Error {
    tracing::error!("{e}");
    io::Error::from_raw_os_error(5)
}

/// S_IFREG: st_mode's type bits of a regular file.
pub fn libc_s_ifreg() -> u32 {
    0o100_000
}
/// `old`'s metadata as `rule` lays the file at `rel` out: its level, unit,
/// branches and starting branch.
fn meta_under_rule(old: &Meta, rule: &Rule, config: &Config, rel: &Path) -> Meta {
    let name = rel.file_name().unwrap_or_default();
    let mut new = old.clone();
    new.level = rule.level;
    new.stripe_unit_bytes = rule.stripe_unit_bytes;
    new.start = start_branch(name.as_encoded_bytes(), rule.branches.len());
    new.branches = rule
        .branches
        .iter()
        .map(|&b| config.branches[b].label.clone())
        .collect();
    new.rule = rule.name.clone();
    new
}

/// st_mode of a lower entry.
pub fn lower_mode(m: &std::fs::Metadata) -> u32 {
    m.mode()
}

#[cfg(test)]
mod tests {
    use super::*;
    use grove_raif::Level;

    /// Threads writing and writing back one open file at once.
    const WRITERS: u64 = 4;
    /// Rounds of write then write-back each makes.
    const ROUNDS_EACH: u64 = 300;

    /// A core over `width` fresh branch directories in `dir`.
    fn core(dir: &Path, level: Level, width: usize) -> Core {
        let paths: Vec<PathBuf> = (0..width).map(|i| dir.join(format!("b{i}"))).collect();
        paths.iter().for_each(|p| std::fs::create_dir(p).unwrap());
        Core::new(Config::simple(level, 4096, &paths).unwrap())
    }

    /// Write-backs of one file race (one handle's release, the next one's
    /// flush); once they are over, every sidecar must hold the metadata
    /// the file has in memory, not an older size a slower writer took.
    #[test]
    fn racing_write_backs_leave_the_newest_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let core = core(dir.path(), Level::Raif1, 2);
        let rel = Path::new("f");
        core.create(rel, 0o644, 0, 0).unwrap();
        let ino = core.ino_for(rel);
        let file = core.open(ino, rel).unwrap();
        let start = std::sync::Barrier::new(WRITERS as usize + 1);
        let end = std::sync::Barrier::new(WRITERS as usize + 1);
        let mut stale = Vec::new();
        std::thread::scope(|s| {
            for writer in 0..WRITERS {
                let (core, file, start, end) = (&core, &file, &start, &end);
                s.spawn(move || {
                    for round in 0..ROUNDS_EACH {
                        start.wait();
                        let at = (round * WRITERS + writer) * 10;
                        core.write(file, at, &[1; 10]).unwrap();
                        core.persist(ino, file, false).unwrap();
                        end.wait();
                    }
                });
            }
            // Checked between rounds, never panicking inside the scope:
            // a writer left waiting at a barrier would hang the test.
            for round in 0..ROUNDS_EACH {
                start.wait();
                end.wait();
                let in_memory = file.meta.read().unwrap().clone();
                for branch in core.branches.meta_branches(rel) {
                    let on_disk = meta::read(&core.branches.root(branch), rel);
                    if !matches!(on_disk, Ok(Some(meta::Sidecar::Whole(ref m))) if *m == in_memory)
                    {
                        stale.push((round, branch));
                    }
                }
            }
        });
        assert!(
            stale.is_empty(),
            "stale sidecars (round, branch): {stale:?}"
        );
    }
}
