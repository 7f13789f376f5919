//! Retention's work for the commands (retention_cmd.rs) and the daemons:
//! policies set and shown, holds, due snapshots taken, expired ones pruned,
//! and the tick `grove serve` and `grove mount` run on their schedule. Everything goes through `Admin`, so it works on a pool opened
//! here and on one a daemon holds. Which snapshots a policy keeps is
//! grove-retention's; taking and removing them is the engine's.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use grove_retention::calendar::{display, parse_duration};
use grove_retention::{
    auto_snapshot_name, due_level, plan, space_order, Level, Policy, RetentionConfig, SnapshotFacts,
};
use grove_store::config::PoolConfig;
use grove_store::{VolumeKind, VolumeSummary};
use serde::Serialize;

use crate::archive_location::{archived_facts, ranking_policy};
use crate::control::Admin;

pub use crate::retention_settings::{load_config, now};

/// One volume under a policy, with the facts about its snapshots.
pub struct VolumeUnderPolicy {
    pub volume: String,
    pub policy: Policy,
    pub snapshots: Vec<SnapshotFacts>,
}

/// Every volume with a policy (only those in `only`, if any), with what
/// holds each snapshot: hold tags whose lease has not ended at `now`, and
/// the replication cursors that mark it.
pub fn volumes_under_policy(
    admin: &dyn Admin,
    config: &RetentionConfig,
    now: u64,
    only: &[String],
) -> Result<Vec<VolumeUnderPolicy>> {
    // Named volumes: their families only, not the whole pool (`grove
    // prune VOLUME` beside 100,000 other volumes).
    let summaries = if only.is_empty() {
        admin.summaries()?
    } else {
        let mut summaries = Vec::new();
        for name in only {
            let family = admin.family_summaries(name)?;
            if family[0].kind == VolumeKind::Snapshot {
                bail!(
                    "{name:?} is a snapshot; retention works on the volume its snapshots are taken of"
                );
            }
            summaries.extend(family);
        }
        // Two named volumes of one family (a volume and its clone) would
        // list the clone twice.
        summaries.sort_by_key(|s| s.id);
        summaries.dedup_by_key(|s| s.id);
        summaries
    };
    let mut holds: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for hold in admin.holds()? {
        if hold.until_unix_secs.is_none_or(|until| until > now) {
            holds.entry(hold.snapshot).or_default().push(hold.tag);
        }
    }
    let mut out = Vec::new();
    for volume in summaries.iter().filter(|s| s.kind != VolumeKind::Snapshot) {
        if !only.is_empty() && !only.contains(&volume.name) {
            continue;
        }
        let Some(policy) = config
            .policy_for(&volume.name)
            .map_err(anyhow::Error::msg)?
        else {
            if only.contains(&volume.name) {
                bail!(
                    "volume {:?} has no retention policy; give it one with `grove policy set {} --template NAME`",
                    volume.name,
                    volume.name
                );
            }
            continue;
        };
        let snapshots = snapshots_of(&summaries, &volume.name)
            .map(|s| SnapshotFacts {
                name: s.name.clone(),
                created_unix_secs: s.created_unix_secs,
                rank: Level::from_rank(s.rank),
                holds: holds.get(&s.name).cloned().unwrap_or_default(),
            })
            .collect();
        out.push(VolumeUnderPolicy {
            volume: volume.name.clone(),
            policy,
            snapshots,
        });
    }
    Ok(out)
}

/// The read-only snapshots taken of `volume` (its policy's to keep).
fn snapshots_of<'a>(
    summaries: &'a [VolumeSummary],
    volume: &'a str,
) -> impl Iterator<Item = &'a VolumeSummary> {
    summaries
        .iter()
        .filter(move |s| s.kind == VolumeKind::Snapshot && s.parent.as_deref() == Some(volume))
}

