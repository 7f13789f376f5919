//! Maintenance jobs that run inside the mount, where the open files, their
//! in-memory sizes and the branches' health live: `rebuild` refills a
//! replacement branch directory, `scrub` checks that mirrors and parity
//! agree with the data (and with `repair` rewrites what does not).
//!
//! `grove raif rebuild|scrub` starts a job by setting the virtual attribute
//! [`XATTR_CONTROL`] on the mount's root to a JSON request. The job runs on
//! a thread of its own, so that neither a FUSE request nor the root's inode
//! lock is held meanwhile; its progress and result are part of the status
//! attribute, which the command polls. One job runs at a time.
//!
//! Consistency: a rebuild holds [`Core::gate`] exclusively from start to
//! end, so every request that changes something (writes, creates, renames,
//! metadata) waits until the new branch is complete; reads go on, degraded.
//! A scrub holds each file's lock for [`JOB_STRIPES_PER_LOCK`] stripes at a
//! time, so writes to that file wait only for those stripes.

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use grove_raif::{raid, BranchIo};

use super::core::{self, lock, Core, FileIo, Node, OpenFile};
use super::job::{Job, Request, JOB_LINES_MAX};
use super::lower;
use super::meta;
use super::walk::{walk_tree, FileNames, Tree};

/// Stripes of one file checked under one hold of its lock.
pub const JOB_STRIPES_PER_LOCK: u64 = 64;
/// Starts the job `value` asks for; EBUSY while another one runs.
pub fn start(core: &Arc<Core>, value: &[u8]) -> io::Result<()> {
    let request: Request = serde_json::from_slice(value)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    let mut job = lock(&core.job);
    if job.as_ref().is_some_and(|j| !j.finished) {
        return Err(io::Error::from_raw_os_error(16));
    }
    let (id, op) = match &request {
        Request::Rebuild { id, .. } => (id.clone(), "rebuild"),
        Request::Scrub { id, .. } => (id.clone(), "scrub"),
    };
    *job = Some(Job {
        id,
        op: op.into(),
        ..Job::default()
    });
    drop(job);
    let core = core.clone();
    std::thread::spawn(move || {
        let outcome = match request {
            Request::Rebuild {
                branch, to, force, ..
            } => rebuild(&core, &branch, &to, force),
            Request::Scrub { repair, .. } => scrub(&core, repair),
        };
        update(&core, |j| {
            j.error = outcome.err();
            j.finished = true;
        });
    });
    Ok(())
}

fn update(core: &Core, change: impl FnOnce(&mut Job)) {
    if let Some(job) = lock(&core.job).as_mut() {
        change(job);
    }
}

fn problem(core: &Core, line: String) {
    tracing::warn!("{line}");
    update(core, |j| {
        j.problems += 1;
        if j.lines.len() < JOB_LINES_MAX {
            j.lines.push(line);
        }
    });
}

/// [`walk_tree`] for a job: what it could not read are problems, and the
/// bytes to go through its total.
fn walk(core: &Core) -> Result<Tree, String> {
    let tree = walk_tree(core)?;
    for line in &tree.unreadable {
        problem(core, line.clone());
    }
    let total = tree.files.iter().map(|f| f.meta.size_bytes).sum();
    update(core, |j| j.total_bytes = total);
    Ok(tree)
}

