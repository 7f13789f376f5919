//! Sizes such as `512`, `4K`, `64KiB`, `1.5G` or `1T` on the command line.
//!
//! The rules are grove-store's one size parser (`grove_store::units`).
//! Sizes are parsed as text in the command, not by clap, so that a bad size
//! gets one line naming the argument and the reason; that line is a usage
//! error (exit 2), as clap's own are.

use anyhow::Result;

use crate::usage::UsageError;

/// Parses a size in bytes. `what` names the argument in the error message.
pub fn parse_size(text: &str, what: &str) -> Result<u64> {
    grove_store::units::parse_size(text).map_err(|reason| {
        anyhow::Error::new(UsageError(format!("invalid {what} {text:?}: {reason}")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_suffixed() {
        assert_eq!(parse_size("512", "size").unwrap(), 512);
        assert_eq!(parse_size("0", "size").unwrap(), 0);
        assert_eq!(parse_size("4K", "size").unwrap(), 4096);
        assert_eq!(parse_size("4k", "size").unwrap(), 4096);
        assert_eq!(parse_size("64KiB", "size").unwrap(), 64 << 10);
        assert_eq!(parse_size("64kb", "size").unwrap(), 64 << 10);
        assert_eq!(parse_size("2M", "size").unwrap(), 2 << 20);
        assert_eq!(parse_size("10G", "size").unwrap(), 10 << 30);
        assert_eq!(parse_size("10 GiB", "size").unwrap(), 10 << 30);
        assert_eq!(parse_size("1T", "size").unwrap(), 1 << 40);
        assert_eq!(parse_size("100B", "size").unwrap(), 100);
        assert_eq!(parse_size(" 8K ", "size").unwrap(), 8192);
    }

    #[test]
    fn fractions_are_exact() {
        assert_eq!(parse_size("1.5G", "size").unwrap(), 3 << 29);
        assert_eq!(parse_size("0.5K", "size").unwrap(), 512);
        assert_eq!(parse_size(".5K", "size").unwrap(), 512);
        assert_eq!(parse_size("2.", "size").unwrap(), 2);
        assert!(parse_size("1.1G", "size").is_err());
        let negative = parse_size("-5G", "size").unwrap_err();
        assert!(format!("{negative:#}").contains("cannot be negative"));
        assert!(parse_size("1.5", "size").is_err());
    }

    #[test]
    fn garbage_is_refused() {
        for bad in [
            "",
            " ",
            "abc",
            "G",
            "-1",
            "1X",
            "1KK",
            "1.2.3",
            ".",
            "1e9",
            "1 G B",
            "K4",
            "99999999999999999999999",
            "16777216T",
            "0x10",
        ] {
            let err = parse_size(bad, "size").unwrap_err();
            assert!(
                format!("{err:#}").starts_with("invalid size"),
                "{bad:?}: {err:#}"
            );
        }
    }

    #[test]
    fn largest_fits() {
        assert_eq!(
            parse_size("18446744073709551615", "size").unwrap(),
            u64::MAX
        );
        assert!(parse_size("18446744073709551616", "size").is_err());
        assert!(parse_size("16777216T", "size").is_err());
        assert_eq!(parse_size("16777215T", "size").unwrap(), 16777215 << 40);
    }
}
