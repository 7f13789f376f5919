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
use super::lower;
use super::meta::{self, Meta};

/// The steps of a link and an unlink after which a crash leaves state
/// that `tidy` must finish: the tests stop there (see [`step_done`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// link: the record holds the new count.
    RecordWritten,
    /// link: the first name points at the record.
    FirstNamePointed,
    /// link: the lower links at the new name are made.
    ComponentsLinked,
    /// unlink: the name's pointer and lower links are gone.
    NameRemoved,
}

#[cfg(test)]
thread_local! {
    /// The step after which this thread's link or unlink stops, as if the
    /// mount had been killed there.
    pub(super) static CRASH_AFTER: std::cell::Cell<Option<Step>> = const { std::cell::Cell::new(None) };
}

/// Marks `step` done: in tests, stops the operation there if asked to.
fn step_done(step: Step) -> io::Result<()> {
    #[cfg(test)]
    if CRASH_AFTER.with(|c| c.get()) == Some(step) {
        return Err(io::Error::other(format!("simulated crash after {step:?}")));
    }
    let _ = step;
    Ok(())
}

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
                self.on_all(|root| lower::hard_link(root.join(from), root.join(to)))?;
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
        step_done(Step::RecordWritten)?;
        if first {
            self.write_link_name(from, &id, true)?;
            step_done(Step::FirstNamePointed)?;
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
        step_done(Step::ComponentsLinked)?;
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
                .and_then(|()| lower::hard_link(root.join(from), root.join(to)));
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
            step_done(Step::NameRemoved)?;
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

#[cfg(test)]
mod tests {
    //! Each crash window of link and unlink, made by stopping the real
    //! operation after that step and mounting again (a new [`Core`] over
    //! the same branches): the names left read whole, and one scrub with
    //! repair leaves counts that match the names, no record without a
    //! name, no lower file without a sidecar, and nothing for the next
    //! scrub to find.

    use std::collections::HashMap;
    use std::os::unix::fs::MetadataExt;
    use std::path::PathBuf;

    use grove_raif::config::Config;
    use grove_raif::Level;

    use super::*;
    use crate::raif::tidy::tidy;
    use crate::raif::walk::walk_tree;

    const WIDTH: usize = 3;
    /// Spans several stripes of 4 KiB units.
    const DATA_BYTES: usize = 20_000;

    fn mount(branches: &[PathBuf]) -> Core {
        for b in branches {
            meta::clean_work_dir(b).unwrap();
        }
        Core::new(Config::simple(Level::Raif5, 4096, branches).unwrap())
    }

    fn data(seed: u8) -> Vec<u8> {
        (0..DATA_BYTES)
            .map(|i| (i as u8).wrapping_mul(seed))
            .collect()
    }

    fn node_of(core: &Core, rel: &str) -> Node {
        core.node(Path::new(rel)).unwrap()
    }

    fn ino(core: &Core, rel: &str) -> u64 {
        core.ino_of(Path::new(rel), &node_of(core, rel))
    }

    fn write_file(core: &Core, rel: &str, bytes: &[u8]) {
        let rel = Path::new(rel);
        core.create(rel, 0o644, 0, 0).unwrap();
        let ino = core.ino_for(rel);
        let file = core.open(ino, rel).unwrap();
        core.write(&file, 0, bytes).unwrap();
        core.release(ino).unwrap();
    }

    fn read_file(core: &Core, rel: &str) -> Vec<u8> {
        let ino = ino(core, rel);
        let file = core.open(ino, Path::new(rel)).unwrap();
        let bytes = core.read(&file, 0, u64::MAX / 2).unwrap();
        core.release(ino).unwrap();
        bytes
    }

    fn link(core: &Core, from: &str, to: &str) -> io::Result<()> {
        let node = node_of(core, from);
        let ino = core.ino_of(Path::new(from), &node);
        core.link(ino, Path::new(from), &node, Path::new(to))
    }

    fn unlink(core: &Core, rel: &str) -> io::Result<()> {
        match node_of(core, rel) {
            Node::File(m) => core.unlink_file(Path::new(rel), &m),
            Node::Plain(_) => panic!("{rel} is not a file"),
        }
    }

    /// Runs `op` stopped after `step`, as a crash there would.
    fn crash_after(step: Step, op: impl FnOnce() -> io::Result<()>) {
        CRASH_AFTER.with(|c| c.set(Some(step)));
        let result = op();
        CRASH_AFTER.with(|c| c.set(None));
        let err = result.expect_err("the operation was to stop");
        assert!(err.to_string().contains("simulated crash"), "{err}");
    }

    /// What the branches hold is whole: every linked file's count is its
    /// number of names, every record has a name, and on every branch each
    /// name's component is one lower file with one link per name.
    fn assert_whole(core: &Core, branches: &[PathBuf]) {
        let tree = walk_tree(core).unwrap();
        assert!(tree.unreadable.is_empty(), "{:?}", tree.unreadable);
        let mut ids = Vec::new();
        for file in &tree.files {
            assert_eq!(
                file.meta.nlink as usize,
                file.names.len(),
                "{:?}",
                file.names
            );
            ids.extend(file.meta.link.clone());
            for b in branches {
                let inodes: HashMap<u64, u64> = file
                    .names
                    .iter()
                    .filter_map(|n| std::fs::metadata(b.join(n)).ok())
                    .map(|m| (m.ino(), m.nlink()))
                    .collect();
                assert!(inodes.len() <= 1, "one lower file per branch: {inodes:?}");
                for nlink in inodes.values() {
                    assert_eq!(*nlink as usize, file.names.len(), "lower links");
                }
            }
        }
        for b in branches {
            for id in meta::record_ids(b).unwrap() {
                assert!(ids.contains(&id), "record {id} has no name");
            }
        }
        assert_eq!(tidy(core, false).unwrap(), Vec::<String>::new());
    }

    fn branches(dir: &Path) -> Vec<PathBuf> {
        let paths: Vec<PathBuf> = (0..WIDTH).map(|i| dir.join(format!("b{i}"))).collect();
        paths.iter().for_each(|p| std::fs::create_dir(p).unwrap());
        paths
    }

    /// A crash after each step of a link: the first name reads whole; if
    /// the new name showed, it reads the same; a new file made at a name a
    /// crash left lower links at is a file of its own (the leftover is
    /// unlinked, not truncated); scrub with repair leaves everything whole.
    #[test]
    fn a_crash_in_every_step_of_a_link_is_tidied_by_scrub() {
        for step in [
            Step::RecordWritten,
            Step::FirstNamePointed,
            Step::ComponentsLinked,
        ] {
            for second_link in [false, true] {
                if second_link && step == Step::FirstNamePointed {
                    continue; // a file with two names has its record already
                }
                let dir = tempfile::tempdir().unwrap();
                let b = branches(dir.path());
                let core = mount(&b);
                write_file(&core, "a", &data(3));
                if second_link {
                    link(&core, "a", "c").unwrap();
                }
                crash_after(step, || link(&core, "a", "b"));
                drop(core);
                let core = mount(&b);
                assert!(
                    read_file(&core, "a") == data(3),
                    "{step:?}: a reads other bytes"
                );
                assert!(
                    core.node(Path::new("b")).is_err(),
                    "{step:?}: b never showed"
                );
                if step == Step::ComponentsLinked {
                    let stray = tidy(&core, false).unwrap();
                    assert!(
                        stray
                            .iter()
                            .any(|l| l.contains("a component with no sidecar")),
                        "{stray:?}"
                    );
                }
                // Made before any scrub: over the lower links a crash left.
                write_file(&core, "b", &data(5));
                assert!(
                    read_file(&core, "a") == data(3),
                    "{step:?}: a reads other bytes"
                );
                assert!(
                    read_file(&core, "b") == data(5),
                    "{step:?}: b reads other bytes"
                );
                let found = tidy(&core, true).unwrap();
                assert!(!found.is_empty(), "{step:?}: nothing found");
                assert_whole(&core, &b);
                assert!(
                    read_file(&core, "a") == data(3),
                    "{step:?}: a reads other bytes"
                );
            }
        }
    }

    /// A crash after an unlink removed its name: of a name with another
    /// left (a count one too high), and of the last name (a record with no
    /// name). Scrub with repair corrects the one and removes the other, and
    /// no lower file is left of a file with no name.
    #[test]
    fn a_crash_in_an_unlink_is_tidied_by_scrub() {
        let dir = tempfile::tempdir().unwrap();
        let b = branches(dir.path());
        let core = mount(&b);
        write_file(&core, "a", &data(7));
        link(&core, "a", "b").unwrap();
        link(&core, "a", "c").unwrap();
        crash_after(Step::NameRemoved, || unlink(&core, "c"));
        drop(core);
        let core = mount(&b);
        let found = tidy(&core, true).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_whole(&core, &b);
        assert!(read_file(&core, "b") == data(7), "b reads other bytes");
        unlink(&core, "b").unwrap();
        crash_after(Step::NameRemoved, || unlink(&core, "a"));
        drop(core);
        let core = mount(&b);
        let found = tidy(&core, true).unwrap();
        assert!(
            found.iter().all(|l| l.contains("no name points at it")) && !found.is_empty(),
            "{found:?}"
        );
        assert_whole(&core, &b);
        for branch in &b {
            let files: Vec<_> = walk_files(branch);
            assert!(files.is_empty(), "left on {}: {files:?}", branch.display());
        }
    }

    /// Regular files under `root`, grove's temporary ones aside.
    fn walk_files(root: &Path) -> Vec<PathBuf> {
        let mut found = Vec::new();
        let mut pending = vec![root.to_path_buf()];
        while let Some(dir) = pending.pop() {
            for entry in std::fs::read_dir(&dir).unwrap().flatten() {
                let kind = entry.file_type().unwrap();
                if kind.is_dir() && entry.file_name() != meta::WORK_DIR {
                    pending.push(entry.path());
                } else if kind.is_file() {
                    found.push(entry.path());
                }
            }
        }
        found
    }

    /// Two names of an open file: writes through the open state show at
    /// both names after a remount, and the names share one inode.
    #[test]
    fn names_share_one_inode_and_one_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let b = branches(dir.path());
        let core = mount(&b);
        write_file(&core, "a", b"x");
        std::fs::create_dir_all(b[0].join("d")).unwrap();
        for branch in &b[1..] {
            std::fs::create_dir_all(branch.join("d")).unwrap();
        }
        let a = ino(&core, "a");
        let file = core.open(a, Path::new("a")).unwrap();
        link(&core, "a", "d/b").unwrap();
        assert_eq!(ino(&core, "d/b"), a);
        core.write(&file, 0, &data(9)).unwrap();
        core.release(a).unwrap();
        drop(core);
        let core = mount(&b);
        // A name first seen while the file is open under another shows
        // the open state's size, not the record's older one.
        let a = ino(&core, "a");
        let file = core.open(a, Path::new("a")).unwrap();
        core.write(&file, DATA_BYTES as u64, b"more").unwrap();
        assert!(lock(&core.inodes).known(Path::new("d/b")).is_none());
        match node_of(&core, "d/b") {
            Node::File(m) => assert_eq!(m.size_bytes, DATA_BYTES as u64 + 4),
            Node::Plain(_) => panic!("d/b is a file"),
        }
        assert_eq!(ino(&core, "d/b"), a);
        core.release(a).unwrap();
        let mut grown = data(9);
        grown.extend_from_slice(b"more");
        assert!(read_file(&core, "d/b") == grown, "d/b reads other bytes");
        assert_whole(&core, &b);
    }
}
