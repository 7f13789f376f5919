//! The archive tier's work on an open pool, for `grove archive push` and
//! `restore` (here or in the daemon holding the pool) and the daemons'
//! scheduler: which snapshots are due, a snapshot pushed with its hash
//! recorded, a snapshot restored and its hash checked, and one scheduled
//! round of push and expiry.

use anyhow::Result;
use grove_archive::Archive;
use grove_retention::{plan, Level, Policy, RetentionConfig, SnapshotFacts};
use grove_store::{Pool, VolumeKind};

/// What `grove archive push` asks, here or of the daemon holding the pool.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PushRequest {
    /// None: every volume whose policy has archive counts.
    pub volume: Option<String>,
    /// None: the snapshots due; else this one (taken by hand, say).
    pub snapshot: Option<String>,
    pub url: String,
    pub pack_bytes: u64,
    pub take_over: bool,
}

/// Pushes what `request` asks: for each volume, the snapshots due (or the
/// one named), oldest first, under one claim of its archive. `progress`
/// hears (snapshot, bytes done, bytes to do); `pushed` each report as its
/// push ends.
pub fn push_volumes(
    pool: &Pool,
    request: &PushRequest,
    progress: &mut dyn FnMut(&str, u64, u64),
    pushed: &mut dyn FnMut(&grove_archive::PushReport) -> Result<()>,
) -> Result<Vec<grove_archive::PushReport>> {
    let config = crate::retention_settings::load_config(pool.dir())?;
    let volumes = match &request.volume {
        Some(v) => vec![v.clone()],
        None => pool
            .volume_names()
            .into_iter()
            .filter(|v| config.archive_policy_for(v).is_ok_and(|p| p.is_some()))
            .collect(),
    };
    let at = crate::retention_settings::now(None)?;
    let mut reports = Vec::new();
    for volume in volumes {
        let archive = Archive::open(&request.url, &volume)?;
        let due = match &request.snapshot {
            Some(name) => vec![name.clone()],
            None => due_snapshots(pool, &archive, &archive_policy(&config, &volume)?, at)?,
        };
        let claim = grove_archive::claim(&archive, request.take_over)?;
        for name in due {
            let report = push_snapshot(
                pool,
                &archive,
                &claim,
                &name,
                request.pack_bytes,
                &mut |d, t| progress(&name, d, t),
            )?;
            pushed(&report)?;
            reports.push(report);
        }
        claim.release()?;
    }
    Ok(reports)
}

/// What `grove archive restore` asks, here or of the daemon holding the
/// pool.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RestoreRequest {
    pub snapshot: String,
    /// The pool snapshot it becomes.
    pub name: String,
    /// None: the volume whose archive holds `snapshot`.
    pub volume: Option<String>,
    pub url: String,
}

/// What a restore did, once its data hashed as the push recorded:
/// grove-archive's report in a form that crosses the control socket.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Restored {
    snapshot: String,
    name: String,
    size_bytes: u64,
    restored_bytes: u64,
    hash: String,
}

impl Restored {
    pub fn report(self) -> grove_archive::RestoreReport {
        grove_archive::RestoreReport {
            snapshot: self.snapshot,
            name: self.name,
            size_bytes: self.size_bytes,
            restored_bytes: self.restored_bytes,
            recorded_hash: self.hash,
        }
    }
}

