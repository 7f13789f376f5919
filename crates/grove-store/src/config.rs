//! `grove.toml`: the file that makes a directory a pool. The store's
//! superblock is the authority on the format; this file names the store and
//! holds settings that later features add.

use crate::error::{Error, ErrorKind, Result};
use crate::format::FORMAT_VERSION;
use crate::space_settings::{SpaceConfig, SpaceSettings, SPACE_KEYS};
use crate::units::parse_size;
use std::path::Path;

/// Name of the configuration file inside a pool directory.
pub const CONFIG_FILE_NAME: &str = "grove.toml";
/// Name of the store file that `grove init` creates.
pub const STORE_FILE_NAME: &str = "grove.store";

/// Every key grove.toml may hold: the fields of `PoolConfig`. Any other
/// key is refused by name, so that a misspelt setting (`cache-size`) is
/// not silently ignored.
const CONFIG_KEYS: [&str; 8] = [
    "format_version",
    "store",
    "cache_size",
    "space",
    "retention",
    "branches",
    "archive",
    "rados",
];

/// Most single-character edits between an unknown key and a known one for
/// the known one to be suggested: `cache-size`, `cachesize`, `cache_sise`.
const KEY_SUGGESTION_EDITS_MAX: usize = 2;

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// On-disk format of the pool; a newer one is refused.
    pub format_version: u32,
    /// The store file, relative to the pool directory.
    pub store: String,
    /// Bytes of decoded metadata the cache keeps, as "256M" (K, M, G, T
    /// are powers of 1024); absent means CACHE_SIZE_DEFAULT_BYTES.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_size: Option<String>,
    /// Retention policies and templates: grove-retention reads and checks
    /// them; the engine only keeps the table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<toml::Table>,
    /// How the pool watches and grows its space (`space_settings.rs`);
    /// absent means every default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub space: Option<SpaceConfig>,
    /// A store laid out over branch directories: grove-raif reads and
    /// checks the table and builds the device; the engine only keeps it,
    /// and `Pool::open` refuses a pool that has it (the engine cannot
    /// build that device itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branches: Option<toml::Table>,
    /// Where the archive tier lives and how much of it reads cache
    /// (`grove archive`): the binary reads and checks the table; the
    /// engine only keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive: Option<toml::Table>,
    /// A store in RADOS objects, as `rados://CEPHPOOL/NAME`: the grove
    /// binary opens it with grove-rados; the engine only keeps it, and
    /// `Pool::open` refuses a pool that has it, as it does `branches`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rados: Option<String>,
}

impl PoolConfig {
    pub fn new() -> PoolConfig {
        PoolConfig {
            format_version: FORMAT_VERSION,
            store: STORE_FILE_NAME.to_string(),
            cache_size: None,
            retention: None,
            space: None,
            branches: None,
            archive: None,
            rados: None,
        }
    }

    /// The cache size this configuration asks for, in bytes.
    pub fn cache_size_bytes(&self) -> Option<u64> {
        self.cache_size
            .as_deref()
            .and_then(|text| parse_size(text).ok())
    }

    /// The space settings this configuration asks for (checked at load).
    pub fn space_settings(&self) -> SpaceSettings {
        self.space
            .as_ref()
            .and_then(|space| space.settings().ok())
            .unwrap_or_default()
    }

    /// Replaces the `[space]` table (left out when all are defaults).
    pub fn set_space_settings(&mut self, settings: &SpaceSettings) {
        let table = SpaceConfig::from_settings(settings);
        self.space = (!table.is_empty()).then_some(table);
    }

    /// Writes `DIR/grove.toml` atomically: a temporary file, synced, then
    /// renamed over it, so a crash leaves the old file or the new one.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let path = dir.join(CONFIG_FILE_NAME);
        let temp = dir.join(format!("{CONFIG_FILE_NAME}.tmp"));
        std::fs::write(&temp, self.to_toml())
            .and_then(|()| std::fs::File::open(&temp)?.sync_all())
            .and_then(|()| std::fs::rename(&temp, &path))
            .and_then(|()| std::fs::File::open(dir)?.sync_all())
            .map_err(|e| Error::io(format!("cannot write {}", path.display()), e))
    }

    pub fn to_toml(&self) -> String {
        let body = toml::to_string(self).expect("a PoolConfig always serializes");
        format!("# grove pool configuration (see docs/design.md)\n{body}")
    }

    /// Reads and validates `DIR/grove.toml`.
    pub fn load(dir: &Path) -> Result<PoolConfig> {
        let path = dir.join(CONFIG_FILE_NAME);
        let text = read_config_text(dir, &path)?;
        let bad = |why: String| {
            Error::new(
                ErrorKind::NotAPool,
                format!(
                    "{} is not a valid pool configuration: {why}",
                    path.display()
                ),
            )
        };
        // The version is read on its own first, so that a newer pool gets
        // "upgrade grove" even if the rest of its configuration is unknown.
        #[derive(serde::Deserialize)]
        struct VersionOnly {
            format_version: Option<u32>,
        }
        let version: VersionOnly =
            toml::from_str(&text).map_err(|e| bad(one_line(&e.to_string())))?;
        let Some(version) = version.format_version else {
            return Err(bad("format_version is missing".into()));
        };
        check_format_version(dir, version)?;
        check_keys(&text).map_err(bad)?;
        let config: PoolConfig =
            toml::from_str(&text).map_err(|e| bad(one_line(&e.to_string())))?;
        if config.store.is_empty()
            || config.store.contains('/')
            || config.store == "."
            || config.store == ".."
        {
            return Err(bad(format!(
                "store {:?} must be a file name inside the pool directory",
                config.store
            )));
        }
        if let Some(space) = &config.space {
            space.settings().map_err(bad)?;
        }
        if let Some(text) = &config.cache_size {
            if parse_size(text).is_err() {
                return Err(bad(format!(
                    "cache_size {text:?} is not a size: write it like \"256M\" or \"1G\""
                )));
            }
        }
        Ok(config)
    }
}