/// What one run of the schedule did.
#[derive(Debug, Default, Serialize)]
pub struct TickReport {
    /// Snapshots taken, with their level.
    pub taken: Vec<(String, String)>,
    /// Snapshots removed (or, in a dry run, that would be).
    pub pruned: Vec<String>,
    /// Holds whose lease ended, as "SNAPSHOT TAG".
    pub released: Vec<String>,
    /// Snapshots that could not be taken or removed, with why.
    pub failed: Vec<String>,
    /// Snapshots pushed to the archive tier (the daemons' scheduler).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub archived: Vec<String>,
    /// Archived snapshots its expiry dropped.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub archive_expired: Vec<String>,
    /// Snapshots the pool's policy no longer keeps but prune kept: the
    /// archive's policy wants them pushed, and they are not yet.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kept_for_archive: Vec<String>,
}

/// The level due for `under` at `now`, ranked for the pool's policy and its
/// archive counts, with the snapshots already archived counted too.
fn due_for(
    admin: &dyn Admin,
    config: &RetentionConfig,
    under: &VolumeUnderPolicy,
    now: u64,
) -> Result<Option<Level>> {
    let archive = config
        .archive_policy_for(&under.volume)
        .map_err(anyhow::Error::msg)?;
    let Some(archive) = archive else {
        return Ok(due_level(&under.policy, &under.snapshots, now));
    };
    let mut facts = archived_facts(admin.dir(), &under.volume)?;
    facts.retain(|f| !under.snapshots.iter().any(|s| s.name == f.name));
    facts.extend(under.snapshots.iter().cloned());
    facts.sort_by_key(|f| f.created_unix_secs);
    let ranking = ranking_policy(&under.policy, Some(&archive));
    Ok(due_level(&ranking, &facts, now))
}

/// `grove snapshot --auto`: a snapshot of each volume (of `only`, if any)
/// whose policy has a level due at `now`, ranked at the highest such level.
pub fn take_due_snapshots(
    admin: &dyn Admin,
    config: &RetentionConfig,
    now: u64,
    only: &[String],
    report: &mut TickReport,
) -> Result<()> {
    for under in volumes_under_policy(admin, config, now, only)? {
        let Some(level) = due_for(admin, config, &under, now)? else {
            continue;
        };
        let name = auto_snapshot_name(&under.volume, now);
        match admin.snapshot_ranked(&under.volume, &name, level.rank(), now) {
            Ok(_) => report.taken.push((name, level.name().to_string())),
            Err(e) => report.failed.push(format!("snapshot {name}: {e}")),
        }
    }
    Ok(())
}

/// How `grove prune` runs.
#[derive(Clone, Copy, Debug, Default)]
pub struct PruneMode {
    /// Change nothing; report what a real prune would do.
    pub dry_run: bool,
    /// Remove even snapshots the archive's policy wants and has not got.
    pub ignore_archive: bool,
}

/// `grove prune`: releases holds whose lease ended, then removes every
/// snapshot the policies no longer keep, except those the archive's policy
/// wants pushed and the archive has not got yet (unless told to ignore the
/// archive). A dry run changes nothing and reports what a real one would
/// do.
pub fn prune(
    admin: &dyn Admin,
    config: &RetentionConfig,
    now: u64,
    only: &[String],
    mode: PruneMode,
    report: &mut TickReport,
) -> Result<()> {
    let PruneMode {
        dry_run,
        ignore_archive,
    } = mode;
    let expired = if dry_run {
        admin
            .holds()?
            .into_iter()
            .filter(|h| h.until_unix_secs.is_some_and(|until| until <= now))
            .collect()
    } else {
        admin.release_expired_holds(now)?
    };
    report.released.extend(
        expired
            .into_iter()
            .map(|h| format!("{} {}", h.snapshot, h.tag)),
    );
    let expired = expired_snapshots(admin, config, now, only, ignore_archive, report)?;
    if dry_run || expired.is_empty() {
        report.pruned.extend(expired);
        return Ok(());
    }
    // As few requests as a control request line allows, each removed in
    // batches of one commit; if one is refused (a snapshot held or claimed
    // since the plan), its names one at a time, so the others still go.
    for names in crate::control::names_per_request(&expired) {
        match admin.remove_snapshots(names) {
            Ok(summary) => report.pruned.extend(summary.removed),
            Err(_) => {
                for name in names {
                    match admin.remove(name, false, false) {
                        Ok(_) => report.pruned.push(name.clone()),
                        Err(e) => report.failed.push(format!("remove {name}: {e}")),
                    }
                }
            }
        }
    }
    Ok(())
}

