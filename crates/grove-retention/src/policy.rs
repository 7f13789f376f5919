//! Policies: how many snapshots of each level a volume keeps, in the terms
//! sanoid and zfs-auto-snapshot users know, and where they come from: the
//! `[retention]` table of grove.toml, with templates (built-in or the
//! pool's own) that a volume's policy names and may override.
//!
//! ```toml
//! [retention.templates.vm]
//! template = "production"       # start from another template
//! daily = 14
//! frequent_period = "10m"
//!
//! [retention.volumes]
//! web = "production"            # a template as it is
//! db = { template = "vm", hourly = 48 }
//! # what the archive tier keeps (`grove archive`), beside the pool's counts
//! logs = { template = "production", archive = { daily = 30, weekly = 52, monthly = 24, yearly = 10 } }
//! ```

use std::collections::BTreeMap;

use crate::calendar::{parse_duration, MINUTE_SECS};
use crate::level::Level;

/// The frequent level's period unless a policy sets `frequent_period`.
pub const FREQUENT_PERIOD_DEFAULT_SECS: u64 = 15 * MINUTE_SECS;
/// Snapshots of a volume that pruning for space leaves, newest first,
/// unless a policy sets `minimum`.
pub const MINIMUM_DEFAULT: u32 = 1;
/// Most snapshots one level may keep: far past any real schedule, and a
/// bound on what a policy can ask the planner to hold.
pub const KEEP_MAX: u32 = 100_000;
/// How deep templates may build on one another.
const TEMPLATE_DEPTH_MAX: usize = 8;

/// Keys a policy table may hold besides the levels' names.
const OTHER_KEYS: [&str; 4] = ["template", "frequent_period", "minimum", "archive"];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct PolicyError(pub String);

fn error(message: impl Into<String>) -> PolicyError {
    PolicyError(message.into())
}

/// What a volume keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Snapshots kept at each level, by `Level::index`.
    pub keep: [u32; 6],
    /// The frequent level's period.
    pub frequent_secs: u64,
    /// Snapshots pruning for space never takes, newest first.
    pub minimum: u32,
}

impl Policy {
    pub fn keeps(&self, level: Level) -> u32 {
        self.keep[level.index()]
    }

    /// The highest level this policy keeps any snapshot of.
    pub fn top_level(&self) -> Option<Level> {
        Level::ALL.into_iter().rev().find(|&l| self.keeps(l) > 0)
    }

    /// One line: `hourly 24, daily 7, monthly 12 (frequent every 15m)`.
    pub fn describe(&self) -> String {
        let levels: Vec<String> = Level::ALL
            .into_iter()
            .filter(|&l| self.keeps(l) > 0)
            .map(|l| format!("{l} {}", self.keeps(l)))
            .collect();
        let mut text = if levels.is_empty() {
            "keeps nothing".to_string()
        } else {
            levels.join(", ")
        };
        if self.keeps(Level::Frequent) > 0 {
            text += &format!(" (frequent every {})", describe_secs(self.frequent_secs));
        }
        text
    }
}

fn describe_secs(secs: u64) -> String {
    match secs {
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// Templates every pool has, after sanoid's: `production` for servers,
/// `backup` for replicas that only receive, `frequent` for desktops and
/// CI hosts that want a short undo history.
pub fn builtin_templates() -> BTreeMap<&'static str, Policy> {
    let policy = |keep: [u32; 6]| Policy {
        keep,
        frequent_secs: FREQUENT_PERIOD_DEFAULT_SECS,
        minimum: MINIMUM_DEFAULT,
    };
    BTreeMap::from([
        ("production", policy([0, 36, 30, 0, 3, 0])),
        ("backup", policy([0, 0, 90, 0, 12, 0])),
        ("frequent", policy([4, 24, 7, 4, 12, 1])),
    ])
}

/// The `[retention]` table of grove.toml: templates and volumes' policies
/// as written (a template name or a table), resolved on demand.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RetentionConfig {
    pub templates: BTreeMap<String, toml::Value>,
    pub volumes: BTreeMap<String, toml::Value>,
}

