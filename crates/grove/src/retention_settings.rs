//! The pool's retention settings, read from grove.toml, and the time
//! retention works at: what the retention commands, the archive tier and
//! the daemons' scheduler all start from, below each of them.

use std::path::Path;

use anyhow::Result;
use grove_retention::calendar::parse_time;
use grove_retention::RetentionConfig;
use grove_store::config::PoolConfig;

/// The time retention works at: `--now` if given (for scripts and tests),
/// else the system clock.
pub fn now(given: Option<&str>) -> Result<u64> {
    match given {
        Some(text) => parse_time(text).map_err(anyhow::Error::msg),
        None => Ok(std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)),
    }
}

/// The pool's retention settings, read from grove.toml each time (the
/// daemons pick up `grove policy set` at their next tick).
pub fn load_config(dir: &Path) -> Result<RetentionConfig> {
    let config = PoolConfig::load(dir)?;
    RetentionConfig::from_table(config.retention.as_ref()).map_err(anyhow::Error::msg)
}
