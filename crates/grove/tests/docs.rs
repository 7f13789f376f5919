//! The developers' guide stays true to the code: its crate and module
//! tree (docs/DEVELOPMENT.md, "The crate tree") lists every source file
//! of every crate, each on one line of its own, and nothing that is gone.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Widest line of the tree, so that it reads without wrapping.
const TREE_LINE_MAX_CHARS: usize = 100;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap()
        .to_path_buf()
}

/// Every `.rs` file below `dir`, relative to `root`.
fn sources_below(root: &Path, dir: &Path, found: &mut BTreeSet<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources_below(root, &path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(root).unwrap();
            found.insert(rel.to_string_lossy().into_owned());
        }
    }
}

/// The source files of the workspace: each crate's src/ and examples/,
/// and bench's src/.
fn source_files(root: &Path) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let crates = std::fs::read_dir(root.join("crates")).unwrap();
    for krate in crates.flatten() {
        sources_below(root, &krate.path().join("src"), &mut found);
        sources_below(root, &krate.path().join("examples"), &mut found);
    }
    sources_below(root, &root.join("bench/src"), &mut found);
    found
}

/// The tree's lines: the fenced block after "## The crate tree".
fn tree_lines(guide: &str) -> Vec<&str> {
    let after = guide
        .split_once("## The crate tree")
        .expect("docs/DEVELOPMENT.md has a section \"The crate tree\"")
        .1;
    let block = after.split_once("```\n").expect("the tree is fenced").1;
    block
        .split_once("```")
        .expect("the tree's fence closes")
        .0
        .lines()
        .collect()
}

/// The source files the tree lists: the `.rs` paths of its indented lines.
fn listed_files(lines: &[&str]) -> Vec<String> {
    let mut listed = listed_paths(lines);
    listed.retain(|path| path.ends_with(".rs"));
    listed
}

/// Every path an indented line starts with, below the crate or folder
/// the last line at the left margin names.
fn listed_paths(lines: &[&str]) -> Vec<String> {
    let mut parent = String::new();
    let mut paths = Vec::new();
    for line in lines {
        let Some(first) = line.split_whitespace().next() else {
            continue;
        };
        if line.starts_with(' ') {
            paths.push(format!("{parent}/{first}"));
        } else {
            parent = first.trim_end_matches('/').to_string();
        }
    }
    paths
}

#[test]
fn the_development_guide_lists_every_source_file_on_a_line_of_its_own() {
    let root = workspace_root();
    let guide = std::fs::read_to_string(root.join("docs/DEVELOPMENT.md")).unwrap();
    let lines = tree_lines(&guide);
    let listed = listed_files(&lines);
    let listed_set: BTreeSet<String> = listed.iter().cloned().collect();
    assert_eq!(listed.len(), listed_set.len(), "a file is listed twice");
    let sources = source_files(&root);
    let missing: Vec<&String> = sources.difference(&listed_set).collect();
    let gone: Vec<&String> = listed_set.difference(&sources).collect();
    assert!(missing.is_empty(), "not in the tree: {missing:#?}");
    assert!(
        gone.is_empty(),
        "in the tree but not in the code: {gone:#?}"
    );
    // One line a file: an indented line starts with the path it is about
    // (below the crate or folder above it), never with the rest of the
    // line before.
    let not_paths: Vec<String> = listed_paths(&lines)
        .into_iter()
        .filter(|path| !root.join(path).exists())
        .collect();
    assert!(
        not_paths.is_empty(),
        "lines that name no path: {not_paths:#?}"
    );
    let wide: Vec<&&str> = lines
        .iter()
        .filter(|l| l.chars().count() > TREE_LINE_MAX_CHARS)
        .collect();
    assert!(
        wide.is_empty(),
        "lines wider than {TREE_LINE_MAX_CHARS}: {wide:#?}"
    );
}