/// Refills branch `label` in the empty directory `to` from the others:
/// directories, symlinks, special files, sidecars and every unit the
/// branch holds. A branch that is not failed is refused unless `force`.
/// Meanwhile the branch shows as rebuilding; it is revived only once every
/// file on it is whole. If anything fails, the mount is left as it was
/// (the old directory and health) and `to` is emptied again.
fn rebuild(core: &Core, label: &str, to: &Path, force: bool) -> Result<(), String> {
    let b = &core.branches;
    let branch = b.config.branch_index(label).ok_or_else(|| {
        format!(
            "the mount has no branch labelled {label:?}; its branches are {}",
            branch_list(core)
        )
    })?;
    check_target(core, branch, to, force)?;
    let _gate = core.gate.write().unwrap_or_else(|e| e.into_inner());
    let (old_root, was_failed) = (b.root(branch), b.is_failed(branch));
    b.fail(
        branch,
        &io::Error::other(format!("replaced by {} for a rebuild", to.display())),
    );
    b.set_root(branch, to.to_path_buf());
    b.set_rebuilding(Some(branch));
    let refilled = refill(core, branch, to);
    b.set_rebuilding(None);
    let problems = lock(&core.job).as_ref().map_or(0, |j| j.problems);
    if let Err(e) = refilled.and_then(|()| match problems {
        0 => Ok(()),
        n => Err(format!("{n} files could not be rebuilt")),
    }) {
        b.set_root(branch, old_root.clone());
        if !was_failed {
            b.revive(branch);
        }
        empty_dir(to);
        return Err(format!(
            "{e}; the mount is as it was (branch {label} on {}, {}) and {} is empty again",
            old_root.display(),
            if was_failed { "failed" } else { "ok" },
            to.display()
        ));
    }
    // Open files get handles on their new components while the branch is
    // still failed (a handle from before the old directory vanished must
    // not be read); files opened between that pass and the revival hold no
    // handle on the branch, so a second pass gives them one.
    install_open_components(core, branch, to, true);
    b.revive(branch);
    install_open_components(core, branch, to, false);
    Ok(())
}

