//! The retention commands: `grove policy`, `grove rank`, `grove hold`,
//! `release` and `holds`, `grove prune` and `grove snapshot --auto`. What
//! they do is retention.rs's (the same the daemons' tick runs); here they
//! are read from the command line and their outcome printed.

use anyhow::{bail, Result};
use grove_retention::calendar::{display, parse_duration};
use grove_retention::Level;

use crate::cli::{Command, PolicyCommand};
use crate::control::Admin;
use crate::output::say;
use crate::retention::{
    load_config, now, parse_rank, prune, set_policy, show, take_due_snapshots, unset_policy,
    PolicyChange, PruneMode, TickReport,
};

/// The retention commands (and `grove snapshot --auto`).
pub fn run(admin: &dyn Admin, command: Command) -> Result<()> {
    match command {
        Command::Snapshot {
            source,
            name,
            now: at,
            ..
        } => {
            debug_assert!(name.is_none(), "clap refuses a name with --auto");
            snapshot_due(admin, source, at.as_deref())
        }
        Command::Prune {
            volumes,
            dry_run,
            now: at,
            ignore_archive,
        } => {
            let mode = PruneMode {
                dry_run,
                ignore_archive,
            };
            prune_now(admin, &volumes, mode, at.as_deref())
        }
        Command::Rank {
            snapshot,
            level,
            take_over,
        } => rank(admin, &snapshot, &level, take_over),
        Command::Hold {
            snapshot,
            tag,
            lease,
            now: at,
        } => hold(admin, &snapshot, &tag, lease.as_deref(), at.as_deref()),
        Command::Release { snapshot, tag } => {
            admin.release(&snapshot, &tag)?;
            say(format_args!("released hold {tag:?} on {snapshot:?}"))
        }
        Command::Holds { json } => holds(admin, json),
        Command::Policy { command } => policy(admin, command),
        _ => unreachable!("not a retention command"),
    }
}

/// `grove rank`: a snapshot in the pool, or else one in the pool's archive
/// (a lazy rank: the archive's next expiry keeps what the rank keeps);
/// `take_over` takes over the archive claim of a writer that is gone.
fn rank(admin: &dyn Admin, snapshot: &str, level: &str, take_over: bool) -> Result<()> {
    let rank = parse_rank(level)?;
    match admin.set_rank(snapshot, rank) {
        Err(e) if e.kind() == grove_store::ErrorKind::NotFound => {
            let Some((url, volume)) =
                crate::archive_location::find_archived(admin.dir(), snapshot)?
            else {
                return Err(e.into());
            };
            let archive = grove_archive::Archive::open(&url, &volume)?;
            let claim = grove_archive::claim(&archive, take_over)?;
            grove_archive::set_rank(&archive, &claim, snapshot, rank)?;
            claim.release()?;
            say(format_args!(
                "ranked {snapshot:?} {level} in the archive at {url}"
            ))
        }
        Err(e) => Err(e.into()),
        Ok(()) => say(format_args!("ranked {snapshot:?} {level}")),
    }
}

/// `grove snapshot --auto`: the snapshots the policies say are due.
fn snapshot_due(admin: &dyn Admin, source: Option<String>, at: Option<&str>) -> Result<()> {
    let config = load_config(admin.dir())?;
    let at = now(at)?;
    let only: Vec<String> = source.into_iter().collect();
    let mut report = TickReport::default();
    take_due_snapshots(admin, &config, at, &only, &mut report)?;
    for (name, level) in &report.taken {
        say(format_args!("created snapshot {name:?} ({level})"))?;
    }
    if report.taken.is_empty() && report.failed.is_empty() {
        say(format_args!("no snapshot is due at {}", display(at)))?;
    }
    fail_on(&report.failed)
}

fn prune_now(
    admin: &dyn Admin,
    volumes: &[String],
    mode: PruneMode,
    at: Option<&str>,
) -> Result<()> {
    let config = load_config(admin.dir())?;
    let at = now(at)?;
    let mut report = TickReport::default();
    prune(admin, &config, at, volumes, mode, &mut report)?;
    let (released, removed) = if mode.dry_run {
        ("would release hold", "would remove")
    } else {
        ("released hold", "removed")
    };
    for hold in &report.released {
        say(format_args!("{released} {hold} (its lease ended)"))?;
    }
    for name in &report.pruned {
        say(format_args!("{removed} {name}"))?;
    }
    for name in &report.kept_for_archive {
        say(format_args!(
            "kept {name}: the archive's policy wants it and it is not pushed yet (`grove archive push`; --ignore-archive prunes it anyway)"
        ))?;
    }
    if report.pruned.is_empty() && report.kept_for_archive.is_empty() {
        say(format_args!("nothing to prune at {}", display(at)))?;
    }
    fail_on(&report.failed)
}

