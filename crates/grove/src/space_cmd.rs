//! `grove space set|show` and the space flags `grove init` shares with
//! them: they turn flags into the engine's `SpaceSettings` (the engine
//! checks them and writes grove.toml's `[space]`), and print where the
//! pool stands.

use anyhow::{bail, Result};
use grove_store::space_settings::{SpaceConfig, CAPACITY_INITIAL_DEFAULT_BYTES};
use grove_store::{SpaceSettings, SpaceStatus};
use serde::Serialize;

use crate::cli::space::{SpaceArgs, SpaceCommand};
use crate::control::Admin;
use crate::output::space::write_space;
use crate::output::{format_size, print_json, print_with};
use crate::size::parse_size;

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
            print_with(|out| write_space(out, &new, &status))
        }
        SpaceCommand::Show { json } => {
            let settings = pool.space_settings()?;
            let status = pool
                .info()?
                .space
                .ok_or_else(|| anyhow::anyhow!("the pool did not report its space status"))?;
            if json {
                return print_json(&SpaceReport {
                    settings: &settings,
                    status: &status,
                });
            }
            print_with(|out| write_space(out, &settings, &status))
        }
    }
}