/// Refuses the first key that is not a setting grove knows, naming it and
/// the known key it is closest to, if one is close.
fn check_keys(text: &str) -> std::result::Result<(), String> {
    let table: toml::Table = toml::from_str(text).map_err(|e| one_line(&e.to_string()))?;
    check_table_keys(&table, &CONFIG_KEYS, "")?;
    match table.get("space") {
        None => Ok(()),
        Some(toml::Value::Table(space)) => check_table_keys(space, &SPACE_KEYS, "space."),
        Some(_) => Err("space must be a table ([space])".into()),
    }
}

/// Refuses the first key of `table` not in `known`, with the nearest
/// known one if one is close; `prefix` names the table ("space.").
fn check_table_keys(
    table: &toml::Table,
    known: &[&str],
    prefix: &str,
) -> std::result::Result<(), String> {
    let Some(key) = table.keys().find(|k| !known.contains(&k.as_str())) else {
        return Ok(());
    };
    let nearest = known
        .iter()
        .map(|known| (edit_distance(key, known), known))
        .min()
        .filter(|(edits, _)| *edits <= KEY_SUGGESTION_EDITS_MAX);
    Err(match nearest {
        Some((_, near)) => {
            format!("unknown setting \"{prefix}{key}\" (did you mean {prefix}{near}?)")
        }
        None => format!(
            "unknown setting \"{prefix}{key}\" (known settings: {})",
            known.join(", ")
        ),
    })
}

/// Single-character insertions, deletions and substitutions from `a` to
/// `b` (Levenshtein), on the short keys of a config file.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(ca != cb);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

/// The text of a pool's grove.toml, or why `dir` is no pool.
fn read_config_text(dir: &Path, path: &Path) -> Result<String> {
    if !dir.exists() {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!(
                "pool {} does not exist; create it with `grove init`",
                dir.display()
            ),
        ));
    }
    if !dir.is_dir() {
        return Err(Error::new(
            ErrorKind::NotAPool,
            format!(
                "{} is not a directory, so it cannot be a grove pool",
                dir.display()
            ),
        ));
    }
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::new(
            ErrorKind::NotAPool,
            format!(
                "{} is not a grove pool (it has no {CONFIG_FILE_NAME}); create one with `grove init`",
                dir.display()
            ),
        )),
        Err(e) => Err(Error::io(format!("cannot read {}", path.display()), e)),
    }
}

/// Refuses a pool of another format version, saying what to do about it.
fn check_format_version(dir: &Path, version: u32) -> Result<()> {
    if version > FORMAT_VERSION {
        return Err(Error::new(
            ErrorKind::UnsupportedVersion,
            format!(
                "pool {} uses format version {version}, but this grove supports up to version {FORMAT_VERSION}; upgrade grove to open it",
                dir.display()
            ),
        ));
    }
    if version < FORMAT_VERSION {
        return Err(Error::new(
            ErrorKind::UnsupportedVersion,
            format!(
                "pool {} uses format version {version}, which this grove no longer opens (it writes version {FORMAT_VERSION}); export its volumes with the grove that made it (`grove export NAME FILE`) and import them into a new pool (`grove init`, then `grove import NAME FILE`)",
                dir.display()
            ),
        ));
    }
    Ok(())
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig::new()
    }
}

/// toml's errors span several lines with a source excerpt; grove's errors are one line.
fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::{check_keys, edit_distance};

    #[test]
    fn unknown_keys_are_named_with_the_nearest_known_one() {
        assert_eq!(edit_distance("cache-size", "cache_size"), 1);
        assert_eq!(edit_distance("", "store"), 5);
        assert_eq!(edit_distance("stroe", "store"), 2);
        let known = "format_version = 2\nstore = \"grove.store\"\ncache_size = \"1G\"\n";
        assert_eq!(check_keys(known), Ok(()));
        let misspelt = check_keys("format_version = 2\ncache-size = \"1G\"\n").unwrap_err();
        assert_eq!(
            misspelt,
            "unknown setting \"cache-size\" (did you mean cache_size?)"
        );
        let unknown = check_keys("format_version = 2\ncompression = true\n").unwrap_err();
        assert!(
            unknown.contains(
                "\"compression\" (known settings: format_version, store, cache_size, space, retention, branches, archive, rados)"
            ),
            "{unknown}"
        );
        let nested = check_keys("format_version = 2\n[space]\nwarm = \"80%\"\n").unwrap_err();
        assert_eq!(
            nested,
            "unknown setting \"space.warm\" (did you mean space.warn?)"
        );
        let not_table = check_keys("format_version = 2\nspace = 3\n").unwrap_err();
        assert_eq!(not_table, "space must be a table ([space])");
    }
}
