//! The `[space]` table of grove.toml: how the pool watches and grows its
//! space (ESnap's thresholds and auto-extension, in LVM thin pools' terms).
//!
//! ```toml
//! [space]
//! auto_extend = true        # grow the capacity by steps when use passes extend_at
//! max_capacity = "200G"     # largest the capacity may grow to; absent: the host's room
//! extend_at = "80%"         # of the current capacity
//! extend_step = "20%"       # of the current capacity (at least 64M), or a size
//! host_reserve = "1G"       # host free space the capacity never grows into
//! warn = "80%"              # of the ceiling: log a warning, run the hook
//! prune = "90%"             # of the ceiling: prune snapshots, run the hook
//! hook = "/usr/local/bin/pool-alert"   # run by `sh -c` on every level change
//! hook_timeout_secs = 10
//! ```
//!
//! The file holds text (`SpaceConfig`, what the user wrote); the pool
//! works with the checked values (`SpaceSettings`). Every refusal is one
//! line naming the key and the reason.

use serde::{Deserialize, Serialize};

/// The capacity `grove init` gives a pool unless told (auto-extension
/// grows it from there).
pub const CAPACITY_INITIAL_DEFAULT_BYTES: u64 = 1 << 30;
/// Default for `extend_at`: LVM's usual autoextend threshold.
pub const EXTEND_AT_DEFAULT_PERCENT: u8 = 80;
/// Default for `extend_step`: LVM's usual autoextend percent.
pub const EXTEND_STEP_DEFAULT_PERCENT: u8 = 20;
/// A step given as a percentage is never smaller than this, so that a
/// small pool does not extend (and checkpoint) every few megabytes.
pub const EXTEND_STEP_MIN_BYTES: u64 = 64 << 20;
/// Default for `host_reserve`: room left to the host's other users.
pub const HOST_RESERVE_DEFAULT_BYTES: u64 = 1 << 30;
/// Default warning level, as a percentage of the ceiling.
pub const WARN_DEFAULT_PERCENT: u8 = 80;
/// Default pruning level, as a percentage of the ceiling.
pub const PRUNE_DEFAULT_PERCENT: u8 = 90;
/// Default time a hook may run before it is killed.
pub const HOOK_TIMEOUT_DEFAULT_SECS: u64 = 10;
/// Longest time a hook may be given.
pub const HOOK_TIMEOUT_MAX_SECS: u64 = 3600;
/// Longest hook command line.
pub const HOOK_COMMAND_MAX_BYTES: usize = 4096;
/// Every key the `[space]` table may hold.
pub const SPACE_KEYS: [&str; 9] = [
    "auto_extend",
    "max_capacity",
    "extend_at",
    "extend_step",
    "host_reserve",
    "warn",
    "prune",
    "hook",
    "hook_timeout_secs",
];

/// A share of something ("20%") or a size in bytes ("1G").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Amount {
    Percent(u8),
    Bytes(u64),
}

impl Amount {
    /// The amount as bytes, a percentage being of `whole_bytes`.
    pub fn of(self, whole_bytes: u64) -> u64 {
        match self {
            Amount::Percent(p) => percent_of(whole_bytes, p),
            Amount::Bytes(b) => b,
        }
    }

    fn text(self) -> String {
        match self {
            Amount::Percent(p) => format!("{p}%"),
            Amount::Bytes(b) => size_text(b),
        }
    }
}

/// `percent`% of `whole_bytes`, rounded down, without overflow.
pub fn percent_of(whole_bytes: u64, percent: u8) -> u64 {
    (u128::from(whole_bytes) * u128::from(percent) / 100) as u64
}

/// The checked space settings of a pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpaceSettings {
    pub auto_extend: bool,
    pub max_capacity_bytes: Option<u64>,
    pub extend_at_percent: u8,
    pub extend_step: Amount,
    pub host_reserve: Amount,
    pub warn_percent: u8,
    pub prune_percent: u8,
    pub hook: Option<String>,
    pub hook_timeout_secs: u64,
}

impl Default for SpaceSettings {
    fn default() -> Self {
        SpaceSettings {
            auto_extend: true,
            max_capacity_bytes: None,
            extend_at_percent: EXTEND_AT_DEFAULT_PERCENT,
            extend_step: Amount::Percent(EXTEND_STEP_DEFAULT_PERCENT),
            host_reserve: Amount::Bytes(HOST_RESERVE_DEFAULT_BYTES),
            warn_percent: WARN_DEFAULT_PERCENT,
            prune_percent: PRUNE_DEFAULT_PERCENT,
            hook: None,
            hook_timeout_secs: HOOK_TIMEOUT_DEFAULT_SECS,
        }
    }
}