fn hold(
    admin: &dyn Admin,
    snapshot: &str,
    tag: &str,
    lease: Option<&str>,
    at: Option<&str>,
) -> Result<()> {
    let until = match lease {
        Some(lease) => {
            let secs = parse_duration(lease).map_err(anyhow::Error::msg)?;
            Some(now(at)?.saturating_add(secs))
        }
        None => None,
    };
    admin.hold(snapshot, tag, until)?;
    match until {
        Some(until) => say(format_args!(
            "held {snapshot:?} as {tag:?} until {}",
            display(until)
        )),
        None => say(format_args!(
            "held {snapshot:?} as {tag:?} (until `grove release {snapshot} {tag}`)"
        )),
    }
}

fn holds(admin: &dyn Admin, json: bool) -> Result<()> {
    let holds = admin.holds()?;
    if json {
        return say(format_args!("{}", serde_json::to_string_pretty(&holds)?));
    }
    if holds.is_empty() {
        return say(format_args!("no holds"));
    }
    for hold in holds {
        let until = hold
            .until_unix_secs
            .map_or("until released".to_string(), |u| {
                format!("until {}", display(u))
            });
        say(format_args!("{}  {}  {until}", hold.snapshot, hold.tag))?;
    }
    Ok(())
}

/// `grove policy set|unset|show|templates`.
fn policy(admin: &dyn Admin, command: PolicyCommand) -> Result<()> {
    match command {
        PolicyCommand::Set {
            volume,
            template,
            frequent,
            hourly,
            daily,
            weekly,
            monthly,
            yearly,
            frequent_period,
            minimum,
        } => {
            let counts = [frequent, hourly, daily, weekly, monthly, yearly];
            let change = PolicyChange {
                template,
                counts: Level::ALL
                    .into_iter()
                    .zip(counts)
                    .filter_map(|(level, n)| n.map(|n| (level, n)))
                    .collect(),
                frequent_period,
                minimum,
            };
            let policy = set_policy(admin, &volume, &change)?;
            say(format_args!("{volume}: {}", policy.describe()))
        }
        PolicyCommand::Unset { volume } => {
            unset_policy(admin.dir(), &volume)?;
            say(format_args!(
                "{volume} has no policy now; its snapshots stay until removed"
            ))
        }
        PolicyCommand::Show {
            volumes,
            json,
            now: at,
        } => show_policies(admin, &volumes, json, at.as_deref()),
        PolicyCommand::Templates => {
            let config = load_config(admin.dir())?;
            for name in config.template_names() {
                let policy = config.template(&name).map_err(anyhow::Error::msg)?;
                say(format_args!("{name}: {}", policy.describe()))?;
            }
            Ok(())
        }
    }
}

fn show_policies(
    admin: &dyn Admin,
    volumes: &[String],
    json: bool,
    at: Option<&str>,
) -> Result<()> {
    let config = load_config(admin.dir())?;
    let at = now(at)?;
    let shown = show(admin, &config, at, volumes)?;
    if json {
        return say(format_args!("{}", serde_json::to_string_pretty(&shown)?));
    }
    if shown.is_empty() {
        return say(format_args!(
            "no volume has a retention policy (see `grove policy set --help`)"
        ));
    }
    for volume in shown {
        let due = volume
            .due_now
            .map_or("nothing due".to_string(), |l| format!("{l} due now"));
        say(format_args!("{}: {} ({due})", volume.volume, volume.policy))?;
        for s in volume.snapshots {
            let verdict = if s.keep { "keep " } else { "prune" };
            say(format_args!(
                "  {verdict} {}  {}  {:<8}  {}",
                s.name,
                s.created,
                s.rank.unwrap_or("-"),
                s.rule
            ))?;
        }
    }
    Ok(())
}

/// Errors for single snapshots are reported together, after the rest ran.
fn fail_on(failed: &[String]) -> Result<()> {
    for line in failed {
        eprintln!("grove: error: {line}");
    }
    if !failed.is_empty() {
        bail!("{} snapshot(s) could not be handled", failed.len());
    }
    Ok(())
}