/// The snapshots the pools' policies no longer keep, less those kept for
/// the archive (unless `ignore_archive`), which `report` names; a volume
/// whose archive cannot be read keeps all its snapshots, reported failed.
fn expired_snapshots(
    admin: &dyn Admin,
    config: &RetentionConfig,
    now: u64,
    only: &[String],
    ignore_archive: bool,
    report: &mut TickReport,
) -> Result<Vec<String>> {
    let mut expired = Vec::new();
    for under in volumes_under_policy(admin, config, now, only)? {
        let verdicts = plan(&under.policy, &under.snapshots, now);
        let dropped: Vec<String> = verdicts
            .into_iter()
            .filter(|v| !v.keep)
            .map(|v| v.name)
            .collect();
        if ignore_archive || dropped.is_empty() {
            expired.extend(dropped);
            continue;
        }
        match awaiting_push(admin, config, &under, now) {
            Ok(awaiting) => {
                let (kept, gone): (Vec<_>, Vec<_>) =
                    dropped.into_iter().partition(|n| awaiting.contains(n));
                report.kept_for_archive.extend(kept);
                expired.extend(gone);
            }
            Err(e) => report.failed.push(format!(
                "prune {}: {e:#}; nothing of it pruned (--ignore-archive prunes it without the archive)",
                under.volume
            )),
        }
    }
    Ok(expired)
}

/// The snapshots of `under` its archive's policy wants pushed and the
/// archive (at the pool's location) has not got; none for a volume whose
/// policy has no archive counts.
fn awaiting_push(
    admin: &dyn Admin,
    config: &RetentionConfig,
    under: &VolumeUnderPolicy,
    now: u64,
) -> Result<Vec<String>> {
    let Some(policy) = config
        .archive_policy_for(&under.volume)
        .map_err(anyhow::Error::msg)?
    else {
        return Ok(Vec::new());
    };
    let url = crate::archive_location::location(admin.dir(), None)?;
    let archive = grove_archive::Archive::open(&url, &under.volume)?;
    crate::archiving::awaiting_push(&archive, &policy, &under.snapshots, now)
}

/// One run of the schedule, as the daemons do it: take what is due, run
/// `between` (the archive tier's push and expiry), then prune.
pub fn tick(
    admin: &dyn Admin,
    now: u64,
    between: impl FnOnce(&RetentionConfig, &mut TickReport),
) -> Result<TickReport> {
    let config = load_config(admin.dir())?;
    let mut report = TickReport::default();
    take_due_snapshots(admin, &config, now, &[], &mut report)?;
    // After the snapshots are taken and before the pool prunes: the
    // archive tier pushes what it keeps while the pool still has it.
    between(&config, &mut report);
    prune(admin, &config, now, &[], PruneMode::default(), &mut report)?;
    Ok(report)
}

