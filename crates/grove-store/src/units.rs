//! The one parser of sizes such as `512`, `4K`, `64KiB`, `1.5G` or `1T`,
//! shared by grove.toml, raif.toml and the command line.
//!
//! Every suffix is a power of 1024, whatever its spelling (`K`, `KB` and
//! `KiB` all mean 1024): block devices are sized in binary units, and one
//! meaning per letter avoids a 2.4% surprise between `10GB` and `10GiB`.

/// Binary multipliers by the letter that starts a suffix. No P: the
/// command line refuses `100P` as a unit it does not know (a volume that
/// large is past what the format holds anyway).
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

/// Why a text is not a size; each says the reason in words, for the caller
/// to put after the name of what was being read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("a size, offset or length cannot be negative")]
    Negative,
    #[error("expected a number such as 512, 4K, 10G or 1.5T")]
    NoNumber,
    #[error("unknown unit {0:?}: use K, M, G or T (powers of 1024), or none for bytes")]
    UnknownUnit(String),
    #[error("it has more than one decimal point")]
    SeveralDecimalPoints,
    #[error("at most {FRACTION_DIGITS_MAX} digits may follow the decimal point")]
    FractionTooLong,
    #[error("it is not a whole number of bytes")]
    NotWholeBytes,
    #[error("it is too large (the largest is {} bytes)", u64::MAX)]
    TooLarge,
}

/// Parses a size in bytes; spaces around it, and between the number and
/// its unit, are allowed.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let text = text.trim();
    // Reached through clap's allow_hyphen_values: say why, not just "invalid".
    if text.starts_with('-') {
        return Err(SizeError::Negative);
    }
    let number_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return Err(SizeError::NoNumber);
    }
    let multiplier = parse_suffix(suffix.trim_start())?;
    if fraction.contains('.') {
        return Err(SizeError::SeveralDecimalPoints);
    }
    if fraction.len() > FRACTION_DIGITS_MAX {
        return Err(SizeError::FractionTooLong);
    }
    exact_bytes(whole, fraction, multiplier)
}

/// `whole.fraction` times `multiplier`, in exact decimal arithmetic: 1.1G
/// is 1181116006.4 bytes, which must be refused rather than rounded by a
/// float. Both parts are ASCII digits only, the fraction at most
/// FRACTION_DIGITS_MAX of them.
fn exact_bytes(whole: &str, fraction: &str, multiplier: u64) -> Result<u64, SizeError> {
    let whole_value: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| SizeError::TooLarge)?
    };
    let fraction_value: u128 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().expect("only ASCII digits remain")
    };
    let scale = 10u128.pow(fraction.len() as u32);
    let multiplier = u128::from(multiplier);
    let whole_bytes = whole_value
        .checked_mul(multiplier)
        .ok_or(SizeError::TooLarge)?;
    let fraction_scaled = fraction_value * multiplier;
    if !fraction_scaled.is_multiple_of(scale) {
        return Err(SizeError::NotWholeBytes);
    }
    let bytes = whole_bytes
        .checked_add(fraction_scaled / scale)
        .ok_or(SizeError::TooLarge)?;
    u64::try_from(bytes).map_err(|_| SizeError::TooLarge)
}

/// `""` or `B` is bytes; `K`, `KB`, `KiB` (any case) are KiB, and so on.
fn parse_suffix(suffix: &str) -> Result<u64, SizeError> {
    let lower = suffix.to_ascii_lowercase();
    if lower.is_empty() || lower == "b" {
        return Ok(1);
    }
    let mut chars = lower.chars();
    let letter = chars.next().expect("suffix is not empty");
    let rest = chars.as_str();
    match UNIT_MULTIPLIERS.iter().find(|(unit, _)| *unit == letter) {
        Some((_, multiplier)) if ["", "b", "ib"].contains(&rest) => Ok(*multiplier),
        _ => Err(SizeError::UnknownUnit(suffix.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_size, SizeError};

    #[test]
    fn sizes_parse_in_powers_of_1024() {
        assert_eq!(parse_size("4096").ok(), Some(4096));
        assert_eq!(parse_size("64K").ok(), Some(64 << 10));
        assert_eq!(parse_size("256M").ok(), Some(256 << 20));
        assert_eq!(parse_size("1g").ok(), Some(1 << 30));
        assert_eq!(parse_size("2T").ok(), Some(2 << 40));
        assert_eq!(parse_size("x").ok(), None);
        assert_eq!(parse_size("M").ok(), None);
        assert_eq!(parse_size("99999999999T").ok(), None);
    }

    #[test]
    fn every_spelling_of_a_unit_is_binary() {
        for text in ["3T", "3t", "3TB", "3TiB", "3 tib"] {
            assert_eq!(parse_size(text), Ok(3 << 40), "{text}");
        }
        assert_eq!(parse_size("1 M"), Ok(1 << 20));
    }

    #[test]
    fn each_refusal_names_its_reason() {
        assert_eq!(parse_size("-1"), Err(SizeError::Negative));
        assert_eq!(parse_size("K4"), Err(SizeError::NoNumber));
        assert_eq!(
            parse_size("1X"),
            Err(SizeError::UnknownUnit("X".to_string()))
        );
        assert_eq!(parse_size("1.2.3"), Err(SizeError::SeveralDecimalPoints));
        assert_eq!(
            parse_size("1.0000000000001"),
            Err(SizeError::FractionTooLong)
        );
        assert_eq!(parse_size("1.1G"), Err(SizeError::NotWholeBytes));
        assert_eq!(parse_size("16777216T"), Err(SizeError::TooLarge));
        assert_eq!(
            parse_size("100P"),
            Err(SizeError::UnknownUnit("P".to_string()))
        );
    }
}