/// Restores what `request` asks into `pool`, keeping the snapshot only if
/// its `grove hash` is the one recorded at push; `progress` hears (bytes
/// done, bytes to do).
pub fn restore_snapshot(
    pool: &Pool,
    request: &RestoreRequest,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Restored> {
    let RestoreRequest {
        snapshot,
        name,
        url,
        ..
    } = request;
    let volume = match &request.volume {
        Some(v) => v.clone(),
        None => volume_holding(url, snapshot)?,
    };
    let archive = Archive::open(url, &volume)?;
    let report = grove_archive::restore(&archive, pool, snapshot, name, progress)
        .map_err(|e| anyhow::anyhow!("cannot restore {snapshot}: {e}"))?;
    let hash = crate::stream::hash(pool, name)?;
    if hash != report.recorded_hash {
        pool.remove_volume(name)?;
        anyhow::bail!(
            "cannot restore {snapshot}: the restored data hashes to {hash}, the archive recorded {}; nothing was kept",
            report.recorded_hash
        );
    }
    Ok(Restored {
        snapshot: report.snapshot,
        name: report.name,
        size_bytes: report.size_bytes,
        restored_bytes: report.restored_bytes,
        hash,
    })
}

/// The volume whose archive at `url` holds `snapshot`.
pub fn volume_holding(url: &str, snapshot: &str) -> Result<String> {
    use anyhow::Context;
    crate::archive_location::volume_holding(url, snapshot)?
        .with_context(|| format!("no archive at {url} holds a snapshot named {snapshot:?}"))
}

fn archive_policy(config: &RetentionConfig, volume: &str) -> Result<Policy> {
    config
        .archive_policy_for(volume)
        .map_err(anyhow::Error::msg)?
        .ok_or_else(|| {
            anyhow::anyhow!(
                "volume {volume:?} has no archive counts in its policy; add e.g. archive = {{ daily = 30, monthly = 24 }} to it in grove.toml, or push one snapshot with --snapshot"
            )
        })
}

/// Pushes snapshot `name`, its `grove hash` recorded for restore to check;
/// `progress` hears (bytes done, bytes to do).
pub fn push_snapshot(
    pool: &Pool,
    archive: &Archive,
    claim: &grove_archive::WriterLock<'_>,
    name: &str,
    pack_bytes: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<grove_archive::PushReport> {
    let request = grove_archive::PushRequest {
        snapshot: name.to_string(),
        hash: crate::stream::hash(pool, name)?,
        pack_bytes,
        now_unix_secs: crate::retention_settings::now(None)?,
        stall_after_packs: std::env::var("GROVE_TEST_ARCHIVE_STALL_AFTER_PACKS")
            .ok()
            .and_then(|n| n.parse().ok()),
    };
    grove_archive::push(archive, claim, pool, &request, progress)
        .map_err(|e| anyhow::anyhow!("cannot archive {name}: {e}"))
}

/// The ranked snapshots of the archive's volume newer than the newest
/// archived that the archive's policy keeps, oldest first.
pub fn due_snapshots(
    pool: &Pool,
    archive: &Archive,
    policy: &Policy,
    at: u64,
) -> Result<Vec<String>> {
    let catalog = archive.load()?;
    let newest = catalog.as_ref().and_then(|c| c.snapshots.last());
    let mut candidates = Vec::new();
    for summary in pool.family_summaries(archive.volume())? {
        if summary.kind != VolumeKind::Snapshot
            || summary.parent.as_deref() != Some(archive.volume())
            || summary.rank == 0
        {
            continue;
        }
        let identity = pool.identity(&summary.name)?;
        if newest.is_none_or(|n| grove_archive::is_newer(&identity, n)) {
            let order = (identity.created_unix_secs, identity.created_generation);
            let facts = SnapshotFacts {
                name: summary.name.clone(),
                created_unix_secs: summary.created_unix_secs,
                rank: Level::from_rank(summary.rank),
                holds: Vec::new(),
            };
            candidates.push((order, facts));
        }
    }
    candidates.sort_by_key(|c| c.0);
    let candidates: Vec<SnapshotFacts> = candidates.into_iter().map(|(_, f)| f).collect();
    let archived = catalog
        .as_ref()
        .map_or(Vec::new(), grove_archive::retention_facts);
    Ok(kept_by_archive(archived, policy, candidates, at))
}

/// Of the pool's snapshots `in_pool` of the archive's volume, those its
/// policy wants pushed at `at` and not archived yet, oldest first: what
/// `grove prune` keeps. The pool's summaries carry no generation, so a
/// snapshot taken in the same second as the newest archived one counts as
/// newer (kept, to be safe).
pub fn awaiting_push(
    archive: &Archive,
    policy: &Policy,
    in_pool: &[SnapshotFacts],
    at: u64,
) -> Result<Vec<String>> {
    let catalog = archive.load()?;
    let archived = |name: &str| {
        catalog
            .as_ref()
            .is_some_and(|c| c.snapshots.iter().any(|s| s.name == name))
    };
    let newest = catalog
        .as_ref()
        .and_then(|c| c.snapshots.last())
        .map_or(0, |n| n.created_unix_secs);
    let mut candidates: Vec<SnapshotFacts> = in_pool
        .iter()
        .filter(|s| s.rank.is_some() && s.created_unix_secs >= newest && !archived(&s.name))
        .cloned()
        .collect();
    candidates.sort_by_key(|s| s.created_unix_secs);
    let archived = catalog
        .as_ref()
        .map_or(Vec::new(), grove_archive::retention_facts);
    Ok(kept_by_archive(archived, policy, candidates, at))
}

/// The names of `candidates` (pool snapshots newer than every archived
/// one, oldest first) that `policy` keeps at `at`, judged together with
/// `facts`, the snapshots already archived.
fn kept_by_archive(
    mut facts: Vec<SnapshotFacts>,
    policy: &Policy,
    candidates: Vec<SnapshotFacts>,
    at: u64,
) -> Vec<String> {
    let names: Vec<String> = candidates.iter().map(|c| c.name.clone()).collect();
    facts.extend(candidates);
    let kept: std::collections::BTreeSet<String> = plan(policy, &facts, at)
        .into_iter()
        .filter(|v| v.keep)
        .map(|v| v.name)
        .collect();
    names.into_iter().filter(|n| kept.contains(n)).collect()
}

/// What one scheduled round did: snapshots pushed, archived snapshots
/// expiry dropped, and what failed, with why.
#[derive(Debug, Default)]
pub struct ArchiveRound {
    pub archived: Vec<String>,
    pub expired: Vec<String>,
    pub failed: Vec<String>,
}

/// One scheduled round for every volume whose policy has archive counts:
/// push what is due, then expire, each volume on its own (one failing is
/// reported, the others go on).
pub fn scheduled_round(pool: &Pool, config: &RetentionConfig, now: u64) -> ArchiveRound {
    let mut round = ArchiveRound::default();
    let url = match crate::archive_location::location(pool.dir(), None) {
        Ok(url) => url,
        Err(e) => {
            round.failed.push(format!("archive: {e:#}"));
            return round;
        }
    };
    for volume in pool.volume_names() {
        let policy = match config.archive_policy_for(&volume) {
            Ok(Some(policy)) => policy,
            Ok(None) => continue,
            Err(e) => {
                round.failed.push(format!("archive {volume}: {e}"));
                continue;
            }
        };
        if let Err(e) = round_for(pool, &url, &volume, &policy, now, &mut round) {
            round.failed.push(format!("archive {volume}: {e:#}"));
        }
    }
    round
}

fn round_for(
    pool: &Pool,
    url: &str,
    volume: &str,
    policy: &Policy,
    now: u64,
    round: &mut ArchiveRound,
) -> Result<()> {
    let archive = Archive::open(url, volume)?;
    let due = due_snapshots(pool, &archive, policy, now)?;
    let claim = grove_archive::claim(&archive, false)?;
    for name in due {
        push_snapshot(
            pool,
            &archive,
            &claim,
            &name,
            grove_archive::DEFAULT_PACK_BYTES,
            &mut |_, _| {},
        )?;
        round.archived.push(name);
    }
    let expired = grove_archive::expire(&archive, Some(&claim), policy, now, false)?;
    round.expired.extend(expired.expired);
    claim.release()?;
    Ok(())
}
