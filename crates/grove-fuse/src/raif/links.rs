//! Hard links: one file, several names.
//!
//! A regular file is laid out at its name on each branch of its subset,
//! and its sidecar sits at that name. A second name makes it a linked
//! file: its metadata moves into a link record (see `meta`), every name's
//! sidecar points there, and each branch's component at every name is a
//! hard link of one lower file, so writes through any name reach the same
//! units and the lower file systems free the space when the last name and
//! the last open handle go. The record counts the names (`nlink`).
//!
//! Every change of a linked file's metadata goes through its one open
//! state ([`OpenFile`], shared by every name since the names share an
//! inode), under the file's write-back turn: a link or unlink never races
//! a write-back of a count it has not seen.
//!
//! Crash safety is by order, each step leaving what `grove raif scrub
//! --repair` finishes (`tidy`):
//!
//! - link: the record, with the new count, first; then the old name's
//!   pointer (when the file had one name); then the lower links at the new
//!   name; its pointer last. A crash leaves a record no name points at, a
//!   count one too high, or lower files at a name with no sidecar.
//! - unlink: the name (its pointer and its lower links) first; then the
//!   count, or the record when it was the last name. A crash leaves a
//!   count one too high, or a record no name points at; never a name
//!   whose record is gone.
//!
//! Directories, symlinks and special files are replicated on every branch:
//! their hard links are lower hard links on every branch, and the lower
//! link count is theirs.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::core::{lock, Core, Node, OpenFile};
use super::meta::{self, Meta};

/// Tries to find an unused link identity before giving up.
const LINK_ID_TRIES: usize = 8;
/// Numbers link identities within the process.
static LINK_SERIAL: AtomicU64 = AtomicU64::new(0);

impl Core {
    /// link(2): `to` becomes another name of inode `ino`, whose node is
    /// `node` and one of whose names is `from`. EEXIST if `to` exists,
    /// EPERM for a directory.
    pub fn link(&self, ino: u64, from: &Path, node: &Node, to: &Path) -> io::Result<()> {
        if self.node(to).is_ok() {
            return Err(io::Error::from_raw_os_error(EEXIST));
        }
        match node {
            Node::Plain(m) if m.is_dir() => Err(io::Error::from_raw_os_error(EPERM)),
            Node::Plain(_) => {
                self.on_all(|root| std::fs::hard_link(root.join(from), root.join(to)))?;
                lock(&self.inodes).add_name(ino, to);
                Ok(())
            }
            Node::File(_) => {
                let file = self.open(ino, from)?;
                let linked = self.link_open(&file, from, to);
                if let Ok(id) = &linked {
                    let mut inodes = lock(&self.inodes);
                    inodes.set_identity(ino, id);
                    inodes.forget_path(to);
                    inodes.add_name(ino, to);
                }
                let closed = self.close(ino);
                linked.and(closed)
            }
        }
    }

    /// The steps of a regular file's link, in their crash-safe order (see
    /// the module's text); the file's link identity.
    fn link_open(&self, file: &OpenFile, from: &Path, to: &Path) -> io::Result<String> {
        let _turn = lock(&file.persisting);
        // Held throughout: a write meanwhile would change the size this
        // writes into the record.
        let mut m = file.meta.write().unwrap_or_else(|e| e.into_inner());
        let before = m.nlink;
        let mut next = m.clone();
        let first = next.link.is_none();
        if first {
            next.link = Some(self.new_link_id()?);
            next.nlink = 1;
        }
        let id = next.link.clone().expect("set above");
        next.nlink = next.nlink.checked_add(1).ok_or_else(too_many_links)?;
        next.ctime_ns = meta::now_ns();
        self.write_record(&next, true)?;
        if first {
            self.write_link_name(from, &id, true)?;
        }
        // From here the record is the file's metadata.
        *m = next.clone();
        file.dirty.store(false, Ordering::Relaxed);
        if let Err(e) = self.link_components(file, &m, from, to) {
            // Back to one name fewer: the new name never showed.
            m.nlink -= 1;
            self.write_record(&m, true)?;
            return Err(e);
        }
        self.write_link_name(to, &id, true)?;
        assert_eq!(m.nlink, before.max(1) + 1);
        Ok(id)
    }

