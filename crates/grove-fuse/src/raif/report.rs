//! What `grove raif status` and `grove raif explain` print, as JSON the
//! mount computes and hands out through virtual extended attributes.

use std::io;
use std::path::Path;

use grove_raif::config::FileFacts;
use serde_json::json;

use super::core::{Core, Node, OpenFile};

/// Stripes `explain` lists: after `width` of them the pattern repeats.
const EXPLAIN_STRIPES_MAX: u64 = 8;

/// Every branch with its health, average read latency and read count.
pub fn status(core: &Core) -> String {
    let b = &core.branches;
    b.check_roots();
    let branches: Vec<_> = (0..b.count())
        .map(|i| {
            json!({
                "label": b.config.branches[i].label,
                "path": b.root(i).display().to_string(),
                "configured_path": b.config.branches[i].path.display().to_string(),
                "state": b.state(i),
                "latency_us": b.balancer.latency_ns(i) / 1000,
                "reads": b.balancer.reads(i),
            })
        })
        .collect();
    let degraded = (0..b.count()).any(|i| b.is_failed(i));
    json!({
        "state": if degraded { "degraded" } else { "ok" },
        "branches": branches,
        "rules": b.config.rules.iter().map(|r| r.name.clone()).collect::<Vec<_>>(),
        "job": *super::core::lock(&core.job),
    })
    .to_string()
}

/// Which rule a file was laid out by (and which would apply now), where
/// its metadata and first stripes' units live, and its number of names
/// (with the link record that holds the metadata of a file with several).
pub fn explain(core: &Core, rel: &Path) -> io::Result<String> {
    let b = &core.branches;
    let m = match core.node(rel)? {
        Node::File(m) => m,
        Node::Plain(_) => {
            return Ok(json!({"path": rel.display().to_string(), "kind": "directory or symlink", "branches": "all"}).to_string())
        }
    };
    let text = rel.to_string_lossy();
    let now = b.config.rule_for(&FileFacts {
        path: &text,
        uid: m.uid,
        gid: m.gid,
        size_bytes: m.size_bytes,
    });
    let layout = OpenFile::layout(&m)?;
    let label = |p: &usize| m.branches[*p].clone();
    let stripes: Vec<_> = (0..layout.stripe_count(m.size_bytes).clamp(1, EXPLAIN_STRIPES_MAX))
        .map(|s| {
            let map = layout.stripe_map(s);
            json!({
                "stripe": s,
                "offset": s * layout.stripe_data_bytes(),
                "data": map.data.iter().map(|c| c.iter().map(label).collect::<Vec<_>>()).collect::<Vec<_>>(),
                "parity": map.parity.iter().map(label).collect::<Vec<_>>(),
            })
        })
        .collect();
    let labels = |pair: [usize; 2]| -> Vec<String> {
        pair.iter()
            .map(|&i| b.config.branches[i].label.clone())
            .collect()
    };
    // A linked file's metadata is its record; the name only points there.
    let meta_on = match &m.link {
        Some(id) => labels(b.record_branches(id)),
        None => labels(b.meta_branches(rel)),
    };
    Ok(json!({
        "path": rel.display().to_string(),
        "rule": m.rule,
        "rule_now": now.name,
        "level": m.level.to_string(),
        "stripe_unit_bytes": m.stripe_unit_bytes,
        "branches": m.branches,
        "start": m.branches[m.start],
        "size_bytes": m.size_bytes,
        "metadata_on": meta_on,
        "names": m.nlink,
        "link_record": m.link,
        "name_on": labels(b.meta_branches(rel)),
        "stripes": stripes,
    })
    .to_string())
}
