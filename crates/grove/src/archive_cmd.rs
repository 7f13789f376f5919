//! `grove archive`: the archive tier's commands. Push and restore need the
//! pool, opened here or through the daemon that holds it; list, expire and
//! check need only grove.toml and the archive.

use std::path::Path;

use anyhow::{Context, Result};
use grove_archive::{Archive, ArchiveError, PushReport};
use grove_store::units::parse_size;
use grove_store::Pool;

use crate::archiving::{
    push_volumes, restore_snapshot, volume_holding, PushRequest, RestoreRequest,
};
use crate::cli::archive::{ArchiveCommand, ArchivePlace};
use crate::control::ControlClient;
use crate::open::open_pool;
use crate::output::archive as show;
use crate::output::{print_json, print_with};
use crate::progress::Progress;
use crate::retention_settings::{load_config, now};

pub fn run(dir: &Path, degraded: bool, command: ArchiveCommand) -> Result<()> {
    match command {
        command @ ArchiveCommand::Push { .. } => push_command(dir, degraded, command),
        ArchiveCommand::List {
            volume,
            place,
            json,
        } => list(dir, &location(dir, &place)?, volume, json),
        ArchiveCommand::Expire {
            volume,
            place,
            dry_run,
            now: at,
            take_over,
            json,
        } => {
            let at = now(at.as_deref())?;
            expire(
                dir,
                &location(dir, &place)?,
                volume,
                at,
                dry_run,
                take_over,
                json,
            )
        }
        ArchiveCommand::Restore {
            snapshot,
            name,
            volume,
            place,
        } => {
            let request = RestoreRequest {
                snapshot,
                name,
                volume,
                url: location(dir, &place)?,
            };
            restore(dir, degraded, &request)
        }
        ArchiveCommand::Release {
            snapshot,
            volume,
            place,
            take_over,
        } => release(&location(dir, &place)?, &snapshot, volume, take_over),
        ArchiveCommand::Check {
            volume,
            place,
            deep,
            json,
        } => check(&location(dir, &place)?, volume, deep, json),
    }
}

/// `grove archive push`: its flags read, then the pool opened.
fn push_command(dir: &Path, degraded: bool, command: ArchiveCommand) -> Result<()> {
    let ArchiveCommand::Push {
        volume,
        snapshot,
        place,
        pack_size,
        take_over,
        json,
    } = command
    else {
        unreachable!("a push")
    };
    let pack_bytes = match pack_size {
        Some(text) => parse_size(&text).map_err(|e| anyhow::anyhow!("--pack-size: {e}"))?,
        None => grove_archive::DEFAULT_PACK_BYTES,
    };
    let request = PushRequest {
        volume,
        snapshot,
        url: location(dir, &place)?,
        pack_bytes,
        take_over,
    };
    push(dir, degraded, &request, json)
}

fn location(dir: &Path, place: &ArchivePlace) -> Result<String> {
    crate::archive_location::location(dir, place.to.as_deref())
}

/// Restores with the pool opened here (with a progress bar), or through
/// the daemon that holds it.
fn restore(dir: &Path, degraded: bool, request: &RestoreRequest) -> Result<()> {
    let restored = match open_pool(dir, degraded) {
        Ok(opened) => {
            let bar = Progress::bytes(&format!("restoring {}", request.snapshot), 0);
            let restored = restore_snapshot(&opened.pool, request, &mut |done, total| {
                bar.set_length(total);
                bar.set_position(done);
            })?;
            drop(bar);
            opened
                .pool
                .close()
                .with_context(|| format!("cannot close pool {}", dir.display()))?;
            restored
        }
        Err(e) if e.kind() == grove_store::ErrorKind::Busy => {
            let daemon = ControlClient::connect(dir).ok_or(e)?;
            daemon.archive_restore(request)?
        }
        Err(e) => return Err(e.into()),
    };
    print_with(|out| show::write_restore(out, &restored.report()))
}

/// Pushes with the pool opened here, or through the daemon that holds it.
fn push(dir: &Path, degraded: bool, request: &PushRequest, json: bool) -> Result<()> {
    let reports = match open_pool(dir, degraded) {
        Ok(opened) => {
            let reports = push_here(&opened.pool, request, json)?;
            opened
                .pool
                .close()
                .with_context(|| format!("cannot close pool {}", dir.display()))?;
            reports
        }
        Err(e) if e.kind() == grove_store::ErrorKind::Busy => {
            let daemon = ControlClient::connect(dir).ok_or(e)?;
            let reports = daemon.archive_push(request)?;
            if !json {
                print_with(|out| reports.iter().try_for_each(|r| show::write_push(out, r)))?;
            }
            reports
        }
        Err(e) => return Err(e.into()),
    };
    if json {
        print_json(&reports)?;
    }
    Ok(())
}

