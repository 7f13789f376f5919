//! `grove space set|show` and the space flags `grove init` shares with
//! them: they turn flags into the engine's `SpaceSettings` (the engine
//! checks them and writes grove.toml's `[space]`), and print where the
//! pool stands.

use std::io::{self, Write};

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use grove_store::space_settings::{SpaceConfig, CAPACITY_INITIAL_DEFAULT_BYTES};
use grove_store::{SpaceSettings, SpaceStatus};
use serde::Serialize;

use crate::control::Admin;
use crate::output::format_size;
use crate::size::parse_size;

/// The space settings as flags; an absent flag leaves the setting as it
/// is (for `init`: the default).
#[derive(Debug, Default, Args)]
pub struct SpaceArgs {
    /// Largest the capacity may grow to by auto-extension ("none": the host's free space less the reserve)
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    pub max_capacity: Option<String>,
    /// Grow the capacity by steps when use passes --extend-at: on or off [default: on]
    #[arg(long, value_name = "on|off")]
    pub auto_extend: Option<String>,
    /// Use, as a percentage of the capacity, at which it grows by a step [default: 80%]
    #[arg(long, value_name = "PERCENT")]
    pub extend_at: Option<String>,
    /// How much each step adds: a percentage of the capacity (at least 64M), or a size [default: 20%]
    #[arg(long, value_name = "PERCENT|SIZE")]
    pub extend_step: Option<String>,
    /// Host free space the capacity never grows into: a size or a percentage of the host file system [default: 1G]
    #[arg(long, value_name = "SIZE|PERCENT")]
    pub host_reserve: Option<String>,
    /// Use, as a percentage of the ceiling, past which a warning is logged and the hook runs [default: 80%]
    #[arg(long, value_name = "PERCENT")]
    pub warn: Option<String>,
    /// Use, as a percentage of the ceiling, past which snapshots are pruned [default: 90%]
    #[arg(long, value_name = "PERCENT")]
    pub prune: Option<String>,
    /// Command run by `sh -c` when the level changes, with GROVE_SPACE_* in its environment ("" for none)
    #[arg(long, value_name = "COMMAND", allow_hyphen_values = true)]
    pub hook: Option<String>,
    /// Seconds the hook may run before it is killed [default: 10]
    #[arg(long, value_name = "SECONDS")]
    pub hook_timeout: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum SpaceCommand {
    /// Change the pool's space settings (and raise its capacity)
    #[command(
        after_help = "Examples:\n  grove space set --max-capacity 200G --warn 75% --prune 90%\n  \
                            grove space set --capacity 50G\n  \
                            grove space set --hook '/usr/local/bin/page-me' --hook-timeout 5\n  \
                            grove space set --auto-extend off"
    )]
    Set {
        /// Raise the capacity now to SIZE (it never shrinks)
        #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
        capacity: Option<String>,
        #[command(flatten)]
        settings: Box<SpaceArgs>,
    },
    /// Show the space settings, the levels and where the pool stands
    Show {
        /// Print them as a JSON object
        #[arg(long)]
        json: bool,
    },
}

/// `settings` with the flags given applied; each bad flag is one line
/// naming it.
pub fn apply(args: &SpaceArgs, settings: &SpaceSettings) -> Result<SpaceSettings> {
    let mut table = SpaceConfig::from_settings(settings);
    let text = |value: &Option<String>| value.clone();
    if let Some(value) = &args.max_capacity {
        table.max_capacity = Some(match value.as_str() {
            "none" => "none".to_string(),
            _ => parse_size(value, "max capacity")?.to_string(),
        });
    }
    if let Some(value) = &args.auto_extend {
        table.auto_extend = Some(match value.as_str() {
            "on" => true,
            "off" => false,
            _ => bail!("invalid --auto-extend {value:?}: say on or off"),
        });
    }
    table.extend_at = text(&args.extend_at).or(table.extend_at);
    table.extend_step = text(&args.extend_step).or(table.extend_step);
    table.host_reserve = text(&args.host_reserve).or(table.host_reserve);
    table.warn = text(&args.warn).or(table.warn);
    table.prune = text(&args.prune).or(table.prune);
    if let Some(hook) = &args.hook {
        table.hook = Some(hook.clone());
    }
    if let Some(value) = &args.hook_timeout {
        match value.parse() {
            Ok(secs) => table.hook_timeout_secs = Some(secs),
            Err(_) => bail!("invalid --hook-timeout {value:?}: give whole seconds"),
        }
    }
    // The engine's checks name grove.toml's keys; the flags have the same
    // names with dashes, which the message says too.
    table
        .settings()
        .map_err(|why| anyhow::anyhow!("invalid space setting: {why}"))
}

