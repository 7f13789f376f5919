//! The one place the parsed command line is matched: each command goes to
//! its area's module. `init`, `serve`, `mount` and `raif` open what they
//! need themselves; every other command runs on the pool opened here or,
//! when a running `grove serve` or `grove mount` holds it, through that
//! daemon's control socket.

use std::path::Path;

use anyhow::{Context, Result};

use crate::branch_pool::BranchAdmin;
use crate::cli::{Cli, Command};
use crate::control::{Admin, ControlClient};
use crate::open::{open_pool, OpenedPool};
use crate::progress::reclaim_with_progress;
use crate::replicate::Place;
use crate::{branches, replicate, retention_cmd, serve, space_cmd, volumes};

/// The pool's directory, and its RADOS target when `--pool` is a
/// `rados://` location: then the settings come from RADOS if this host has
/// none (except for `init`, which makes them), and `serve --takeover` arms
/// the takeover before anything opens the pool.
fn pool_place(cli: &Cli) -> Result<(std::path::PathBuf, Option<grove_rados::RadosTarget>)> {
    let (dir, rados) = crate::rados_pool::resolve(cli.pool_dir())?;
    if let (Some(target), false) = (&rados, matches!(cli.command, Command::Init { .. })) {
        crate::rados_pool::fetch_settings(&dir, target)?;
    }
    if let Command::Serve { takeover: true, .. } = cli.command {
        crate::rados_pool::take_over_on_open();
    }
    Ok((dir, rados))
}

pub fn run(cli: Cli) -> Result<()> {
    let (dir, rados) = pool_place(&cli)?;
    let dir = &dir;
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
        } => volumes::init(
            dir,
            &block_size,
            capacity.as_deref(),
            &space,
            &crate::branch_pool::InitBranches {
                dirs: &branches,
                level: level.as_deref(),
                stripe_unit: stripe_unit.as_deref(),
            },
            rados.as_ref(),
        ),
        Command::Serve {
            socket,
            listen,
            read_only,
            exports,
            default_export,
            limits,
            mount,
            // Armed by pool_place, before anything opens the pool.
            takeover: _,
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
                archived: None,
            },
        ),
        Command::Archive { command } => crate::archive_cmd::run(dir, degraded, command),
        command => on_the_pool(dir, degraded, command),
    }
}

/// Opens the pool, runs the command and closes it; or, when a running
/// `grove serve` holds the pool, asks it instead.
fn on_the_pool(dir: &Path, degraded: bool, command: Command) -> Result<()> {
    match open_pool(dir, degraded) {
        Ok(opened) => {
            warn_what_the_open_found(dir, &opened, &command)?;
            run_local(&opened, command)?;
            opened
                .pool
                .close()
                .with_context(|| format!("cannot close pool {}", dir.display()))
        }
        Err(e) if e.kind() == grove_store::ErrorKind::Busy => match ControlClient::connect(dir) {
            Some(daemon) => match command {
                Command::Send { .. } | Command::Receive { .. } | Command::Hash { .. } => {
                    replicate::run(Place::Daemon(&daemon), command)
                }
                command => run_admin(&daemon, &daemon, command),
            },
            None => Err(e.into()),
        },
        Err(e) => Err(e.into()),
    }
}

/// What the open repaired, and a degraded branch pool, on stderr.
fn warn_what_the_open_found(dir: &Path, opened: &OpenedPool, command: &Command) -> Result<()> {
    // `check` reports them in its own output (text and JSON); any other
    // command must not let them pass unseen, since the open that found
    // them also repaired them for good.
    if !matches!(command, Command::Check { .. }) {
        for warning in opened.pool.open_warnings() {
            eprintln!("grove: warning: {warning}");
        }
    }
    // `info` shows it in its own output.
    if !matches!(command, Command::Info { .. }) {
        if let Some(line) = opened
            .branch_report()?
            .and_then(|report| crate::branch_pool::degraded_line(dir, &report))
        {
            eprintln!("grove: warning: {line}");
        }
    }
    Ok(())
}