/// Removes snapshots in the order space pressure takes them (expired
/// first, then the lowest ranks, oldest first; never a held or unranked
/// one, nor a volume's newest `minimum`) until `bytes_wanted` are on their
/// way back. Returns the bytes removal gives back.
pub fn free_space(admin: &dyn Admin, now: u64, bytes_wanted: u64) -> Result<u64> {
    let config = load_config(admin.dir())?;
    let mut candidates = Vec::new();
    for under in volumes_under_policy(admin, &config, now, &[])? {
        let verdicts = plan(&under.policy, &under.snapshots, now);
        candidates.extend(space_order(&under.policy, &verdicts));
    }
    candidates.sort();
    let mut freed = 0;
    for grove_retention::SpaceCandidate { name, .. } in candidates {
        if freed >= bytes_wanted {
            break;
        }
        match admin.remove(&name, false, false) {
            Ok(bytes) => {
                tracing::warn!("space: removed snapshot {name:?} to give back space");
                // Uncounted (a daemon's removal): one at a time, the next
                // look at the space deciding whether more must go.
                freed += bytes.unwrap_or(bytes_wanted);
            }
            Err(e) => tracing::warn!("space: cannot remove snapshot {name:?}: {e}"),
        }
    }
    Ok(freed)
}

/// How a policy set on the command line changes a volume's.
#[derive(Clone, Debug, Default)]
pub struct PolicyChange {
    pub template: Option<String>,
    pub counts: Vec<(Level, u32)>,
    pub frequent_period: Option<String>,
    pub minimum: Option<u32>,
}

/// `grove policy set`: writes the volume's policy into grove.toml, as a
/// template's name when nothing overrides it, else as a table. Checked
/// before it is written.
pub fn set_policy(admin: &dyn Admin, volume: &str, change: &PolicyChange) -> Result<Policy> {
    let summaries = admin.summaries()?;
    match summaries.iter().find(|s| s.name == volume) {
        None => bail!("no volume named {volume:?}"),
        Some(s) if s.kind == VolumeKind::Snapshot => bail!(
            "{volume:?} is a snapshot; a policy belongs to the volume its snapshots are taken of"
        ),
        Some(_) => {}
    }
    if let Some(period) = &change.frequent_period {
        parse_duration(period).map_err(anyhow::Error::msg)?;
    }
    if change.template.is_none() && change.counts.is_empty() {
        bail!("say what to keep: --template NAME and/or counts such as --hourly 24 --daily 7");
    }
    let spec = grove_retention::policy::spec(
        change.template.as_deref(),
        &change.counts,
        change.frequent_period.as_deref(),
        change.minimum,
    );
    update_config(admin.dir(), |config| {
        config.set_volume_policy(volume, spec);
        Ok(())
    })?;
    let config = load_config(admin.dir())?;
    Ok(config
        .policy_for(volume)
        .map_err(anyhow::Error::msg)?
        .expect("just set"))
}

/// `grove policy unset`.
pub fn unset_policy(dir: &Path, volume: &str) -> Result<()> {
    update_config(dir, |config| {
        if !config.unset_volume_policy(volume) {
            bail!("volume {volume:?} has no policy");
        }
        Ok(())
    })
}

/// Changes the `[retention]` table of grove.toml, checks the result, and
/// writes it atomically.
fn update_config(
    dir: &Path,
    change: impl FnOnce(&mut RetentionConfig) -> Result<()>,
) -> Result<()> {
    let mut pool_config = PoolConfig::load(dir)?;
    let mut config =
        RetentionConfig::from_table(pool_config.retention.as_ref()).map_err(anyhow::Error::msg)?;
    change(&mut config)?;
    let table = config.to_table();
    RetentionConfig::from_table(table.as_ref()).map_err(anyhow::Error::msg)?;
    pool_config.retention = table;
    pool_config
        .save(dir)
        .with_context(|| format!("cannot save the policy in {}", dir.display()))
}

/// One snapshot as `grove policy show --json` lists it.
#[derive(Serialize)]
pub struct ShownSnapshot {
    pub name: String,
    pub created: String,
    pub created_unix_secs: u64,
    pub rank: Option<&'static str>,
    pub keep: bool,
    pub rule: String,
    pub kept_by: Option<&'static str>,
    pub until_unix_secs: Option<u64>,
    pub holds: Vec<String>,
}

/// One volume as `grove policy show --json` lists it.
#[derive(Serialize)]
pub struct ShownVolume {
    pub volume: String,
    pub policy: String,
    pub due_now: Option<&'static str>,
    pub snapshots: Vec<ShownSnapshot>,
}

