//! One walk of everything below the mount, for the jobs (`maintain.rs`)
//! and the leftover tidy (`tidy.rs`): a linked file's names gather in one
//! entry, so that each file is counted and copied once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::core::{Core, Node};
use super::meta;

/// Everything below the mount, parents before children.
#[derive(Default)]
pub(super) struct Tree {
    pub(super) dirs: Vec<PathBuf>,
    /// Symlinks and special files.
    pub(super) others: Vec<PathBuf>,
    /// Regular files, each once whatever its number of names.
    pub(super) files: Vec<FileNames>,
    /// Names whose node could not be read, with why.
    pub(super) unreadable: Vec<String>,
}

/// A regular file and every name the walk found for it.
pub(super) struct FileNames {
    pub(super) names: Vec<PathBuf>,
    pub(super) meta: meta::Meta,
}

impl FileNames {
    pub(super) fn first(&self) -> &Path {
        &self.names[0]
    }
}

/// Walks the tree below the mount: a linked file's names gather in one
/// entry, so that jobs count and copy it once.
pub(super) fn walk_tree(core: &Core) -> Result<Tree, String> {
    let mut tree = Tree::default();
    let mut linked: HashMap<String, usize> = HashMap::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(dir) = pending.pop() {
        let names = core
            .list(&dir)
            .map_err(|e| format!("cannot list /{}: {e}", dir.display()))?;
        for (name, is_file) in names {
            let rel = dir.join(name);
            match core.node(&rel) {
                Ok(Node::File(m)) if is_file => {
                    let known = m.link.as_ref().and_then(|id| linked.get(id).copied());
                    match known {
                        Some(i) => tree.files[i].names.push(rel),
                        None => {
                            if let Some(id) = &m.link {
                                linked.insert(id.clone(), tree.files.len());
                            }
                            tree.files.push(FileNames {
                                names: vec![rel],
                                meta: m,
                            });
                        }
                    }
                }
                Ok(Node::Plain(m)) if m.is_dir() => {
                    tree.dirs.push(rel.clone());
                    pending.push(rel);
                }
                Ok(Node::Plain(_)) => tree.others.push(rel),
                Ok(Node::File(_)) => {}
                Err(e) => tree.unreadable.push(format!("{}: {e}", rel.display())),
            }
        }
    }
    Ok(tree)
}