/// Pushes where the pool is open, each push with a progress bar and its
/// line as it ends.
fn push_here(pool: &Pool, request: &PushRequest, json: bool) -> Result<Vec<PushReport>> {
    // The bar of the push under way; its line printed once it ends.
    let bar = std::cell::RefCell::new(None::<Progress>);
    push_volumes(
        pool,
        request,
        &mut |name, done, total| {
            let mut bar = bar.borrow_mut();
            let bar = bar.get_or_insert_with(|| Progress::bytes(&format!("archiving {name}"), 0));
            bar.set_length(total);
            bar.set_position(done);
        },
        &mut |report| {
            bar.borrow_mut().take();
            if json {
                Ok(())
            } else {
                print_with(|out| show::write_push(out, report))
            }
        },
    )
}

/// The volumes a read-only command looks at.
fn archived_volumes(url: &str, volume: Option<String>) -> Result<Vec<String>> {
    match volume {
        Some(v) => Ok(vec![v]),
        None => Ok(Archive::volumes_at(url)?),
    }
}

fn list(dir: &Path, url: &str, volume: Option<String>, json: bool) -> Result<()> {
    let config = load_config(dir)?;
    let at = now(None)?;
    let mut listings = Vec::new();
    for volume in archived_volumes(url, volume)? {
        let policy = config
            .archive_policy_for(&volume)
            .map_err(anyhow::Error::msg)?;
        let archive = Archive::open(url, &volume)?;
        listings.push(grove_archive::list(&archive, policy.as_ref(), at)?);
    }
    if json {
        return print_json(&listings);
    }
    if listings.is_empty() {
        return crate::output::say(format_args!("nothing is archived at {url}"));
    }
    print_with(|out| {
        listings
            .iter()
            .try_for_each(|l| show::write_listing(out, l))
    })
}

fn expire(
    dir: &Path,
    url: &str,
    volume: Option<String>,
    at: u64,
    dry_run: bool,
    take_over: bool,
    json: bool,
) -> Result<()> {
    let config = load_config(dir)?;
    let mut reports = Vec::new();
    for volume in archived_volumes(url, volume)? {
        let Some(policy) = config
            .archive_policy_for(&volume)
            .map_err(anyhow::Error::msg)?
        else {
            eprintln!("grove: {volume} has no archive counts in its policy: nothing of it expires");
            continue;
        };
        let archive = Archive::open(url, &volume)?;
        let claim = if dry_run {
            None
        } else {
            Some(grove_archive::claim(&archive, take_over)?)
        };
        let report = grove_archive::expire(&archive, claim.as_ref(), &policy, at, dry_run)?;
        if let Some(claim) = claim {
            claim.release()?;
        }
        if !json {
            print_with(|out| show::write_expire(out, &volume, &report))?;
        }
        reports.push(report);
    }
    if json {
        print_json(&reports)?;
    }
    Ok(())
}

fn release(url: &str, snapshot: &str, volume: Option<String>, take_over: bool) -> Result<()> {
    let volume = match volume {
        Some(v) => v,
        None => volume_holding(url, snapshot)?,
    };
    let archive = Archive::open(url, &volume)?;
    let claim = grove_archive::claim(&archive, take_over)?;
    grove_archive::release(&archive, &claim, snapshot)?;
    claim.release()?;
    crate::output::say(format_args!(
        "released {snapshot:?}: the next `grove archive expire` drops it"
    ))
}

fn check(url: &str, volume: Option<String>, deep: bool, json: bool) -> Result<()> {
    let mut reports = Vec::new();
    for volume in archived_volumes(url, volume)? {
        let archive = Archive::open(url, &volume)?;
        let bar = Progress::bytes(&format!("checking {volume}"), 0);
        let checked = grove_archive::check_with_progress(&archive, deep, &mut |done, total| {
            bar.set_length(total);
            bar.set_position(done);
        });
        drop(bar);
        let report = match checked {
            Ok(report) => report,
            Err(ArchiveError::Damaged(why)) => grove_archive::CheckReport {
                problems: vec![why],
                ..Default::default()
            },
            Err(e) => return Err(e.into()),
        };
        if !json {
            print_with(|out| show::write_check(out, &volume, &report))?;
        }
        reports.push((volume, report));
    }
    if json {
        let value: Vec<_> = reports
            .iter()
            .map(|(v, r)| serde_json::json!({"volume": v, "report": r}))
            .collect();
        print_json(&value)?;
    }
    if reports.iter().any(|(_, r)| !r.is_clean()) {
        std::process::exit(1);
    }
    Ok(())
}
