//! The space settings and where the pool stands, as `grove info` and
//! `grove space show|set` print them.

use std::io::{self, Write};

use grove_store::{SpaceSettings, SpaceStatus};

use super::format_size;

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