/// `grove policy show`: for each snapshot, the rule that keeps it and
/// until when, or why it goes.
pub fn show(
    admin: &dyn Admin,
    config: &RetentionConfig,
    now: u64,
    only: &[String],
) -> Result<Vec<ShownVolume>> {
    let mut shown = Vec::new();
    for under in volumes_under_policy(admin, config, now, only)? {
        let holds: BTreeMap<&str, &Vec<String>> = under
            .snapshots
            .iter()
            .map(|s| (s.name.as_str(), &s.holds))
            .collect();
        let snapshots = plan(&under.policy, &under.snapshots, now)
            .into_iter()
            .map(|v| {
                let (kept_by, until) = match &v.reason {
                    grove_retention::Reason::Kept {
                        level,
                        until_unix_secs,
                        ..
                    } => (Some(level.name()), Some(*until_unix_secs)),
                    _ => (None, None),
                };
                ShownSnapshot {
                    created: display(v.created_unix_secs),
                    created_unix_secs: v.created_unix_secs,
                    rank: v.rank.map(Level::name),
                    keep: v.keep,
                    rule: v.explain(),
                    kept_by,
                    until_unix_secs: until,
                    holds: holds[v.name.as_str()].clone(),
                    name: v.name,
                }
            })
            .collect();
        shown.push(ShownVolume {
            due_now: due_for(admin, config, &under, now)?.map(Level::name),
            policy: under.policy.describe(),
            volume: under.volume,
            snapshots,
        });
    }
    Ok(shown)
}

