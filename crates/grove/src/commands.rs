//! One function per command. Each opens the pool (except `init`), asks the
//! engine, prints the result and closes the pool. The engine validates
//! names, sizes and ranges and commits every change before it returns, so a
//! refused command leaves the pool as it was.

use std::io::{self, BufWriter, ErrorKind, Write};
use std::path::Path;

use anyhow::{bail, Context, Result};
use grove_store::types::is_valid_block_size;
use grove_store::{Pool, PoolOptions, Shrink, SpaceSettings};

use crate::branches::BranchAdmin;
use crate::cli::{BranchCommand, Cli, Command};
use crate::control::{Admin, AdminVolume, ControlClient};
use crate::open::{open_pool, OpenedPool};
use crate::output::{
    format_size, write_check_report, write_diff, write_pool_info, write_volume_table,
    write_volume_tree,
};
use crate::replicate::{self, Place};
use crate::serve;
use crate::size::parse_size;
use crate::transfer;

pub fn run(cli: Cli) -> Result<()> {
    let dir = &cli.pool_dir();
    let degraded = cli.degraded;
    match cli.command {
        Command::Raif { command } => crate::raif::run(command),
        Command::Init {
            block_size,
            capacity,
            space,
            branches,
            level,
            stripe_unit,
        } => init(
            dir,
            &block_size,
            capacity.as_deref(),
            &space,
            &crate::branches::InitBranches {
                dirs: &branches,
                level: level.as_deref(),
                stripe_unit: stripe_unit.as_deref(),
            },
        ),
        Command::Serve {
            socket,
            listen,
            read_only,
            exports,
            default_export,
            limits,
            mount,
        } => serve::run(
            dir,
            degraded,
            serve::Listen {
                socket,
                tcp: listen,
            },
            read_only,
            exports,
            default_export,
            *limits,
            mount,
        ),
        Command::Mount {
            mountpoint,
            foreground,
            log,
            read_only,
            allow_other,
        } => crate::mount::run(
            dir,
            degraded,
            &mountpoint,
            foreground,
            log.as_deref(),
            grove_fuse::MountOptions {
                read_only,
                allow_other,
            },
        ),
        command => match open_pool(dir, degraded) {
            Ok(opened) => {
                // `check` reports them in its own output (text and JSON);
                // any other command must not let them pass unseen, since
                // the open that found them also repaired them for good.
                if !matches!(command, Command::Check { .. }) {
                    for warning in opened.pool.open_warnings() {
                        eprintln!("grove: warning: {warning}");
                    }
                }
                // `info` shows it in its own output.
                if !matches!(command, Command::Info { .. }) {
                    if let Some(line) = opened
                        .branch_report()?
                        .and_then(|report| crate::branches::degraded_line(dir, &report))
                    {
                        eprintln!("grove: warning: {line}");
                    }
                }
                run_local(&opened, command)?;
                opened
                    .pool
                    .close()
                    .with_context(|| format!("cannot close pool {}", dir.display()))
            }
            // A running `grove serve` holds the pool: ask it instead.
            Err(e) if e.kind() == grove_store::ErrorKind::Busy => match ControlClient::connect(dir)
            {
                Some(daemon) => match command {
                    Command::Send { .. } | Command::Receive { .. } | Command::Hash { .. } => {
                        replicate::run(Place::Daemon(&daemon), command)
                    }
                    command => run_admin(&daemon, &daemon, command),
                },
                None => Err(e.into()),
            },
            Err(e) => Err(e.into()),
        },
    }
}