/// The `[space]` table as written in grove.toml; absent keys take the
/// defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpaceConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_extend: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_capacity: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extend_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extend_step: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_reserve: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prune: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook_timeout_secs: Option<u64>,
}

impl SpaceConfig {
    /// The settings this table asks for, or the first bad key and why, as
    /// "space.warn \"120%\" is not a percentage from 1% to 100%".
    pub fn settings(&self) -> Result<SpaceSettings, String> {
        let d = SpaceSettings::default();
        let settings = SpaceSettings {
            auto_extend: self.auto_extend.unwrap_or(d.auto_extend),
            max_capacity_bytes: match &self.max_capacity {
                None => None,
                Some(text) if text == "none" => None,
                Some(text) => Some(parse_positive_size("max_capacity", text)?),
            },
            extend_at_percent: parse_or("extend_at", &self.extend_at, parse_level)?
                .unwrap_or(d.extend_at_percent),
            extend_step: parse_or("extend_step", &self.extend_step, parse_step)?
                .unwrap_or(d.extend_step),
            host_reserve: parse_or("host_reserve", &self.host_reserve, parse_reserve)?
                .unwrap_or(d.host_reserve),
            warn_percent: parse_or("warn", &self.warn, parse_level)?.unwrap_or(d.warn_percent),
            prune_percent: parse_or("prune", &self.prune, parse_level)?.unwrap_or(d.prune_percent),
            hook: self.hook.clone().filter(|hook| !hook.trim().is_empty()),
            hook_timeout_secs: self.hook_timeout_secs.unwrap_or(d.hook_timeout_secs),
        };
        settings.check()?;
        Ok(settings)
    }

