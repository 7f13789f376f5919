//! What a crash in the middle of a create, link or unlink leaves on the
//! branches, found by `grove raif scrub` and removed by `--repair` (see
//! `links` for the order that keeps each of these harmless meanwhile):
//!
//! - a link record no name points at (a link cut short before its first
//!   pointer, an unlink of the last name before the record went);
//! - a link record whose count is not its number of names (a link cut
//!   short after the count, an unlink before it);
//! - a lower regular file at a name with no sidecar (a create before its
//!   sidecar, a link before its pointer): it would keep a linked file's
//!   lower inode, and its space, alive.
//!
//! The check holds [`Core::gate`] exclusively: no create, link or unlink
//! is half done while it looks. It reads sidecars and directory listings
//! only, never data.

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::Ordering;

use super::core::{is_reserved, lock, Core, Node};
use super::lower;
use super::meta;
use super::walk::{walk_tree, FileNames, Tree};

/// st_mode of a component grove made (a regular file, 0600): only those
/// are removed; another file found in a branch is reported and kept.
const COMPONENT_ST_MODE: u32 = 0o100_600;

/// Finds (and with `repair` removes or corrects) crash leftovers: one
/// line per finding.
pub fn tidy(core: &Core, repair: bool) -> Result<Vec<String>, String> {
    let _gate = core.gate.write().unwrap_or_else(|e| e.into_inner());
    let tree = walk_tree(core)?;
    let mut lines = Vec::new();
    for file in &tree.files {
        check_count(core, file, repair, &mut lines);
    }
    remove_unreferenced_records(core, &tree, repair, &mut lines);
    for dir in std::iter::once(Path::new("")).chain(tree.dirs.iter().map(|d| d.as_path())) {
        remove_stray_components(core, dir, repair, &mut lines)
            .map_err(|e| format!("cannot check /{}: {e}", dir.display()))?;
    }
    Ok(lines)
}

fn done(repair: bool) -> &'static str {
    if repair {
        "; repaired"
    } else {
        ""
    }
}

/// A linked file's count against the names the walk found.
fn check_count(core: &Core, file: &FileNames, repair: bool, lines: &mut Vec<String>) {
    let Some(id) = &file.meta.link else { return };
    let names = file.names.len() as u32;
    if file.meta.nlink == names {
        return;
    }
    lines.push(format!(
        "{}: link record {id} counts {} names, {names} point at it{}",
        file.first().display(),
        file.meta.nlink,
        done(repair)
    ));
    if repair {
        if let Err(e) = set_count(core, file, names) {
            lines.push(format!(
                "{}: cannot correct its count: {e}",
                file.first().display()
            ));
        }
    }
}

/// Sets a linked file's count through its open state (see `links`).
fn set_count(core: &Core, file: &FileNames, names: u32) -> io::Result<()> {
    assert!(names >= 1);
    let rel = file.first();
    let ino = core.ino_of(rel, &Node::File(file.meta.clone()));
    let open = core.open(ino, rel)?;
    let written = {
        let _turn = lock(&open.persisting);
        let mut m = open.meta.write().unwrap_or_else(|e| e.into_inner());
        m.nlink = names;
        open.dirty.store(false, Ordering::Relaxed);
        core.write_record(&m, true)
    };
    let closed = core.close(ino);
    written.and(closed)
}

/// Records on any healthy branch that no name points at.
fn remove_unreferenced_records(core: &Core, tree: &Tree, repair: bool, lines: &mut Vec<String>) {
    let used: HashSet<&str> = tree
        .files
        .iter()
        .filter_map(|f| f.meta.link.as_deref())
        .collect();
    // An open file whose names are all gone still writes its record back.
    let open: HashSet<String> = lock(&core.open)
        .values()
        .filter_map(|f| {
            f.meta
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .link
                .clone()
        })
        .collect();
    let b = &core.branches;
    for branch in b.healthy().collect::<Vec<_>>() {
        let root = b.root(branch);
        let ids = match meta::record_ids(&root) {
            Ok(ids) => ids,
            Err(e) => {
                lines.push(format!(
                    "cannot list the link records of branch {}: {e}",
                    b.config.branches[branch].label
                ));
                continue;
            }
        };
        for id in ids {
            if used.contains(id.as_str()) || open.contains(&id) {
                continue;
            }
            lines.push(format!(
                "link record {id} on branch {}: no name points at it{}",
                b.config.branches[branch].label,
                done(repair)
            ));
            if repair {
                if let Err(e) = meta::remove_record(&root, &id) {
                    lines.push(format!("cannot remove link record {id}: {e}"));
                }
            }
        }
    }
}

/// Lower regular files in `dir` on any healthy branch whose name has no
/// sidecar.
fn remove_stray_components(
    core: &Core,
    dir: &Path,
    repair: bool,
    lines: &mut Vec<String>,
) -> io::Result<()> {
    let files: BTreeMap<String, bool> = core.list(dir)?;
    let b = &core.branches;
    for branch in b.healthy().collect::<Vec<_>>() {
        let lower_dir = b.root(branch).join(dir);
        let Ok(entries) = lower::read_dir(&lower_dir) else {
            continue;
        };
        for entry in entries {
            let name = entry.name;
            let is_file = entry.kind == rustix::fs::FileType::RegularFile;
            let has_sidecar = files.get(&*name.to_string_lossy()) == Some(&true);
            if is_reserved(&name) || !is_file || has_sidecar {
                continue;
            }
            let path = lower_dir.join(&name);
            let ours = lower::symlink_metadata(&path)?.mode() == COMPONENT_ST_MODE;
            let label = &b.config.branches[branch].label;
            let rel = dir.join(&name);
            if !ours {
                lines.push(format!(
                    "{} on branch {label}: a file with no sidecar that grove did not make; left alone",
                    rel.display()
                ));
                continue;
            }
            lines.push(format!(
                "{} on branch {label}: a component with no sidecar{}",
                rel.display(),
                done(repair)
            ));
            if repair {
                super::core::remove_if_there(&path)?;
            }
        }
    }
    Ok(())
}
