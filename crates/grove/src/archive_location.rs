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
    if let Some(url) = archive_setting(dir, "location", "a URL string")? {
        return Ok(url);
    }
    let absolute =
        std::path::absolute(dir).with_context(|| format!("cannot resolve {}", dir.display()))?;
    Ok(format!("file://{}.archive", absolute.display()))
}

/// Bytes of archived blocks a back-in-time read keeps cached per open
/// snapshot, when grove.toml does not say.
pub const READ_CACHE_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;

/// grove.toml's `archive.cache_size`: the bound of the local cache that
/// reads of an archived snapshot go through.
pub fn read_cache_bytes(dir: &Path) -> Result<u64> {
    match archive_setting(dir, "cache_size", "a size string such as \"256M\"")? {
        None => Ok(READ_CACHE_BYTES_DEFAULT),
        Some(text) => grove_store::units::parse_size(&text)
            .map_err(|e| anyhow::anyhow!("grove.toml: archive.cache_size {text:?}: {e}")),
    }
}

/// Whether the pool at `pool` is set up to archive: grove.toml has an
/// `[archive]` table, or a volume's policy has archive counts.
pub fn archive_configured(pool: &grove_store::Pool) -> Result<bool> {
    if grove_store::config::PoolConfig::load(pool.dir())?
        .archive
        .is_some()
    {
        return Ok(true);
    }
    let config = crate::retention_settings::load_config(pool.dir())?;
    Ok(pool
        .volume_names()
        .iter()
        .any(|v| config.archive_policy_for(v).is_ok_and(|p| p.is_some())))
}

/// grove.toml's string setting `archive.KEY`, if set; every key of the
/// `[archive]` table is checked, so a misspelt one is an error.
fn archive_setting(dir: &Path, key: &str, what: &str) -> Result<Option<String>> {
    let config = grove_store::config::PoolConfig::load(dir)?;
    let Some(table) = &config.archive else {
        return Ok(None);
    };
    if let Some(unknown) = table
        .keys()
        .find(|k| !matches!(k.as_str(), "location" | "cache_size"))
    {
        bail!(
            "grove.toml: unknown setting \"archive.{unknown}\" (known settings: archive.location, archive.cache_size)"
        );
    }
    table
        .get(key)
        .map(|value| {
            value
                .as_str()
                .map(str::to_string)
                .with_context(|| format!("grove.toml: archive.{key} must be {what}"))
        })
        .transpose()
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
    Ok(volume_holding(&url, snapshot)?.map(|volume| (url, volume)))
}

/// The volume whose archive at `url` holds `snapshot`, if one does.
pub fn volume_holding(url: &str, snapshot: &str) -> Result<Option<String>> {
    for volume in Archive::volumes_at(url)? {
        let catalog = Archive::open(url, &volume)?.load()?;
        if catalog.is_some_and(|c| c.snapshots.iter().any(|s| s.name == snapshot)) {
            return Ok(Some(volume));
        }
    }
    Ok(None)
}
