//! Parsing sizes such as `512`, `4K`, `64KiB`, `1.5G` or `1T`.
//!
//! Every suffix is a power of 1024, whatever its spelling (`K`, `KB` and
//! `KiB` all mean 1024): block devices are sized in binary units, and one
//! meaning per letter avoids a 2.4% surprise between `10GB` and `10GiB`.
//! Sizes are parsed as text in the command, not by clap, so that a bad size
//! gets one line naming the argument and the reason; that line is a usage
//! error (exit 2), as clap's own are.

use anyhow::{bail, Result};

use crate::usage::UsageError;

/// Binary multipliers by the letter that starts a suffix.
const UNIT_MULTIPLIERS: [(char, u64); 4] = [
    ('k', 1 << 10),
    ('m', 1 << 20),
    ('g', 1 << 30),
    ('t', 1 << 40),
];

/// Most digits accepted after a decimal point: enough for any byte-exact
/// fraction of a TiB written out by hand, few enough that the arithmetic
/// below cannot overflow a u128.
const FRACTION_DIGITS_MAX: usize = 12;

/// Parses a size in bytes. `what` names the argument in the error message.
pub fn parse_size(text: &str, what: &str) -> Result<u64> {
    parse(text.trim()).map_err(|reason| {
        anyhow::Error::new(UsageError(format!("invalid {what} {text:?}: {reason}")))
    })
}

fn parse(text: &str) -> Result<u64> {
    // Reached through clap's allow_hyphen_values: say why, not just "invalid".
    if text.starts_with('-') {
        bail!("a size, offset or length cannot be negative");
    }
    let number_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(number_end);
    let (whole, fraction) = match number.split_once('.') {
        Some((whole, fraction)) => (whole, fraction),
        None => (number, ""),
    };
    if whole.is_empty() && fraction.is_empty() {
        bail!("expected a number such as 512, 4K, 10G or 1.5T");
    }
    let multiplier = parse_suffix(suffix.trim_start())?;
    if fraction.contains('.') {
        bail!("it has more than one decimal point");
    }
    if fraction.len() > FRACTION_DIGITS_MAX {
        bail!("at most {FRACTION_DIGITS_MAX} digits may follow the decimal point");
    }
    let too_large = || anyhow::anyhow!("it is too large (the largest is {} bytes)", u64::MAX);
    let whole_value: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| too_large())?
    };
    // Exact decimal arithmetic: 1.1G is 1181116006.4 bytes, which must be
    // refused rather than rounded by a float.
    let fraction_value: u128 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().expect("only ASCII digits remain")
    };
    let scale = 10u128.pow(fraction.len() as u32);
    let multiplier = u128::from(multiplier);
    let whole_bytes = whole_value.checked_mul(multiplier).ok_or_else(too_large)?;
    let fraction_scaled = fraction_value * multiplier;
    if !fraction_scaled.is_multiple_of(scale) {
        bail!("it is not a whole number of bytes");
    }
    let bytes = whole_bytes
        .checked_add(fraction_scaled / scale)
        .ok_or_else(too_large)?;
    u64::try_from(bytes).map_err(|_| too_large())
}

/// `""` or `B` is bytes; `K`, `KB`, `KiB` (any case) are KiB, and so on.
fn parse_suffix(suffix: &str) -> Result<u64> {
    let lower = suffix.to_ascii_lowercase();
    if lower.is_empty() || lower == "b" {
        return Ok(1);
    }
    let mut chars = lower.chars();
    let letter = chars.next().expect("suffix is not empty");
    let rest = chars.as_str();
    match UNIT_MULTIPLIERS.iter().find(|(unit, _)| *unit == letter) {
        Some((_, multiplier)) if ["", "b", "ib"].contains(&rest) => Ok(*multiplier),
        _ => bail!("unknown unit {suffix:?}: use K, M, G or T (powers of 1024), or none for bytes"),
    }
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
