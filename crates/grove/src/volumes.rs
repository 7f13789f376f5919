//! The volume commands, one function each: `init`, `create`, `import`,
//! `export`, `write`, `read`, `snapshot`, `clone`, `list`, `tree`, `rm`,
//! `rollback`, `diff`, `gc`, `resize`, `rename`, `check` and `info`. Each asks
//! the engine (here or in a daemon, through `Admin`) and prints the result. The engine validates
//! names, sizes and ranges and commits every change before it returns, so a
//! refused command leaves the pool as it was.

use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};
use grove_store::types::is_valid_block_size;
use grove_store::{Pool, PoolOptions, Shrink, SpaceSettings};

use crate::branch_pool::BranchAdmin;
use crate::cli::space::SpaceArgs;
use crate::cli::Command;
use crate::control::{Admin, AdminVolume};
use crate::output::{
    format_size, print_json, print_with, say, write_check_report, write_diff, write_pool_info,
    write_volume_table, write_volume_tree,
};
use crate::progress::reclaim_with_progress;
use crate::size::parse_size;
use crate::transfer;

/// `grove write` and `grove read` through `Admin`: the pool here, or a
/// daemon's control socket in small pieces.
pub fn move_bytes(pool: &dyn Admin, command: Command) -> Result<()> {
    match command {
        Command::Write { name, offset, file } => {
            let offset = parse_size(&offset, "offset")?;
            let volume = AdminVolume {
                admin: pool,
                name: &name,
            };
            let written = transfer::write(&volume, &name, offset, file.as_deref())?;
            say(format_args!(
                "wrote {written} bytes to {name:?} at offset {offset}"
            ))
        }
        Command::Read {
            name,
            offset,
            length,
        } => {
            let offset = parse_size(&offset, "offset")?;
            let length = length.map(|text| parse_size(&text, "length")).transpose()?;
            let volume = AdminVolume {
                admin: pool,
                name: &name,
            };
            transfer::read(&volume, &name, offset, length)
        }
        _ => unreachable!("move_bytes takes grove read and grove write"),
    }
}

pub fn import(pool: &Pool, name: &str, file: &Path) -> Result<()> {
    let size_bytes = transfer::import(pool, name, file)?;
    let info = pool.volume_info(name)?;
    say(format_args!(
        "imported {} into {name:?} ({}, {} of data)",
        file.display(),
        format_size(size_bytes),
        format_size(info.summary.referenced_bytes)
    ))
}

pub fn export(pool: &Pool, name: &str, file: &Path, force: bool) -> Result<()> {
    let exported = transfer::export(pool, name, file, force)?;
    let report = format!(
        "exported {name:?} to {} ({}, {} of data)",
        file.display(),
        format_size(exported.size_bytes),
        format_size(exported.data_bytes)
    );
    // Into an image on stdout, the report would be part of the image.
    if exported.to_stdout {
        eprintln!("{report}");
        Ok(())
    } else {
        say(format_args!("{report}"))
    }
}

/// `grove import` and `grove export` while a daemon holds the pool.
pub fn refuse_import_export(pool: &dyn Admin) -> Result<()> {
    bail!(
        "pool {} is held by a running `grove serve` or `grove mount`: import and export through its NBD exports or mounted files (qemu-img convert, nbdcopy, cp), or stop it first",
        pool.dir().display()
    )
}

/// `grove gc` where the pool is open here: everything, before exit.
pub fn reclaim_all(pool: &Pool) -> Result<()> {
    let freed = reclaim_with_progress(pool)?;
    say(format_args!(
        "reclaimed {}; nothing is left to reclaim",
        format_size(freed)
    ))
}

/// `grove gc` through a daemon, which goes on in the background.
pub fn gc(pool: &dyn Admin, wait: bool) -> Result<()> {
    let report = pool.gc(wait)?;
    say(format_args!(
        "reclaimed {}; {} left to reclaim{}",
        format_size(report.freed_bytes),
        format_size(report.pending_free_bytes),
        if report.pending_free_bytes > 0 {
            " (the server goes on in the background)"
        } else {
            ""
        }
    ))
}

/// `grove snapshot SOURCE NAME` (without --auto, which retention names).
pub fn snapshot(pool: &dyn Admin, source: Option<String>, name: Option<String>) -> Result<()> {
    let (Some(source), Some(name)) = (source, name) else {
        bail!("give the volume to snapshot and the snapshot's name (or --auto to let its retention policy name it)");
    };
    pool.snapshot(&source, &name)?;
    say(format_args!(
        "created snapshot {name:?} of {source:?} (read-only)"
    ))
}

