//! The RAIF configuration: RAIF's raiftab made readable, as TOML.
//!
//! ```toml
//! [[branch]]
//! label = "fast"
//! path = "/srv/ssd/raif"
//! [[branch]]
//! label = "big1"
//! path = "/srv/hdd1/raif"
//!
//! # Rules are tried in order; the first that matches a file decides.
//! [[rule]]
//! name = "media"
//! glob = ["*.mp3", "video/**"]     # on the path below the mount point
//! extension = ["avi", "mkv"]       # any of these, or any glob, matches
//! owner = 1000                     # uid (optional)
//! group = 100                      # gid (optional)
//! min_size = "1M"                  # files at least this big (optional)
//! level = "raif5"
//! branches = ["big1", "big2", "big3"]   # default: every branch
//! stripe_unit = "256K"                  # default: 64K
//!
//! [default]                        # what matches no rule
//! level = "raif1"
//! ```
//!
//! Every mistake is one error naming the rule (or branch) it is in.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::layout::{check_stripe_unit, STRIPE_UNIT_DEFAULT_BYTES};
use crate::level::Level;

/// Most branches one mount may have.
pub const BRANCHES_MAX: usize = crate::layout::WIDTH_MAX;
/// Longest branch label.
pub const LABEL_MAX_BYTES: usize = 64;
/// What the default rule is called in messages and in `explain`.
pub const DEFAULT_RULE_NAME: &str = "default";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("{0}")]
    Syntax(String),
    #[error("{0}")]
    Invalid(String),
}

/// One branch: a directory on any lower file system.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Branch {
    pub label: String,
    pub path: PathBuf,
}

/// A size as TOML gives it: bytes, or a string with a K/M/G/T suffix.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
enum RawSize {
    Bytes(u64),
    Text(String),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    name: Option<String>,
    #[serde(default)]
    glob: Vec<String>,
    #[serde(default)]
    extension: Vec<String>,
    owner: Option<u32>,
    group: Option<u32>,
    min_size: Option<RawSize>,
    level: String,
    branches: Option<Vec<String>>,
    stripe_unit: Option<RawSize>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    branch: Vec<Branch>,
    #[serde(default)]
    rule: Vec<RawRule>,
    default: RawRule,
}

/// A checked rule: what it matches, and the layout it gives.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub name: String,
    pub globs: Vec<glob::Pattern>,
    pub extensions: Vec<String>,
    pub owner: Option<u32>,
    pub group: Option<u32>,
    pub min_size_bytes: Option<u64>,
    pub level: Level,
    /// Indices into [`Config::branches`], in the order the rule gives them.
    pub branches: Vec<usize>,
    pub stripe_unit_bytes: u64,
}

/// What a file is, as rules see it.
#[derive(Debug, Clone, Copy)]
pub struct FileFacts<'a> {
    /// The path below the mount point, without a leading slash.
    pub path: &'a str,
    pub uid: u32,
    pub gid: u32,
    pub size_bytes: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub branches: Vec<Branch>,
    /// The ordered rules; the default rule is last.
    pub rules: Vec<Rule>,
}

fn size_of(raw: &RawSize) -> Result<u64, String> {
    match raw {
        RawSize::Bytes(n) => Ok(*n),
        RawSize::Text(text) => grove_store::units::parse_size(text)
            .map_err(|reason| format!("{text:?} is not a size: {reason}")),
    }
}

impl Config {
    /// Reads and checks a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.into(),
            message: e.to_string(),
        })?;
        Config::parse(&text).map_err(|e| match e {
            ConfigError::Syntax(m) => ConfigError::Syntax(format!("{}: {m}", path.display())),
            ConfigError::Invalid(m) => ConfigError::Invalid(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// Parses and checks a configuration.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let message = e.message().to_string();
            let line = e.span().map(|s| text[..s.start].lines().count().max(1));
            ConfigError::Syntax(match line {
                Some(line) => format!("line {line}: {message}"),
                None => message,
            })
        })?;
        Config::check(raw).map_err(ConfigError::Invalid)
    }

    /// One default rule over the given branch directories, labelled
    /// b0, b1, ...: the form without a configuration file.
    pub fn simple(
        level: Level,
        stripe_unit_bytes: u64,
        paths: &[PathBuf],
    ) -> Result<Config, ConfigError> {
        let raw = RawConfig {
            branch: paths
                .iter()
                .enumerate()
                .map(|(i, p)| Branch {
                    label: format!("b{i}"),
                    path: p.clone(),
                })
                .collect(),
            rule: vec![],
            default: RawRule {
                name: None,
                glob: vec![],
                extension: vec![],
                owner: None,
                group: None,
                min_size: None,
                level: level.to_string(),
                branches: None,
                stripe_unit: Some(RawSize::Bytes(stripe_unit_bytes)),
            },
        };
        Config::check(raw).map_err(ConfigError::Invalid)
    }

    fn check(raw: RawConfig) -> Result<Config, String> {
        check_branches(&raw.branch)?;
        let mut rules = Vec::with_capacity(raw.rule.len() + 1);
        let mut names = BTreeSet::new();
        for (index, rule) in raw.rule.iter().enumerate() {
            let name = rule
                .name
                .clone()
                .unwrap_or_else(|| format!("#{}", index + 1));
            if !names.insert(name.clone()) {
                return Err(format!("rule {name:?}: another rule has this name"));
            }
            rules.push(check_rule(rule, name, &raw.branch, false)?);
        }
        rules.push(check_rule(
            &raw.default,
            DEFAULT_RULE_NAME.into(),
            &raw.branch,
            true,
        )?);
        Ok(Config {
            branches: raw.branch,
            rules,
        })
    }

    /// The first rule that matches (the default rule matches everything).
    pub fn rule_for(&self, facts: &FileFacts) -> &Rule {
        self.rules
            .iter()
            .find(|r| r.matches(facts))
            .unwrap_or_else(|| &self.rules[self.rules.len() - 1])
    }

    /// The index of a branch by label.
    pub fn branch_index(&self, label: &str) -> Option<usize> {
        self.branches.iter().position(|b| b.label == label)
    }
}