/// A level from the command line: its name, or `none`.
pub fn parse_rank(text: &str) -> Result<u8> {
    if text == "none" {
        return Ok(0);
    }
    match Level::from_name(text) {
        Some(level) => Ok(level.rank()),
        None => bail!(
            "unknown level {text:?}: one of {}, or none",
            Level::ALL.map(|l| l.name()).join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use grove_retention::calendar::HOUR_SECS;
    use grove_store::Pool;
    use std::collections::BTreeSet;

    /// A year of the daemon's ticks, one an hour, on a real pool (in
    /// memory-backed storage where there is some, so it runs in seconds):
    /// the snapshots left are what the policy's calendar says, a held one
    /// and a hand-taken one stay, and nothing leaks.
    #[test]
    fn a_year_of_hourly_ticks_on_a_pool_keeps_what_the_calendar_says() {
        let base = Path::new("/dev/shm");
        let dir = if base.is_dir() {
            tempfile::tempdir_in(base).unwrap()
        } else {
            tempfile::tempdir().unwrap()
        };
        let path = dir.path().join("pool");
        let pool = Pool::create(&path, &grove_store::PoolOptions::default()).unwrap();
        pool.create_volume("vm", 1 << 20).unwrap();
        let mut config = PoolConfig::load(&path).unwrap();
        let mut retention = RetentionConfig::default();
        let counts = [
            (Level::Hourly, 24),
            (Level::Daily, 7),
            (Level::Weekly, 4),
            (Level::Monthly, 12),
            (Level::Yearly, 2),
        ];
        retention.set_volume_policy(
            "vm",
            grove_retention::policy::spec(None, &counts, None, None),
        );
        config.retention = retention.to_table();
        config.save(&path).unwrap();
        let policy = load_config(&path)
            .unwrap()
            .policy_for("vm")
            .unwrap()
            .unwrap();

        let start = grove_retention::calendar::parse_time("2025-01-01T00:00").unwrap();
        let hours = 365 * 24;
        let volume = pool.volume("vm").unwrap();
        let mut taken = Vec::new();
        for hour in 0..hours {
            let now = start + hour * HOUR_SECS;
            // A write between snapshots, so they differ.
            volume
                .write_at(&hour.to_le_bytes(), (hour % 128) * 4096)
                .unwrap();
            let report = tick(&pool, now, |_, _| {}).unwrap();
            assert!(report.failed.is_empty(), "{:?}", report.failed);
            assert_eq!(report.taken.len(), 1, "hour {hour}: {report:?}");
            taken.push(now);
            // The daemon's reclaimer gives the pruned snapshots back
            // between ticks.
            pool.reclaim_all(|_| {}).unwrap();
            if hour == 100 {
                pool.snapshot("vm", "vm@by-hand").unwrap();
                let name = auto_snapshot_name("vm", now);
                pool.hold(&name, "legal", None).unwrap();
            }
        }
        let mut expected = grove_retention::oracle::kept_by_calendar(&policy, &taken);
        expected.insert(start + 100 * HOUR_SECS);
        let summaries = pool.volume_summaries();
        let autos: BTreeSet<u64> = summaries
            .iter()
            .filter(|s| s.name.starts_with("vm@auto-"))
            .map(|s| s.created_unix_secs)
            .collect();
        assert_eq!(autos, expected);
        assert!(summaries.iter().any(|s| s.name == "vm@by-hand"));
        pool.reclaim_all(|_| {}).unwrap();
        let report = pool.check(false).unwrap();
        assert!(report.is_clean(), "{:?}", report.errors);
        println!(
            "{} snapshots taken in a year, {} kept",
            taken.len(),
            autos.len()
        );
    }
}

#[cfg(test)]
mod space_tests {
    use super::*;
    use grove_store::Pool;

    /// Space pressure takes expired snapshots first, then the lowest rank,
    /// oldest first, and stops once enough comes back; never a held or
    /// hand-taken one, nor the volume's newest.
    #[test]
    fn free_space_takes_the_lowest_ranks_first_and_stops_when_enough_comes_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pool");
        let pool = Pool::create(&path, &grove_store::PoolOptions::default()).unwrap();
        pool.create_volume("vm", 8 << 20).unwrap();
        let volume = pool.volume("vm").unwrap();
        let hour = 3600;
        let start = 1_795_392_000; // a Monday, 00:00 UTC
                                   // Each snapshot holds 1 MiB that only it keeps (the volume is
                                   // rewritten after it).
        let ranks = [
            ("d0", Level::Daily, 0),
            ("h1", Level::Hourly, 1),
            ("h2", Level::Hourly, 2),
            ("h3", Level::Hourly, 3),
            ("h4", Level::Hourly, 4),
        ];
        for (i, (name, level, at)) in ranks.iter().enumerate() {
            volume.write_at(&vec![i as u8 + 1; 1 << 20], 0).unwrap();
            pool.snapshot_ranked("vm", name, level.rank(), start + at * hour)
                .unwrap();
        }
        volume.write_at(&vec![0xee; 1 << 20], 0).unwrap();
        pool.snapshot("vm", "by-hand").unwrap();
        pool.hold("h1", "legal", None).unwrap();
        let mut config = PoolConfig::load(&path).unwrap();
        let mut retention = RetentionConfig::default();
        let counts = [(Level::Hourly, 4), (Level::Daily, 1)];
        retention.set_volume_policy(
            "vm",
            grove_retention::policy::spec(None, &counts, None, None),
        );
        config.retention = retention.to_table();
        config.save(&path).unwrap();

        let now = start + 4 * hour + 60;
        let names = |pool: &Pool| -> Vec<String> {
            pool.volume_summaries()
                .into_iter()
                .map(|s| s.name)
                .collect()
        };
        // 1.5 MiB wanted: h2 (the oldest unheld hourly) gives 1 MiB, then h3.
        let freed = free_space(&pool, now, 3 << 19).unwrap();
        assert_eq!(freed, 2 << 20);
        assert_eq!(names(&pool), ["vm", "d0", "h1", "h4", "by-hand"]);
        // Asked for far more: the daily goes, the rest is protected.
        free_space(&pool, now, 1 << 30).unwrap();
        assert_eq!(names(&pool), ["vm", "h1", "h4", "by-hand"]);
    }
}