/// The capacity a new pool starts with: --capacity, else the default
/// initial capacity, but no more than the maximum.
pub fn initial_capacity(capacity: Option<&str>, settings: &SpaceSettings) -> Result<u64> {
    if let Some(text) = capacity {
        let bytes = parse_size(text, "capacity")?;
        if let Some(max) = settings.max_capacity_bytes.filter(|&max| bytes > max) {
            bail!(
                "invalid capacity {text}: it is above --max-capacity {}",
                format_size(max)
            );
        }
        return Ok(bytes);
    }
    Ok(settings
        .max_capacity_bytes
        .map_or(CAPACITY_INITIAL_DEFAULT_BYTES, |max| {
            max.min(CAPACITY_INITIAL_DEFAULT_BYTES)
        }))
}

/// What `grove space show --json` prints.
#[derive(Serialize)]
struct SpaceReport<'a> {
    settings: &'a SpaceSettings,
    status: &'a SpaceStatus,
}

pub fn run(pool: &dyn Admin, command: SpaceCommand) -> Result<()> {
    match command {
        SpaceCommand::Set { capacity, settings } => {
            let current = pool.space_settings()?;
            let new = apply(&settings, &current)?;
            let capacity_bytes = capacity
                .map(|text| parse_size(&text, "capacity"))
                .transpose()?;
            let status = pool.set_space(&new, capacity_bytes)?;
            crate::commands::print_with(|out| write_space(out, &new, &status))
        }
        SpaceCommand::Show { json } => {
            let settings = pool.space_settings()?;
            let status = pool
                .info()?
                .space
                .ok_or_else(|| anyhow::anyhow!("the pool did not report its space status"))?;
            if json {
                return crate::commands::print_json(&SpaceReport {
                    settings: &settings,
                    status: &status,
                });
            }
            crate::commands::print_with(|out| write_space(out, &settings, &status))
        }
    }
}

/// The settings and the status, one "field  value" line each.
pub fn write_space(
    out: &mut impl Write,
    settings: &SpaceSettings,
    status: &SpaceStatus,
) -> io::Result<()> {
    let mut lines = vec![(
        "capacity",
        status.capacity_bytes.map_or("none".into(), format_size),
    )];
    lines.extend(space_lines(status));
    lines.push((
        "hook",
        settings.hook.clone().map_or("none".into(), |hook| {
            format!("{hook} (killed after {} s)", settings.hook_timeout_secs)
        }),
    ));
    write_fields(out, &lines)
}

/// Where the pool stands, as `grove info` and `grove space show` print it.
pub fn space_lines(status: &SpaceStatus) -> Vec<(&'static str, String)> {
    let size = |bytes: Option<u64>| bytes.map_or("none".to_string(), format_size);
    let share = |bytes: Option<u64>| match (bytes, status.ceiling_bytes) {
        (Some(bytes), Some(ceiling)) if ceiling > 0 => {
            let percent = (u128::from(bytes) * 100 + u128::from(ceiling) / 2) / u128::from(ceiling);
            format!("{} ({percent}%)", format_size(bytes))
        }
        (bytes, _) => size(bytes),
    };
    vec![
        ("space level", status.level.name().to_string()),
        ("used", share(Some(status.used_bytes))),
        ("ceiling", size(status.ceiling_bytes)),
        ("warn at", share(status.warn_bytes)),
        ("prune at", share(status.prune_bytes)),
        (
            "auto-extend",
            match (status.auto_extend, status.extend_at_bytes) {
                (false, _) => "off".into(),
                (true, None) => "on (no capacity to extend)".into(),
                (true, Some(at)) => format!(
                    "on: at {} used, to {}",
                    format_size(at),
                    size(status.next_capacity_bytes)
                ),
            },
        ),
        ("max capacity", size(status.max_capacity_bytes)),
        (
            "host free",
            match status.host_available_bytes {
                None => "unknown".into(),
                Some(free) => format!(
                    "{} (reserve {})",
                    format_size(free),
                    format_size(status.host_reserve_bytes)
                ),
            },
        ),
    ]
}

pub fn write_fields(out: &mut impl Write, lines: &[(&str, String)]) -> io::Result<()> {
    let width = lines
        .iter()
        .map(|(field, _)| field.len())
        .max()
        .unwrap_or(0);
    for (field, value) in lines {
        writeln!(out, "{field:<width$}  {value}")?;
    }
    Ok(())
}