fn check_branches(branches: &[Branch]) -> Result<(), String> {
    if branches.is_empty() {
        return Err("no branches: add [[branch]] tables with a label and a path".into());
    }
    if branches.len() > BRANCHES_MAX {
        return Err(format!(
            "{} branches; at most {BRANCHES_MAX} are allowed",
            branches.len()
        ));
    }
    let mut labels = BTreeSet::new();
    let mut paths = BTreeSet::new();
    for branch in branches {
        let label = &branch.label;
        if label.is_empty() || label.len() > LABEL_MAX_BYTES || label.contains(char::is_whitespace)
        {
            return Err(format!(
                "branch {label:?}: a label is 1 to {LABEL_MAX_BYTES} bytes without spaces"
            ));
        }
        if !labels.insert(label.clone()) {
            return Err(format!("branch {label:?}: two branches have this label"));
        }
        if !paths.insert(branch.path.clone()) {
            return Err(format!(
                "branch {label:?}: path {} is another branch's too",
                branch.path.display()
            ));
        }
    }
    Ok(())
}

fn check_rule(raw: &RawRule, name: String, all: &[Branch], default: bool) -> Result<Rule, String> {
    let fail = |what: String| format!("rule {name:?}: {what}");
    let selective = !raw.glob.is_empty()
        || !raw.extension.is_empty()
        || raw.owner.is_some()
        || raw.group.is_some()
        || raw.min_size.is_some();
    if default && selective {
        return Err(fail("the default rule matches everything: it takes no glob, extension, owner, group or min_size".into()));
    }
    let level: Level = raw.level.parse().map_err(fail)?;
    let branches: Vec<usize> = match &raw.branches {
        None => (0..all.len()).collect(),
        Some(labels) => labels
            .iter()
            .map(|label| {
                all.iter()
                    .position(|b| &b.label == label)
                    .ok_or_else(|| fail(format!("unknown branch label {label:?}")))
            })
            .collect::<Result<_, _>>()?,
    };
    if branches.iter().collect::<BTreeSet<_>>().len() != branches.len() {
        return Err(fail("a branch is listed twice".into()));
    }
    level.check_width(branches.len()).map_err(fail)?;
    let stripe_unit_bytes = match &raw.stripe_unit {
        None => STRIPE_UNIT_DEFAULT_BYTES,
        Some(size) => size_of(size).map_err(|m| fail(format!("stripe_unit: {m}")))?,
    };
    check_stripe_unit(stripe_unit_bytes).map_err(|e| fail(e.to_string()))?;
    let globs = raw
        .glob
        .iter()
        .map(|g| glob::Pattern::new(g).map_err(|e| fail(format!("glob {g:?}: {e}"))))
        .collect::<Result<_, _>>()?;
    let min_size_bytes = match &raw.min_size {
        None => None,
        Some(size) => Some(size_of(size).map_err(|m| fail(format!("min_size: {m}")))?),
    };
    Ok(Rule {
        name,
        globs,
        extensions: raw
            .extension
            .iter()
            .map(|e| e.trim_start_matches('.').to_string())
            .collect(),
        owner: raw.owner,
        group: raw.group,
        min_size_bytes,
        level,
        branches,
        stripe_unit_bytes,
    })
}

impl Rule {
    /// Whether the rule applies: a glob or an extension (if any is given),
    /// and the owner, group and size threshold (if given), all hold.
    pub fn matches(&self, facts: &FileFacts) -> bool {
        let by_name = (self.globs.is_empty() && self.extensions.is_empty())
            || self.globs.iter().any(|g| g.matches(facts.path))
            || Path::new(facts.path)
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| self.extensions.iter().any(|x| x.eq_ignore_ascii_case(e)));
        by_name
            && self.owner.is_none_or(|uid| uid == facts.uid)
            && self.group.is_none_or(|gid| gid == facts.gid)
            && self
                .min_size_bytes
                .is_none_or(|min| facts.size_bytes >= min)
    }
}