    /// The table that says exactly `settings`, leaving defaults out.
    pub fn from_settings(settings: &SpaceSettings) -> SpaceConfig {
        let d = SpaceSettings::default();
        let differs = |same: bool, text: String| (!same).then_some(text);
        SpaceConfig {
            auto_extend: (settings.auto_extend != d.auto_extend).then_some(settings.auto_extend),
            max_capacity: settings.max_capacity_bytes.map(size_text),
            extend_at: differs(
                settings.extend_at_percent == d.extend_at_percent,
                format!("{}%", settings.extend_at_percent),
            ),
            extend_step: differs(
                settings.extend_step == d.extend_step,
                settings.extend_step.text(),
            ),
            host_reserve: differs(
                settings.host_reserve == d.host_reserve,
                settings.host_reserve.text(),
            ),
            warn: differs(
                settings.warn_percent == d.warn_percent,
                format!("{}%", settings.warn_percent),
            ),
            prune: differs(
                settings.prune_percent == d.prune_percent,
                format!("{}%", settings.prune_percent),
            ),
            hook: settings.hook.clone(),
            hook_timeout_secs: (settings.hook_timeout_secs != d.hook_timeout_secs)
                .then_some(settings.hook_timeout_secs),
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == SpaceConfig::default()
    }
}

impl SpaceSettings {
    /// Checks what no single key shows: the levels' order and the limits.
    pub fn check(&self) -> Result<(), String> {
        if self.warn_percent > self.prune_percent {
            return Err(format!(
                "space.warn {}% is above space.prune {}%: the warning must come first",
                self.warn_percent, self.prune_percent
            ));
        }
        if self.hook_timeout_secs == 0 || self.hook_timeout_secs > HOOK_TIMEOUT_MAX_SECS {
            return Err(format!(
                "space.hook_timeout_secs {} is not from 1 to {HOOK_TIMEOUT_MAX_SECS}",
                self.hook_timeout_secs
            ));
        }
        if let Some(hook) = &self.hook {
            if hook.len() > HOOK_COMMAND_MAX_BYTES || hook.contains('\0') {
                return Err(format!(
                    "space.hook is longer than {HOOK_COMMAND_MAX_BYTES} bytes or holds a NUL byte"
                ));
            }
        }
        Ok(())
    }
}

fn parse_or<T>(
    key: &str,
    text: &Option<String>,
    parse: fn(&str, &str) -> Result<T, String>,
) -> Result<Option<T>, String> {
    text.as_deref().map(|t| parse(key, t)).transpose()
}

/// "80%": a level from 1% to 100%.
fn parse_level(key: &str, text: &str) -> Result<u8, String> {
    parse_percent(text)
        .filter(|p| (1..=100).contains(p))
        .ok_or_else(|| format!("space.{key} {text:?} is not a percentage from 1% to 100%"))
}

/// "20%" of the capacity, or a positive size.
fn parse_step(key: &str, text: &str) -> Result<Amount, String> {
    if text.trim_end().ends_with('%') {
        return parse_level(key, text).map(Amount::Percent);
    }
    parse_positive_size(key, text).map(Amount::Bytes)
}

/// "5%" of the host file system, or a size; 0 is allowed.
fn parse_reserve(key: &str, text: &str) -> Result<Amount, String> {
    if text.trim_end().ends_with('%') {
        return parse_percent(text)
            .filter(|p| *p < 100)
            .map(Amount::Percent)
            .ok_or_else(|| format!("space.{key} {text:?} is not a percentage from 0% to 99%"));
    }
    crate::units::parse_size(text)
        .ok()
        .map(Amount::Bytes)
        .ok_or_else(|| {
            format!("space.{key} {text:?} is not a size like \"1G\" or a percentage like \"5%\"")
        })
}

fn parse_positive_size(key: &str, text: &str) -> Result<u64, String> {
    match crate::units::parse_size(text).ok() {
        Some(0) => Err(format!("space.{key} {text:?} must be more than 0")),
        Some(bytes) => Ok(bytes),
        None => Err(format!(
            "space.{key} {text:?} is not a size: write it like \"200G\""
        )),
    }
}

fn parse_percent(text: &str) -> Option<u8> {
    text.trim().strip_suffix('%')?.trim().parse().ok()
}

/// A size as grove.toml writes it: the largest unit that divides it.
pub fn size_text(bytes: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if bytes != 0 && bytes.is_multiple_of(1u64 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pairs: &[(&str, &str)]) -> SpaceConfig {
        let text: String = pairs.iter().map(|(k, v)| format!("{k} = {v}\n")).collect();
        toml::from_str(&text).unwrap()
    }

    #[test]
    fn an_empty_table_gives_the_defaults_and_round_trips() {
        assert_eq!(
            SpaceConfig::default().settings().unwrap(),
            SpaceSettings::default()
        );
        assert!(SpaceConfig::from_settings(&SpaceSettings::default()).is_empty());
        let table = config(&[
            ("max_capacity", "\"200G\""),
            ("extend_step", "\"1G\""),
            ("host_reserve", "\"5%\""),
            ("warn", "\"70%\""),
            ("prune", "\"95%\""),
            ("auto_extend", "false"),
            ("hook", "\"logger full\""),
            ("hook_timeout_secs", "3"),
        ]);
        let settings = table.settings().unwrap();
        assert_eq!(settings.max_capacity_bytes, Some(200 << 30));
        assert_eq!(settings.extend_step, Amount::Bytes(1 << 30));
        assert_eq!(settings.host_reserve, Amount::Percent(5));
        assert_eq!((settings.warn_percent, settings.prune_percent), (70, 95));
        assert!(!settings.auto_extend);
        assert_eq!(SpaceConfig::from_settings(&settings), table);
    }

    #[test]
    fn bad_values_are_refused_naming_the_key() {
        let refused = |pairs: &[(&str, &str)]| config(pairs).settings().unwrap_err();
        assert_eq!(
            refused(&[("warn", "\"120%\"")]),
            "space.warn \"120%\" is not a percentage from 1% to 100%"
        );
        assert!(refused(&[("prune", "\"x\"")]).starts_with("space.prune \"x\""));
        assert!(refused(&[("max_capacity", "\"0\"")]).contains("more than 0"));
        assert!(refused(&[("max_capacity", "\"lots\"")]).starts_with("space.max_capacity"));
        assert!(refused(&[("extend_step", "\"0%\"")]).starts_with("space.extend_step"));
        assert!(refused(&[("host_reserve", "\"100%\"")]).starts_with("space.host_reserve"));
        assert!(refused(&[("warn", "\"95%\""), ("prune", "\"90%\"")]).contains("above space.prune"));
        assert!(refused(&[("hook_timeout_secs", "0")]).starts_with("space.hook_timeout_secs"));
    }

    #[test]
    fn amounts_and_sizes() {
        assert_eq!(Amount::Percent(20).of(1000), 200);
        assert_eq!(Amount::Bytes(7).of(1000), 7);
        assert_eq!(percent_of(u64::MAX, 100), u64::MAX);
        assert_eq!(size_text(3 << 30), "3G");
        assert_eq!(size_text(1536 << 10), "1536K");
        assert_eq!(size_text(1000), "1000");
    }
}