    /// Hard-links the lower component at `from` to `to` on every healthy
    /// branch of the file's subset; EIO, with those links undone, if the
    /// layout would not survive the branches where that failed.
    fn link_components(&self, file: &OpenFile, m: &Meta, from: &Path, to: &Path) -> io::Result<()> {
        let layout = OpenFile::layout(m)?;
        let mut made = Vec::new();
        for &branch in &file.subset {
            if self.branches.is_failed(branch) {
                continue;
            }
            let root = self.branches.root(branch);
            // A crash's leftover at the new name is no file's: it goes.
            let linked = super::core::remove_if_there(&root.join(to))
                .and_then(|()| std::fs::hard_link(root.join(from), root.join(to)));
            match linked {
                Ok(()) => made.push(branch),
                Err(e) => {
                    tracing::warn!(
                        "cannot link {} to {} on branch {}: {e}",
                        from.display(),
                        to.display(),
                        self.branches.config.branches[branch].label
                    );
                    self.branches.check_error(branch, &e);
                }
            }
        }
        // Positions with no link: failed branches, and those where it failed.
        let lost: Vec<usize> = (0..file.subset.len())
            .filter(|&p| !made.contains(&file.subset[p]))
            .collect();
        if made.is_empty() || !grove_raif::raid::survives(&layout, &lost) {
            for branch in made {
                let _ = super::core::remove_if_there(&self.branches.root(branch).join(to));
            }
            return Err(io::Error::from_raw_os_error(EIO));
        }
        Ok(())
    }

    /// unlink(2) of `rel`, one name of a linked file: the name goes, then
    /// the count drops; the record goes with the last name (see the
    /// module's text). An open file whose last name went lives on.
    pub fn unlink_linked(&self, rel: &Path, m: &Meta) -> io::Result<()> {
        assert!(m.link.is_some(), "a linked file");
        let ino = self.ino_of(rel, &Node::File(m.clone()));
        let file = self.open(ino, rel)?;
        let result = (|| {
            let _turn = lock(&file.persisting);
            let mut m = file.meta.write().unwrap_or_else(|e| e.into_inner());
            self.on_all(|root| {
                let component = super::core::remove_if_there(&root.join(rel));
                meta::remove(root, rel).and(component)
            })?;
            m.nlink = m.nlink.saturating_sub(1);
            m.ctime_ns = meta::now_ns();
            let id = m.link.clone().expect("a linked file");
            if m.nlink > 0 {
                return self.write_record(&m, false);
            }
            file.unlinked.store(true, Ordering::Relaxed);
            for branch in self.branches.healthy().collect::<Vec<_>>() {
                if let Err(e) = meta::remove_record(&self.branches.root(branch), &id) {
                    self.branches.check_error(branch, &e);
                }
            }
            Ok(())
        })();
        lock(&self.inodes).forget_path(rel);
        let closed = self.close(ino);
        result.and(closed)
    }

    /// Whether two nodes are names of one file (rename between them does
    /// nothing).
    pub fn same_file(&self, a: &Node, b: Option<&Node>) -> bool {
        use std::os::unix::fs::MetadataExt;
        match (a, b) {
            (Node::File(a), Some(Node::File(b))) => a.link.is_some() && a.link == b.link,
            (Node::Plain(a), Some(Node::Plain(b))) => {
                !a.is_dir() && (a.dev(), a.ino()) == (b.dev(), b.ino())
            }
            _ => false,
        }
    }

    /// An identity no link record has yet: a hash of the time, the process
    /// and a serial, checked against the records there are.
    fn new_link_id(&self) -> io::Result<String> {
        for _ in 0..LINK_ID_TRIES {
            let seed = format!(
                "{}-{}-{}",
                meta::now_ns(),
                std::process::id(),
                LINK_SERIAL.fetch_add(1, Ordering::Relaxed)
            );
            let id = format!("{:016x}", grove_raif::name_hash(seed.as_bytes()));
            let taken = self
                .branches
                .healthy()
                .any(|b| meta::record_path(&self.branches.root(b), &id).exists());
            if !taken {
                return Ok(id);
            }
        }
        Err(io::Error::other("no unused link identity found"))
    }
}

fn too_many_links() -> io::Error {
    io::Error::from_raw_os_error(EMLINK)
}

const EPERM: i32 = 1;
const EIO: i32 = 5;
const EEXIST: i32 = 17;
const EMLINK: i32 = 31;