/// Commands that move data run only where the pool is open; the rest go
/// through `run_admin`, which a daemon can answer too.
fn run_local(opened: &OpenedPool, command: Command) -> Result<()> {
    let pool = &opened.pool;
    match command {
        Command::Import { name, file } => volumes::import(pool, &name, &file),
        Command::Export { name, file, force } => volumes::export(pool, &name, &file, force),
        // The same path a daemon's pool takes: Pool is an Admin too.
        command @ (Command::Write { .. } | Command::Read { .. }) => {
            volumes::move_bytes(pool, command)
        }
        // Here nothing else would reclaim: give the space back before exit.
        Command::Rm {
            name,
            recursive,
            force,
        } => {
            volumes::remove(pool, &name, recursive, force)?;
            reclaim_with_progress(pool).map(drop)
        }
        Command::Gc { .. } => volumes::reclaim_all(pool),
        Command::Rollback {
            snapshot,
            volume,
            force,
        } => {
            volumes::rollback(pool, &snapshot, volume.as_deref(), force)?;
            reclaim_with_progress(pool).map(drop)
        }
        command @ (Command::Send { .. } | Command::Receive { .. } | Command::Hash { .. }) => {
            replicate::run(Place::Here(pool), command)
        }
        command => run_admin(pool, opened, command),
    }
}

/// Commands that work the same on a pool opened here and on one a daemon
/// holds: everything goes through `Admin` and `BranchAdmin`.
fn run_admin(pool: &dyn Admin, branches: &dyn BranchAdmin, command: Command) -> Result<()> {
    match command {
        Command::Send { .. } | Command::Receive { .. } | Command::Hash { .. } => {
            unreachable!("send, receive and hash run where the pool is open")
        }
        Command::Init { .. }
        | Command::Serve { .. }
        | Command::Mount { .. }
        | Command::Raif { .. }
        | Command::Archive { .. } => {
            unreachable!("init, serve, mount, raif and archive open the pool themselves")
        }
        Command::Import { .. } | Command::Export { .. } => volumes::refuse_import_export(pool),
        command @ (Command::Write { .. } | Command::Read { .. }) => {
            volumes::move_bytes(pool, command)
        }
        Command::Create { name, size } => volumes::create(pool, &name, &size),
        Command::Snapshot {
            source,
            name,
            auto: false,
            ..
        } => volumes::snapshot(pool, source, name),
        command @ (Command::Snapshot { .. }
        | Command::Policy { .. }
        | Command::Rank { .. }
        | Command::Hold { .. }
        | Command::Release { .. }
        | Command::Holds { .. }
        | Command::Prune { .. }) => retention_cmd::run(pool, command),
        Command::Clone { source, name } => volumes::clone(pool, &source, &name),
        Command::List { json } => volumes::list(pool, json),
        Command::Tree => volumes::tree(pool),
        Command::Rm {
            name,
            recursive,
            force,
        } => volumes::remove(pool, &name, recursive, force),
        Command::Rollback {
            snapshot,
            volume,
            force,
        } => volumes::rollback(pool, &snapshot, volume.as_deref(), force),
        Command::Diff { a, b, json } => volumes::diff(pool, &a, &b, json),
        Command::Gc { wait } => volumes::gc(pool, wait),
        Command::Resize { name, size, force } => volumes::resize(pool, &name, &size, force),
        Command::Rename { name, new_name } => volumes::rename(pool, &name, &new_name),
        Command::Check { repair, json } => volumes::check(pool, repair, json),
        Command::Space { command } => space_cmd::run(pool, command),
        Command::Info { json } => volumes::info(pool, branches, json),
        Command::Rebuild { branch, to, force } => branches::rebuild(branches, &branch, to, force),
        Command::Scrub { repair, json } => branches::scrub(pool.dir(), branches, repair, json),
        Command::Branch { command } => branches::run(pool.dir(), branches, command),
    }
}