pub fn clone(pool: &dyn Admin, source: &str, name: &str) -> Result<()> {
    pool.clone_volume(source, name)?;
    say(format_args!(
        "created clone {name:?} of {source:?} (writable)"
    ))
}

pub fn tree(pool: &dyn Admin) -> Result<()> {
    let volumes = pool.volumes()?;
    print_with(|out| write_volume_tree(out, &volumes))
}

pub fn diff(pool: &dyn Admin, a: &str, b: &str, json: bool) -> Result<()> {
    let report = pool.diff(a, b)?;
    if json {
        print_json(&report)
    } else {
        print_with(|out| write_diff(out, &report))
    }
}

pub fn rename(pool: &dyn Admin, name: &str, new_name: &str) -> Result<()> {
    pool.rename_volume(name, new_name)?;
    say(format_args!("renamed {name:?} to {new_name:?}"))
}

/// `grove info`: the pool, and its branches when it has them.
pub fn info(pool: &dyn Admin, branches: &dyn BranchAdmin, json: bool) -> Result<()> {
    let info = pool.info()?;
    let report = branches.branch_report()?;
    if json {
        let mut value = serde_json::to_value(&info)?;
        if let (Some(report), Some(fields)) = (&report, value.as_object_mut()) {
            fields.insert("branches".into(), serde_json::to_value(report)?);
        }
        print_json(&value)
    } else {
        print_with(|out| {
            write_pool_info(out, &info)?;
            match &report {
                Some(report) => crate::branches::write_report(out, report),
                None => Ok(()),
            }
        })
    }
}

pub fn init(
    dir: &Path,
    block_size: &str,
    capacity: Option<&str>,
    space: &SpaceArgs,
    branches: &crate::branch_pool::InitBranches,
    rados: Option<&grove_rados::RadosTarget>,
) -> Result<()> {
    let block_size_bytes = parse_size(block_size, "block size")?;
    let block_size_bytes = match u32::try_from(block_size_bytes) {
        Ok(bytes) if is_valid_block_size(bytes) => bytes,
        _ => bail!("invalid block size {block_size:?}: choose 1K, 2K, 4K, 8K, 16K, 32K or 64K"),
    };
    let settings = crate::space_cmd::apply(space, &SpaceSettings::default())?;
    let capacity_bytes = Some(crate::space_cmd::initial_capacity(capacity, &settings)?);
    let options = PoolOptions {
        block_size_bytes,
        capacity_bytes,
        ..PoolOptions::default()
    };
    let (pool, layout) = if let Some(target) = rados {
        let (pool, layout) = crate::rados_pool::create_pool(dir, target, &options, &settings)?;
        (pool, Some(layout))
    } else if branches.dirs.is_empty() {
        (Pool::create_with_space(dir, &options, &settings)?, None)
    } else {
        let (pool, layout) = crate::branch_pool::create_pool(dir, branches, &options, &settings)?;
        (pool, Some(layout))
    };
    let info = pool.info()?;
    pool.close()
        .with_context(|| format!("cannot close pool {}", dir.display()))?;
    let name = rados.map_or_else(|| dir.display().to_string(), |t| t.location());
    let mut line = format!(
        "created pool {name} (block size {}",
        format_size(u64::from(block_size_bytes))
    );
    if let Some(capacity_bytes) = info.capacity_bytes {
        line += &format!(", capacity {}", format_size(capacity_bytes));
        // The engine counts the capacity in whole blocks: say so when
        // that rounded it, rather than let it surprise later.
        if Some(capacity_bytes) != options.capacity_bytes {
            line += ", rounded down to whole blocks";
        }
    }
    if let Some(layout) = layout {
        line += &format!(", {layout}");
    }
    say(format_args!("{line})"))
}

pub fn create(pool: &dyn Admin, name: &str, size: &str) -> Result<()> {
    let size_bytes = parse_size(size, "size")?;
    let info = pool.create_volume(name, size_bytes)?;
    say(format_args!(
        "created volume {name:?} ({})",
        format_size(info.summary.size_bytes)
    ))
}

