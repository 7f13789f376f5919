//! Where a pool's archive is, and what is archived there, for the commands
//! that push to it and for the retention that ranks snapshots for it.

use std::path::Path;

use anyhow::{bail, Context, Result};
use grove_archive::Archive;
use grove_retention::{Policy, SnapshotFacts};

/// `to` if given, else grove.toml's `archive.location`, else a directory
/// beside the pool (`file://POOL.archive`).
pub fn location(dir: &Path, to: Option<&str>) -> Result<String> {
    if let Some(url) = to {
        return Ok(url.to_string());
    }
    let config = grove_store::config::PoolConfig::load(dir)?;
    if let Some(table) = &config.archive {
        if let Some(key) = table.keys().find(|k| k.as_str() != "location") {
            bail!(
                "grove.toml: unknown setting \"archive.{key}\" (known settings: archive.location)"
            );
        }
        if let Some(value) = table.get("location") {
            let url = value
                .as_str()
                .context("grove.toml: archive.location must be a URL string")?;
            return Ok(url.to_string());
        }
    }
    let absolute =
        std::path::absolute(dir).with_context(|| format!("cannot resolve {}", dir.display()))?;
    Ok(format!("file://{}.archive", absolute.display()))
}

/// The snapshots of `volume` already archived at the pool's default
/// location, as retention facts: the rank tree counts them when it decides
/// which level is due, so a weekly the pool has pruned since it was
/// archived still counts for its week.
pub fn archived_facts(dir: &Path, volume: &str) -> Result<Vec<SnapshotFacts>> {
    let archive = Archive::open(&location(dir, None)?, volume)?;
    let Some(catalog) = archive.load()? else {
        return Ok(Vec::new());
    };
    Ok(grove_archive::retention_facts(&catalog))
}

/// The policy snapshots are ranked by: every level the pool or the archive
/// keeps.
pub fn ranking_policy(pool: &Policy, archive: Option<&Policy>) -> Policy {
    let mut ranking = pool.clone();
    if let Some(archive) = archive {
        for (keep, archived) in ranking.keep.iter_mut().zip(archive.keep) {
            *keep = (*keep).max(archived);
        }
    }
    ranking
}

/// The pool's archive location and the volume whose archive there holds
/// `snapshot`, if one does.
pub fn find_archived(dir: &Path, snapshot: &str) -> Result<Option<(String, String)>> {
    let url = location(dir, None)?;
    for volume in Archive::volumes_at(&url)? {
        let catalog = Archive::open(&url, &volume)?.load()?;
        if catalog.is_some_and(|c| c.snapshots.iter().any(|s| s.name == snapshot)) {
            return Ok(Some((url, volume)));
        }
    }
    Ok(None)
}