impl RetentionConfig {
    /// Reads and checks the table: every template and volume policy must
    /// resolve, so that a mistake is reported when it is made.
    pub fn from_table(table: Option<&toml::Table>) -> Result<RetentionConfig, PolicyError> {
        let Some(table) = table else {
            return Ok(RetentionConfig::default());
        };
        let mut config = RetentionConfig::default();
        for (key, value) in table {
            let section = match key.as_str() {
                "templates" => &mut config.templates,
                "volumes" => &mut config.volumes,
                other => {
                    return Err(error(format!(
                        "grove.toml: unknown key retention.{other} (known: templates, volumes)"
                    )))
                }
            };
            let entries = value
                .as_table()
                .ok_or_else(|| error(format!("grove.toml: retention.{key} must be a table")))?;
            section.extend(entries.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        for name in config.templates.keys() {
            config
                .template(name)
                .map_err(|e| error(format!("grove.toml: template {name:?}: {e}")))?;
        }
        for volume in config.volumes.keys() {
            config
                .policy_for(volume)
                .map_err(|e| error(format!("grove.toml: the policy of {volume:?}: {e}")))?;
        }
        Ok(config)
    }

    /// The table to write back into grove.toml; None when empty.
    pub fn to_table(&self) -> Option<toml::Table> {
        let mut table = toml::Table::new();
        for (key, section) in [("templates", &self.templates), ("volumes", &self.volumes)] {
            if !section.is_empty() {
                let entries: toml::Table = section
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                table.insert(key.to_string(), toml::Value::Table(entries));
            }
        }
        (!table.is_empty()).then_some(table)
    }

    /// Gives `volume` the policy `spec` (see `spec`), replacing its own.
    pub fn set_volume_policy(&mut self, volume: &str, spec: toml::Value) {
        self.volumes.insert(volume.to_string(), spec);
    }

    /// Takes `volume`'s policy away; false if it had none.
    pub fn unset_volume_policy(&mut self, volume: &str) -> bool {
        self.volumes.remove(volume).is_some()
    }

    /// The policy of `volume`, if it has one.
    pub fn policy_for(&self, volume: &str) -> Result<Option<Policy>, PolicyError> {
        match self.volumes.get(volume) {
            None => Ok(None),
            Some(spec) => self.resolve(spec, 0).map(Some),
        }
    }

    /// What the archive tier keeps of `volume`: its policy's `archive`
    /// counts (from its table or a template it builds on), with the
    /// pool policy's frequent period. None when it has none.
    pub fn archive_policy_for(&self, volume: &str) -> Result<Option<Policy>, PolicyError> {
        let Some(policy) = self.policy_for(volume)? else {
            return Ok(None);
        };
        let mut spec = self.volumes.get(volume);
        for _ in 0..=TEMPLATE_DEPTH_MAX {
            let Some(table) = spec.and_then(toml::Value::as_table) else {
                // A template's name: look inside that template.
                spec = spec
                    .and_then(toml::Value::as_str)
                    .and_then(|name| self.templates.get(name));
                if spec.is_none() {
                    return Ok(None);
                }
                continue;
            };
            if let Some(archive) = table.get("archive") {
                let keep = archive_counts(archive)?;
                return Ok(Some(Policy {
                    keep,
                    frequent_secs: policy.frequent_secs,
                    minimum: 0,
                }));
            }
            spec = table
                .get("template")
                .and_then(toml::Value::as_str)
                .and_then(|name| self.templates.get(name));
        }
        Ok(None)
    }

    /// Template `name`: the pool's own, else a built-in one.
    pub fn template(&self, name: &str) -> Result<Policy, PolicyError> {
        self.template_at(name, 0)
    }

    /// Every template's name, the pool's and the built-in ones.
    pub fn template_names(&self) -> Vec<String> {
        let mut names: Vec<String> = builtin_templates()
            .keys()
            .map(|n| n.to_string())
            .chain(self.templates.keys().cloned())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    fn template_at(&self, name: &str, depth: usize) -> Result<Policy, PolicyError> {
        if depth > TEMPLATE_DEPTH_MAX {
            return Err(error(format!(
                "templates build on each other more than {TEMPLATE_DEPTH_MAX} deep (a loop through {name:?}?)"
            )));
        }
        if let Some(spec) = self.templates.get(name) {
            return self.resolve(spec, depth + 1);
        }
        builtin_templates().remove(name).ok_or_else(|| {
            error(format!(
                "no template named {name:?} (there are {})",
                self.template_names().join(", ")
            ))
        })
    }

    /// A policy as written: a template's name, or a table of counts that
    /// may start from a template.
    fn resolve(&self, spec: &toml::Value, depth: usize) -> Result<Policy, PolicyError> {
        match spec {
            toml::Value::String(name) => self.template_at(name, depth),
            toml::Value::Table(table) => self.resolve_table(table, depth),
            other => Err(error(format!(
                "a policy is a template's name or a table, not {}",
                other.type_str()
            ))),
        }
    }

    fn resolve_table(&self, table: &toml::Table, depth: usize) -> Result<Policy, PolicyError> {
        let mut policy = match table.get("template") {
            Some(toml::Value::String(name)) => self.template_at(name, depth)?,
            Some(_) => return Err(error("template must be a template's name")),
            None => Policy {
                keep: [0; 6],
                frequent_secs: FREQUENT_PERIOD_DEFAULT_SECS,
                minimum: MINIMUM_DEFAULT,
            },
        };
        for (key, value) in table {
            if let Some(level) = Level::from_name(key) {
                policy.keep[level.index()] = count(key, value)?;
                continue;
            }
            match key.as_str() {
                "template" => {}
                "archive" => {
                    archive_counts(value)?;
                }
                "minimum" => policy.minimum = count(key, value)?,
                "frequent_period" => {
                    let text = value.as_str().ok_or_else(|| {
                        error("frequent_period must be a duration such as \"15m\"")
                    })?;
                    policy.frequent_secs = parse_duration(text).map_err(error)?;
                    if policy.frequent_secs < MINUTE_SECS {
                        return Err(error("frequent_period must be at least 1m"));
                    }
                }
                other => {
                    let known: Vec<&str> = Level::ALL
                        .iter()
                        .map(|l| l.name())
                        .chain(OTHER_KEYS)
                        .collect();
                    return Err(error(format!(
                        "unknown key {other:?} (known: {})",
                        known.join(", ")
                    )));
                }
            }
        }
        Ok(policy)
    }
}

/// A policy as grove.toml writes it: just the template's name when
/// nothing overrides it, else a table.
pub fn spec(
    template: Option<&str>,
    counts: &[(Level, u32)],
    frequent_period: Option<&str>,
    minimum: Option<u32>,
) -> toml::Value {
    if let (Some(name), true, None, None) = (template, counts.is_empty(), frequent_period, minimum)
    {
        return toml::Value::String(name.to_string());
    }
    let mut table = toml::Table::new();
    if let Some(name) = template {
        table.insert("template".into(), toml::Value::String(name.to_string()));
    }
    for (level, count) in counts {
        table.insert(level.name().into(), toml::Value::Integer(i64::from(*count)));
    }
    if let Some(period) = frequent_period {
        table.insert(
            "frequent_period".into(),
            toml::Value::String(period.to_string()),
        );
    }
    if let Some(minimum) = minimum {
        table.insert("minimum".into(), toml::Value::Integer(i64::from(minimum)));
    }
    toml::Value::Table(table)
}

fn count(key: &str, value: &toml::Value) -> Result<u32, PolicyError> {
    value
        .as_integer()
        .and_then(|n| u32::try_from(n).ok())
        .filter(|&n| n <= KEEP_MAX)
        .ok_or_else(|| error(format!("{key} must be a whole number from 0 to {KEEP_MAX}")))
}

/// The archive's counts: a table of level names to counts.
fn archive_counts(value: &toml::Value) -> Result<[u32; 6], PolicyError> {
    let table = value.as_table().ok_or_else(|| {
        error("archive must be a table of counts, such as { daily = 30, monthly = 24 }")
    })?;
    let mut keep = [0; 6];
    for (key, value) in table {
        let level = Level::from_name(key).ok_or_else(|| {
            let names: Vec<&str> = Level::ALL.iter().map(|l| l.name()).collect();
            error(format!(
                "unknown key archive.{key} (known: {})",
                names.join(", ")
            ))
        })?;
        keep[level.index()] = count(&format!("archive.{key}"), value)?;
    }
    Ok(keep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_counts_sit_beside_the_pools_and_come_through_templates() {
        let c = config(
            r#"
            [retention.templates.long]
            daily = 7
            archive = { daily = 30, yearly = 10 }
            [retention.volumes]
            web = "long"
            db = { template = "long", hourly = 48 }
            logs = { daily = 3, archive = { monthly = 24 } }
            plain = { daily = 3 }
            "#,
        )
        .unwrap();
        let web = c.archive_policy_for("web").unwrap().unwrap();
        assert_eq!(web.keep, [0, 0, 30, 0, 0, 10]);
        assert_eq!(c.archive_policy_for("db").unwrap().unwrap().keep, web.keep);
        assert_eq!(
            c.archive_policy_for("logs").unwrap().unwrap().keep,
            [0, 0, 0, 0, 24, 0]
        );
        assert_eq!(c.archive_policy_for("plain").unwrap(), None);
        assert_eq!(c.archive_policy_for("none").unwrap(), None);
        assert_eq!(
            c.policy_for("logs").unwrap().unwrap().keep,
            [0, 0, 3, 0, 0, 0]
        );
        let bad = config("[retention.volumes]\nx = { archive = { dayly = 3 } }").unwrap_err();
        assert!(bad.0.contains("archive.dayly"), "{bad}");
        let bad = config("[retention.volumes]\nx = { archive = 3 }").unwrap_err();
        assert!(bad.0.contains("archive must be a table"), "{bad}");
    }

    fn config(text: &str) -> Result<RetentionConfig, PolicyError> {
        let table: toml::Table = toml::from_str(text).unwrap();
        RetentionConfig::from_table(table.get("retention").and_then(|v| v.as_table()))
    }

    #[test]
    fn volumes_name_templates_and_override_them() {
        let c = config(
            r#"
            [retention.templates.vm]
            template = "production"
            daily = 14
            frequent_period = "10m"
            [retention.volumes]
            web = "production"
            db = { template = "vm", hourly = 48, minimum = 3 }
            ci = { frequent = 8 }
            "#,
        )
        .unwrap();
        let web = c.policy_for("web").unwrap().unwrap();
        assert_eq!(web, builtin_templates()["production"]);
        let db = c.policy_for("db").unwrap().unwrap();
        assert_eq!(db.keep, [0, 48, 14, 0, 3, 0]);
        assert_eq!((db.frequent_secs, db.minimum), (600, 3));
        assert_eq!(
            c.policy_for("ci").unwrap().unwrap().keep,
            [8, 0, 0, 0, 0, 0]
        );
        assert_eq!(c.policy_for("other").unwrap(), None);
        assert_eq!(db.describe(), "hourly 48, daily 14, monthly 3");
        // Written back and read again, it is the same.
        let mut outer = toml::Table::new();
        outer.insert(
            "retention".into(),
            toml::Value::Table(c.to_table().unwrap()),
        );
        assert_eq!(config(&toml::to_string(&outer).unwrap()).unwrap(), c);
    }

    #[test]
    fn mistakes_are_named() {
        let e = config("[retention.volumes]\nweb = \"prod\"").unwrap_err();
        assert!(e.0.contains("no template named \"prod\""), "{e}");
        let e = config("[retention.volumes]\nweb = { dayly = 3 }").unwrap_err();
        assert!(e.0.contains("unknown key \"dayly\""), "{e}");
        let e = config("[retention.volumes]\nweb = { daily = -1 }").unwrap_err();
        assert!(e.0.contains("daily must be a whole number"), "{e}");
        let e = config(
            "[retention.templates.a]\ntemplate = \"b\"\n[retention.templates.b]\ntemplate = \"a\"",
        )
        .unwrap_err();
        assert!(e.0.contains("more than"), "{e}");
        let e = config("[retention.schedule]\nx = 1").unwrap_err();
        assert!(e.0.contains("unknown key retention.schedule"), "{e}");
        let e = config("[retention.volumes]\nweb = { frequent_period = \"5s\" }").unwrap_err();
        assert!(e.0.contains("at least 1m"), "{e}");
    }
}