/// Commands that move data run only where the pool is open; the rest go
/// through `run_admin`, which a daemon can answer too.
fn run_local(opened: &OpenedPool, command: Command) -> Result<()> {
    let pool = &opened.pool;
    match command {
        Command::Import { name, file } => {
            let size_bytes = transfer::import(pool, &name, &file)?;
            let info = pool.volume_info(&name)?;
            say(format_args!(
                "imported {} into {name:?} ({}, {} of data)",
                file.display(),
                format_size(size_bytes),
                format_size(info.summary.referenced_bytes)
            ))
        }
        Command::Export { name, file, force } => {
            let exported = transfer::export(pool, &name, &file, force)?;
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
        // The same path a daemon's pool takes: Pool is an Admin too.
        command @ (Command::Write { .. } | Command::Read { .. }) => move_bytes(pool, command),
        // Here nothing else would reclaim: give the space back before exit.
        Command::Rm {
            name,
            recursive,
            force,
        } => {
            remove(pool, &name, recursive, force)?;
            reclaim_with_progress(pool).map(drop)
        }
        Command::Gc { .. } => {
            let freed = reclaim_with_progress(pool)?;
            say(format_args!(
                "reclaimed {}; nothing is left to reclaim",
                format_size(freed)
            ))
        }
        Command::Rollback {
            snapshot,
            volume,
            force,
        } => {
            rollback(pool, &snapshot, volume.as_deref(), force)?;
            reclaim_with_progress(pool).map(drop)
        }
        command @ (Command::Send { .. } | Command::Receive { .. } | Command::Hash { .. }) => {
            replicate::run(Place::Here(pool), command)
        }
        command => run_admin(pool, opened, command),
    }
}

/// `grove write` and `grove read` through `Admin`: the pool here, or a
/// daemon's control socket in small pieces.
fn move_bytes(pool: &dyn Admin, command: Command) -> Result<()> {
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

/// `grove branch restripe`, and `grove branch add --restripe` after the add.
fn restripe_and_say(branches: &dyn BranchAdmin) -> Result<()> {
    let summary = branches.restripe_branches()?;
    if summary.segments == 0 {
        return say(format_args!(
            "nothing to restripe: everything stored lies over every branch"
        ));
    }
    say(format_args!(
        "restriped {} segment(s): {} copied; everything stored lies over every branch",
        summary.segments,
        crate::output::format_size(summary.bytes_copied)
    ))
}

fn run_admin(pool: &dyn Admin, branches: &dyn BranchAdmin, command: Command) -> Result<()> {
    match command {
        Command::Send { .. } | Command::Receive { .. } | Command::Hash { .. } => {
            unreachable!("send, receive and hash run where the pool is open")
        }
        Command::Init { .. }
        | Command::Serve { .. }
        | Command::Mount { .. }
        | Command::Raif { .. } => {
            unreachable!("init, serve and mount open the pool themselves")
        }
        Command::Import { .. } | Command::Export { .. } => {
            bail!(
                "pool {} is held by a running `grove serve` or `grove mount`: import and export through its NBD exports or mounted files (qemu-img convert, nbdcopy, cp), or stop it first",
                pool.dir().display()
            )
        }
        command @ (Command::Write { .. } | Command::Read { .. }) => move_bytes(pool, command),
        Command::Create { name, size } => create(pool, &name, &size),
        Command::Snapshot {
            source,
            name,
            auto: false,
            ..
        } => {
            let (Some(source), Some(name)) = (source, name) else {
                bail!("give the volume to snapshot and the snapshot's name (or --auto to let its retention policy name it)");
            };
            pool.snapshot(&source, &name)?;
            say(format_args!(
                "created snapshot {name:?} of {source:?} (read-only)"
            ))
        }
        command @ (Command::Snapshot { .. }
        | Command::Policy { .. }
        | Command::Rank { .. }
        | Command::Hold { .. }
        | Command::Release { .. }
        | Command::Holds { .. }
        | Command::Prune { .. }) => crate::retention::run_command(pool, command),
        Command::Clone { source, name } => {
            pool.clone_volume(&source, &name)?;
            say(format_args!(
                "created clone {name:?} of {source:?} (writable)"
            ))
        }
        Command::List { json } => list(pool, json),
        Command::Tree => {
            let volumes = pool.volumes()?;
            print_with(|out| write_volume_tree(out, &volumes))
        }
        Command::Rm {
            name,
            recursive,
            force,
        } => remove(pool, &name, recursive, force),
        Command::Rollback {
            snapshot,
            volume,
            force,
        } => rollback(pool, &snapshot, volume.as_deref(), force),
        Command::Diff { a, b, json } => {
            let report = pool.diff(&a, &b)?;
            if json {
                print_json(&report)
            } else {
                print_with(|out| write_diff(out, &report))
            }
        }
        Command::Gc { wait } => {
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
        Command::Resize { name, size, force } => resize(pool, &name, &size, force),
        Command::Rename { name, new_name } => {
            pool.rename_volume(&name, &new_name)?;
            say(format_args!("renamed {name:?} to {new_name:?}"))
        }
        Command::Check { repair, json } => check(pool, repair, json),
        Command::Space { command } => crate::space_cmd::run(pool, command),
        Command::Info { json } => {
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
        Command::Rebuild { branch, to, force } => {
            let to = std::path::absolute(&to).unwrap_or(to);
            let summary = branches.rebuild_branch(&branch, &to, force)?;
            say(format_args!("{}", crate::branches::rebuilt_line(&summary)))
        }
        Command::Scrub { repair, json } => {
            let summary = branches.scrub_branches(repair)?;
            if json {
                print_json(&summary)?;
            } else {
                print_with(|out| crate::branches::write_scrub(out, &summary))?;
            }
            let left = summary.errors_left();
            if left > 0 {
                bail!(
                    "scrub found {left} stripes with errors{} in pool {}",
                    if repair {
                        " it could not repair"
                    } else {
                        " (`grove scrub --repair` writes them again from what is right)"
                    },
                    pool.dir().display()
                );
            }
            Ok(())
        }
        Command::Branch {
            command: BranchCommand::Fail { label },
        } => {
            let report = branches.fail_branch(&label)?;
            say(format_args!(
                "branch {label} is out of service; {}",
                crate::branches::degraded_line(pool.dir(), &report)
                    .unwrap_or_else(|| "the pool is degraded".into())
            ))
        }
        Command::Branch {
            command: BranchCommand::Add { dirs, restripe },
        } => {
            let report = branches.add_branches(&dirs)?;
            let added: Vec<String> = report.branches[report.branches.len() - dirs.len()..]
                .iter()
                .map(|b| format!("{} ({})", b.label, b.dir))
                .collect();
            say(format_args!(
                "added {}: the pool has {} branches; new space is laid over all of them",
                added.join(", "),
                report.branches.len()
            ))?;
            if restripe {
                restripe_and_say(branches)?;
            } else if report.segments.len() > 1 {
                say(format_args!(
                    "what is stored stays where it is: `grove branch restripe` spreads it over every branch"
                ))?;
            }
            Ok(())
        }
        Command::Branch {
            command: BranchCommand::Restripe,
        } => restripe_and_say(branches),
    }
}

fn init(
    dir: &Path,
    block_size: &str,
    capacity: Option<&str>,
    space: &crate::space_cmd::SpaceArgs,
    branches: &crate::branches::InitBranches,
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
    let (pool, layout) = if branches.dirs.is_empty() {
        (Pool::create_with_space(dir, &options, &settings)?, None)
    } else {
        let (pool, layout) = crate::branches::create_pool(dir, branches, &options, &settings)?;
        (pool, Some(layout))
    };
    let info = pool.info()?;
    pool.close()
        .with_context(|| format!("cannot close pool {}", dir.display()))?;
    let mut line = format!(
        "created pool {} (block size {}",
        dir.display(),
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

fn create(pool: &dyn Admin, name: &str, size: &str) -> Result<()> {
    let size_bytes = parse_size(size, "size")?;
    let info = pool.create_volume(name, size_bytes)?;
    say(format_args!(
        "created volume {name:?} ({})",
        format_size(info.summary.size_bytes)
    ))
}

fn list(pool: &dyn Admin, json: bool) -> Result<()> {
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

fn remove(pool: &dyn Admin, name: &str, recursive: bool, force: bool) -> Result<()> {
    let info = pool.volume_info(name)?;
    // The family's summaries, not the pool's: 100,000 of them took most of
    // a half-second `rm`.
    let dependents = pool.family_summaries(name)?.len() - 1;
    let freed_bytes = pool.remove(name, recursive, force)?;
    say(format_args!(
        "removed {} {name:?}{}; it gives back {}",
        info.summary.kind.as_str(),
        if recursive && dependents > 0 {
            " and everything taken from it"
        } else {
            ""
        },
        format_size(freed_bytes)
    ))?;
    // What was taken from the removed volume now shows under its parent.
    let subject = match dependents {
        _ if recursive => return Ok(()),
        0 => return Ok(()),
        1 => "the volume taken from it".to_string(),
        n => format!("the {n} volumes taken from it"),
    };
    let verb = if dependents == 1 { "is" } else { "are" };
    match &info.summary.parent {
        Some(parent) => say(format_args!("{subject} {verb} now under {parent:?}"))?,
        None => say(format_args!("{subject} {verb} now at the top of the tree"))?,
    }
    Ok(())
}

fn rollback(pool: &dyn Admin, snapshot: &str, volume: Option<&str>, force: bool) -> Result<()> {
    let info = pool.rollback(snapshot, volume, force)?;
    say(format_args!(
        "rolled {:?} back to {snapshot:?} ({})",
        info.summary.name,
        format_size(info.summary.size_bytes)
    ))
}

/// Reclaims everything pending in bounded batches, with a progress bar on
/// a terminal. Returns the bytes freed.
pub(crate) fn reclaim_with_progress(pool: &Pool) -> Result<u64> {
    let pending = pool.pending_free_bytes()?;
    if pending == 0 {
        return Ok(0);
    }
    let bar = crate::progress::Progress::bytes("reclaiming", pending);
    Ok(pool.reclaim_all(|freed| bar.set_position(freed.min(pending)))?)
}

fn resize(pool: &dyn Admin, name: &str, size: &str, force: bool) -> Result<()> {
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
fn check(pool: &dyn Admin, repair: bool, json: bool) -> Result<()> {
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

/// JSON on one line: what scripts grep and parse (pipe through `jq` to read it).
pub(crate) fn print_json(value: &impl serde::Serialize) -> Result<()> {
    print_with(|out| {
        serde_json::to_writer(&mut *out, value).map_err(io::Error::from)?;
        writeln!(out)
    })
}

/// Runs `render` on buffered stdout. A reader that went away early
/// (`grove list | head`) is not an error.
pub(crate) fn print_with(
    render: impl FnOnce(&mut BufWriter<io::StdoutLock>) -> io::Result<()>,
) -> Result<()> {
    let mut out = BufWriter::new(io::stdout().lock());
    match render(&mut out).and_then(|()| out.flush()) {
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Ok(()),
        result => result.context("cannot write to standard output"),
    }
}

/// Prints one line of a command's report on stdout. Unlike println!, a
/// closed stdout is an error rather than a panic, and a reader that went
/// away early is not an error (the change itself is already done).
pub(crate) fn say(line: std::fmt::Arguments) -> Result<()> {
    print_with(|out| writeln!(out, "{line}"))
}
