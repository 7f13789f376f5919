//! `grove.toml`: the file that makes a directory a pool. The store's
//! superblock is the authority on the format; this file names the store and
//! holds settings that later features add.

use crate::error::{Error, ErrorKind, Result};
use crate::format::FORMAT_VERSION;
use std::path::Path;

/// Name of the configuration file inside a pool directory.
pub const CONFIG_FILE_NAME: &str = "grove.toml";
/// Name of the store file that `grove init` creates.
pub const STORE_FILE_NAME: &str = "grove.store";

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolConfig {
    /// On-disk format of the pool; a newer one is refused.
    pub format_version: u32,
    /// The store file, relative to the pool directory.
    pub store: String,
}

impl PoolConfig {
    pub fn new() -> PoolConfig {
        PoolConfig {
            format_version: FORMAT_VERSION,
            store: STORE_FILE_NAME.to_string(),
        }
    }

    pub fn to_toml(&self) -> String {
        let body = toml::to_string(self).expect("a PoolConfig always serializes");
        format!("# grove pool configuration (see docs/design.md)\n{body}")
    }

    /// Reads and validates `DIR/grove.toml`.
    pub fn load(dir: &Path) -> Result<PoolConfig> {
        let path = dir.join(CONFIG_FILE_NAME);
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
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::new(
                    ErrorKind::NotAPool,
                    format!(
                        "{} is not a grove pool (it has no {CONFIG_FILE_NAME}); create one with `grove init`",
                        dir.display()
                    ),
                ))
            }
            Err(e) => return Err(Error::io(format!("cannot read {}", path.display()), e)),
        };
        // The version is read on its own first, so that a newer pool gets
        // "upgrade grove" even if the rest of its configuration is unknown.
        #[derive(serde::Deserialize)]
        struct VersionOnly {
            format_version: Option<u32>,
        }
        let bad = |why: String| {
            Error::new(
                ErrorKind::NotAPool,
                format!(
                    "{} is not a valid pool configuration: {why}",
                    path.display()
                ),
            )
        };
        let version: VersionOnly =
            toml::from_str(&text).map_err(|e| bad(one_line(&e.to_string())))?;
        match version.format_version {
            None => return Err(bad("format_version is missing".into())),
            Some(v) if v > FORMAT_VERSION => {
                return Err(Error::new(
                    ErrorKind::UnsupportedVersion,
                    format!(
                        "pool {} uses format version {v}, but this grove supports up to version {FORMAT_VERSION}; upgrade grove to open it",
                        dir.display()
                    ),
                ))
            }
            Some(v) if v < FORMAT_VERSION => {
                return Err(Error::new(
                    ErrorKind::UnsupportedVersion,
                    format!(
                        "pool {} uses format version {v}, which this grove no longer opens (it writes version {FORMAT_VERSION}); export its volumes with the grove that made it (`grove export NAME FILE`) and import them into a new pool (`grove init`, then `grove import NAME FILE`)",
                        dir.display()
                    ),
                ))
            }
            Some(_) => {}
        }
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
        Ok(config)
    }
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