/// Every branch as `label (directory, state)`, for error messages.
fn branch_list(core: &Core) -> String {
    let b = &core.branches;
    (0..b.count())
        .map(|i| {
            let state = if b.is_failed(i) { "failed" } else { "ok" };
            format!(
                "{} ({}, {state})",
                b.config.branches[i].label,
                b.root(i).display()
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `to` can replace `branch`: an absolute, empty directory that is
/// no branch, for a failed branch (or any with `force`).
fn check_target(core: &Core, branch: usize, to: &Path, force: bool) -> Result<(), String> {
    let b = &core.branches;
    let label = &b.config.branches[branch].label;
    if !b.is_failed(branch) && !force {
        let failed: Vec<&str> = (0..b.count())
            .filter(|&i| b.is_failed(i))
            .map(|i| b.config.branches[i].label.as_str())
            .collect();
        let hint = match failed.is_empty() {
            true => "no branch is failed".to_string(),
            false => format!("the failed branches are {}", failed.join(", ")),
        };
        return Err(format!(
            "branch {label} ({}) is not failed: {hint}; give --force to replace a healthy branch anyway",
            b.root(branch).display()
        ));
    }
    if !to.is_absolute() {
        return Err(format!("{} is not an absolute path", to.display()));
    }
    let mut entries =
        std::fs::read_dir(to).map_err(|e| format!("cannot use {}: {e}", to.display()))?;
    if entries.next().is_some() {
        return Err(format!(
            "{} is not empty: a rebuild fills an empty directory",
            to.display()
        ));
    }
    if let Some(i) = (0..b.count()).find(|&i| b.root(i) == to) {
        return Err(format!(
            "{} is already branch {}",
            to.display(),
            b.config.branches[i].label
        ));
    }
    Ok(())
}

/// Removes everything a failed rebuild made in `to` (empty before it).
fn empty_dir(to: &Path) {
    for entry in std::fs::read_dir(to).into_iter().flatten().flatten() {
        let path = entry.path();
        let removed = match entry.file_type() {
            Ok(t) if t.is_dir() => std::fs::remove_dir_all(&path),
            _ => lower::remove_file(&path),
        };
        if let Err(e) = removed {
            tracing::warn!("cannot remove {}: {e}", path.display());
        }
    }
}

/// Makes the tree and every file's part of it on the new branch.
fn refill(core: &Core, branch: usize, to: &Path) -> Result<(), String> {
    let tree = walk(core)?;
    for dir in &tree.dirs {
        copy_plain(core, to, dir).map_err(|e| format!("cannot make /{}: {e}", dir.display()))?;
    }
    // A replicated entry with several names is copied once, then linked.
    let mut copied: HashMap<String, &Path> = HashMap::new();
    for other in &tree.others {
        let identity = core
            .lower_metadata(other)
            .ok()
            .filter(|m| m.nlink() > 1)
            .map(|m| core::lower_identity(&m));
        let first = identity.as_ref().and_then(|id| copied.get(id));
        let made = match first {
            Some(first) => lower::hard_link(to.join(first), to.join(other)),
            None => copy_plain(core, to, other),
        };
        match made {
            Err(e) => problem(core, format!("{}: {e}", other.display())),
            Ok(()) => {
                if let (Some(id), None) = (identity, first) {
                    copied.insert(id, other);
                }
            }
        }
    }
    for file in &tree.files {
        if let Err(e) = rebuild_file(core, branch, file) {
            problem(
                core,
                format!("{}: cannot rebuild: {e}", file.first().display()),
            );
            for name in &file.names {
                let _ = core::remove_if_there(&to.join(name));
            }
        }
        update(core, |j| {
            j.files += 1;
            j.done_bytes += file.meta.size_bytes;
        });
    }
    // Times last: making the children changed the directories' mtimes.
    for dir in tree.dirs.iter().rev() {
        if let Ok(m) = core.lower_metadata(dir) {
            let _ = super::plain::set_times(&to.join(dir), m.accessed().ok(), m.modified().ok());
        }
    }
    Ok(())
}

/// Copies a directory, symlink or special file onto the new branch.
fn copy_plain(core: &Core, to: &Path, rel: &Path) -> io::Result<()> {
    let m = core.lower_metadata(rel)?;
    let target = m
        .file_type()
        .is_symlink()
        .then(|| {
            core.branches
                .healthy()
                .find_map(|b| lower::read_link(core.branches.root(b).join(rel)).ok())
        })
        .flatten();
    super::plain::copy_entry(&m, target.as_deref(), &to.join(rel))
}

/// One file's sidecars and record (those the branch keeps) and its
/// component, rebuilt at its first name and hard-linked at the others.
fn rebuild_file(core: &Core, branch: usize, names: &FileNames) -> io::Result<()> {
    let rel = names.first();
    let ino = core.ino_of(rel, &Node::File(names.meta.clone()));
    let file = core.open(ino, rel)?;
    let result = (|| {
        let m = file.meta.read().unwrap_or_else(|e| e.into_inner()).clone();
        let root = core.branches.root(branch);
        for name in &names.names {
            if core.branches.meta_branches(name).contains(&branch) {
                core.write_name(&root, name, &m, true)?;
            }
        }
        if let Some(id) = &m.link {
            if core.branches.record_branches(id).contains(&branch) {
                meta::write_record(&root, &m, true)?;
            }
        }
        let Some(target) = file.subset.iter().position(|&g| g == branch) else {
            return Ok(());
        };
        let layout = OpenFile::layout(&m)?;
        let component = core::create_component(&root.join(rel))?;
        let io = RebuildIo {
            inner: FileIo {
                branches: &core.branches,
                file: &file,
            },
            target,
            component: &component,
            error: Mutex::new(None),
        };
        for stripe in 0..layout.stripe_count(m.size_bytes) {
            raid::rebuild_stripe(&layout, &io, stripe, target)
                .map_err(|e| io::Error::other(e.to_string()))?;
            if let Some(e) = lock(&io.error).take() {
                return Err(e);
            }
        }
        component.set_len(layout.component_bytes(m.size_bytes))?;
        component.sync_all()?;
        for other in &names.names[1..] {
            lower::hard_link(root.join(rel), root.join(other))?;
        }
        Ok(())
    })();
    let _ = core.close(ino);
    result
}

/// A file's components as the rebuild sees them: the replacement branch
/// (`target`, a position in the subset) is written, never read.
struct RebuildIo<'a> {
    inner: FileIo<'a>,
    target: usize,
    component: &'a std::fs::File,
    error: Mutex<Option<io::Error>>,
}

impl BranchIo for RebuildIo<'_> {
    fn read_at(&self, branch: usize, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if branch == self.target {
            return Err(io::Error::other("the branch being rebuilt is not read"));
        }
        self.inner.read_at(branch, offset, buf)
    }

    fn write_at(&self, branch: usize, offset: u64, data: &[u8]) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        if branch == self.target {
            return self.component.write_all_at(data, offset);
        }
        self.inner.write_at(branch, offset, data)
    }

    fn is_failed(&self, branch: usize) -> bool {
        branch != self.target && self.inner.is_failed(branch)
    }

    fn fail(&self, branch: usize, error: &io::Error) {
        if branch == self.target {
            *lock(&self.error) = Some(io::Error::new(error.kind(), error.to_string()));
        } else {
            self.inner.fail(branch, error);
        }
    }

    fn choose(&self, copies: &[usize]) -> usize {
        self.inner.choose(copies)
    }
}

/// Files open during the rebuild get a handle on their new component:
/// every one with `replace`, else only those that hold none.
fn install_open_components(core: &Core, branch: usize, to: &Path, replace: bool) {
    let open: Vec<(u64, Arc<OpenFile>)> = lock(&core.open)
        .iter()
        .map(|(ino, f)| (*ino, f.clone()))
        .collect();
    for (ino, file) in open {
        let Some(position) = file.subset.iter().position(|&g| g == branch) else {
            continue;
        };
        let held = file.components[position]
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_some();
        if held && !replace {
            continue;
        }
        let Ok(rel) = core.path_of(ino) else { continue };
        let opened = lower::open(to.join(&rel), rustix::fs::OFlags::RDWR, 0);
        match opened {
            Ok(handle) => {
                *file.components[position]
                    .write()
                    .unwrap_or_else(|e| e.into_inner()) = Some(handle)
            }
            Err(e) => problem(core, format!("{}: cannot reopen: {e}", rel.display())),
        }
    }
}

/// Checks every stripe of every file; with `repair`, rewrites mirrors
/// from the first copy and parity from the data. Before that, what a
/// crash left half done (see `tidy`).
fn scrub(core: &Core, repair: bool) -> Result<(), String> {
    for line in super::tidy::tidy(core, repair)? {
        problem(core, line);
    }
    let tree = walk(core)?;
    for file in &tree.files {
        if let Err(e) = scrub_file(core, file, repair) {
            problem(
                core,
                format!("{}: cannot scrub: {e}", file.first().display()),
            );
        }
        update(core, |j| {
            j.files += 1;
            j.done_bytes += file.meta.size_bytes;
        });
    }
    Ok(())
}

fn scrub_file(core: &Core, names: &FileNames, repair: bool) -> io::Result<()> {
    let rel = names.first();
    let ino = core.ino_of(rel, &Node::File(names.meta.clone()));
    let file = core.open(ino, rel)?;
    let mut stripe = 0;
    let result = loop {
        // The write lock keeps writers of this file off the stripes checked.
        let m = file.meta.write().unwrap_or_else(|e| e.into_inner());
        let layout = match OpenFile::layout(&m) {
            Ok(l) => l,
            Err(e) => break Err(e),
        };
        let count = layout.stripe_count(m.size_bytes);
        if stripe >= count {
            break Ok(());
        }
        let end = (stripe + JOB_STRIPES_PER_LOCK).min(count);
        let io = FileIo {
            branches: &core.branches,
            file: &file,
        };
        for s in stripe..end {
            match raid::scrub_stripe(&layout, &io, s, repair) {
                Ok(None) => {}
                Ok(Some(mismatch)) => {
                    let labels: Vec<&str> = mismatch
                        .branches
                        .iter()
                        .map(|&p| m.branches[p].as_str())
                        .collect();
                    problem(
                        core,
                        format!(
                            "{}: stripe {s} (offset {}): {} disagree{}",
                            rel.display(),
                            s * layout.stripe_data_bytes(),
                            labels.join(","),
                            if repair { "; repaired" } else { "" }
                        ),
                    );
                }
                Err(e) => problem(core, format!("{}: {e}", rel.display())),
            }
        }
        stripe = end;
    };
    let _ = core.close(ino);
    result
}