pub fn list(pool: &dyn Admin, json: bool) -> Result<()> {
    let volumes = pool.volumes()?;
    if json {
        return print_json(&volumes);
    }
    let replication = pool.replication_state()?;
    print_with(|out| {
        write_volume_table(out, &volumes)?;
        for cursor in &replication.cursors {
            writeln!(
                out,
                "cursor {:?}: last sent {} (GUID {}); the next `grove send --cursor {}` starts there",
                cursor.target,
                cursor
                    .snapshot
                    .as_deref()
                    .map_or("a snapshot since removed (kept as a bookmark)".to_string(), |s| format!("{s:?}")),
                cursor.snapshot_guid,
                cursor.target
            )?;
        }
        for partial in &replication.partial_receives {
            writeln!(
                out,
                "partial receive {:?}: {} of {} received; `grove receive --status {}` prints its resume token",
                partial.name,
                format_size(partial.progress_bytes),
                format_size(partial.size_bytes),
                partial.name
            )?;
        }
        Ok(())
    })
}

pub fn remove(pool: &dyn Admin, name: &str, recursive: bool, force: bool) -> Result<()> {
    // The family's summaries, not the pool's: 100,000 of them took most of
    // a half-second `rm`. Its head is the volume's own (no `volume_info`:
    // its accounting walks the volume's tree).
    let family = pool.family_summaries(name)?;
    let dependents = family.len() - 1;
    let summary = &family[0];
    let gives_back = match pool.remove(name, recursive, force)? {
        Some(freed_bytes) => format!("it gives back {}", format_size(freed_bytes)),
        None => {
            "its space comes back as the reclaimer runs (grove gc --wait waits for it)".to_string()
        }
    };
    say(format_args!(
        "removed {} {name:?}{}; {gives_back}",
        summary.kind.as_str(),
        if recursive && dependents > 0 {
            " and everything taken from it"
        } else {
            ""
        },
    ))?;
    // What was taken from the removed volume now shows under its parent.
    let subject = match dependents {
        _ if recursive => return Ok(()),
        0 => return Ok(()),
        1 => "the volume taken from it".to_string(),
        n => format!("the {n} volumes taken from it"),
    };
    let verb = if dependents == 1 { "is" } else { "are" };
    match &summary.parent {
        Some(parent) => say(format_args!("{subject} {verb} now under {parent:?}"))?,
        None => say(format_args!("{subject} {verb} now at the top of the tree"))?,
    }
    Ok(())
}

pub fn rollback(pool: &dyn Admin, snapshot: &str, volume: Option<&str>, force: bool) -> Result<()> {
    let info = pool.rollback(snapshot, volume, force)?;
    say(format_args!(
        "rolled {:?} back to {snapshot:?} ({})",
        info.summary.name,
        format_size(info.summary.size_bytes)
    ))
}

pub fn resize(pool: &dyn Admin, name: &str, size: &str, force: bool) -> Result<()> {
    let size_bytes = parse_size(size, "size")?;
    let before = pool.volume_info(name)?;
    let shrink = if force {
        Shrink::DropData
    } else {
        Shrink::KeepData
    };
    let after = pool
        .resize_volume(name, size_bytes, shrink)
        .map_err(|error| {
            // The engine's refusal to shrink (pool/resize.rs) says what
            // would be dropped; the flag that allows it is ours to name.
            if !force && error.message().contains(" would shrink from ") {
                anyhow::anyhow!("{}; add --force to shrink it", error.message())
            } else {
                error.into()
            }
        })?;
    say(format_args!(
        "resized {name:?} from {} to {}",
        format_size(before.summary.size_bytes),
        format_size(after.summary.size_bytes)
    ))
}

/// Checks the pool; with `repair`, fixes what can be fixed and checks again,
/// so the exit code says whether the pool is sound now.
pub fn check(pool: &dyn Admin, repair: bool, json: bool) -> Result<()> {
    let report = pool.check(repair)?;
    let after_repair = if repair && !report.repaired.is_empty() {
        Some(pool.check(false)?)
    } else {
        None
    };
    if json {
        print_json(&serde_json::json!({ "report": report, "after_repair": after_repair }))?;
    } else {
        print_with(|out| write_check_report(out, &report, after_repair.as_ref()))?;
    }
    let remaining = after_repair.as_ref().unwrap_or(&report);
    if !remaining.is_clean() {
        bail!(
            "check found {} errors in pool {}",
            remaining.errors.len(),
            pool.dir().display()
        );
    }
    // Lost space is an alarm too: it grows unseen until the pool is full.
    if remaining.loses_space() {
        bail!(
            "check found {} leaked blocks and {} blocks counted with more references than they have in pool {}: space is lost, though no data is; `grove check --repair` gives it back",
            remaining.leaked_blocks,
            remaining.over_counted_blocks,
            pool.dir().display()
        );
    }
    Ok(())
}
