//! The UTC calendar the levels' periods follow: hours, days, ISO weeks
//! (from Monday), months and years, as bucket starts in Unix seconds; and
//! the time formats snapshot names and `--now` use.

use crate::level::Level;

pub const MINUTE_SECS: u64 = 60;
pub const HOUR_SECS: u64 = 3600;
pub const DAY_SECS: u64 = 86_400;
const WEEK_DAYS: u64 = 7;
/// 1970-01-01 was a Thursday: days to add to land weeks on Mondays.
const EPOCH_WEEKDAY_FROM_MONDAY: u64 = 3;

/// A civil date and time in UTC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Civil {
    pub year: i64,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of `days` since 1970-01-01 (`civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

pub fn to_civil(unix_secs: u64) -> Civil {
    let days = (unix_secs / DAY_SECS) as i64;
    let (year, month, day) = civil_from_days(days);
    let rest = unix_secs % DAY_SECS;
    Civil {
        year,
        month,
        day,
        hour: (rest / HOUR_SECS) as u32,
        minute: (rest % HOUR_SECS / MINUTE_SECS) as u32,
        second: (rest % MINUTE_SECS) as u32,
    }
}

/// Unix seconds of a civil time; None before 1970 or for an impossible date.
pub fn from_civil(c: Civil) -> Option<u64> {
    let valid = (1..=12).contains(&c.month)
        && c.day >= 1
        && c.day <= days_in_month(c.year, c.month)
        && c.hour < 24
        && c.minute < 60
        && c.second < 60;
    let days = days_from_civil(c.year, c.month, c.day);
    if !valid || days < 0 {
        return None;
    }
    Some(
        days as u64 * DAY_SECS
            + u64::from(c.hour) * HOUR_SECS
            + u64::from(c.minute) * MINUTE_SECS
            + u64::from(c.second),
    )
}

fn days_in_month(year: i64, month: u32) -> u32 {
    let next = if month == 12 {
        (year + 1, 1)
    } else {
        (year, month + 1)
    };
    (days_from_civil(next.0, next.1, 1) - days_from_civil(year, month, 1)) as u32
}

fn month_start(year: i64, month: u32) -> u64 {
    days_from_civil(year, month, 1).max(0) as u64 * DAY_SECS
}

/// Start of the period of `level` that holds `t`. `frequent_secs` is the
/// frequent level's period (a policy setting).
pub fn bucket_start(level: Level, t: u64, frequent_secs: u64) -> u64 {
    let floor = |period: u64| t / period * period;
    match level {
        Level::Frequent => floor(frequent_secs.max(MINUTE_SECS)),
        Level::Hourly => floor(HOUR_SECS),
        Level::Daily => floor(DAY_SECS),
        Level::Weekly => {
            let days = t / DAY_SECS;
            let from_monday = (days + EPOCH_WEEKDAY_FROM_MONDAY) % WEEK_DAYS;
            // Before the first Monday of 1970 the week starts at the epoch.
            days.saturating_sub(from_monday) * DAY_SECS
        }
        Level::Monthly => {
            let c = to_civil(t);
            month_start(c.year, c.month)
        }
        Level::Yearly => month_start(to_civil(t).year, 1),
    }
}

/// Start of the period of `level` after the one that holds `t`.
pub fn next_bucket_start(level: Level, t: u64, frequent_secs: u64) -> u64 {
    let start = bucket_start(level, t, frequent_secs);
    match level {
        Level::Frequent => start + frequent_secs.max(MINUTE_SECS),
        Level::Hourly => start + HOUR_SECS,
        Level::Daily => start + DAY_SECS,
        Level::Weekly => bucket_start(level, start + WEEK_DAYS * DAY_SECS, frequent_secs),
        Level::Monthly => {
            let c = to_civil(start);
            if c.month == 12 {
                month_start(c.year + 1, 1)
            } else {
                month_start(c.year, c.month + 1)
            }
        }
        Level::Yearly => month_start(to_civil(start).year + 1, 1),
    }
}

/// Start of the period of `level` `k` periods after the one that holds `t`
/// (in O(1), whatever `k`; saturates far in the future).
pub fn bucket_after(level: Level, t: u64, k: u64, frequent_secs: u64) -> u64 {
    let start = bucket_start(level, t, frequent_secs);
    let fixed = |period: u64| start.saturating_add(k.saturating_mul(period));
    match level {
        Level::Frequent => fixed(frequent_secs.max(MINUTE_SECS)),
        Level::Hourly => fixed(HOUR_SECS),
        Level::Daily => fixed(DAY_SECS),
        Level::Weekly => fixed(WEEK_DAYS * DAY_SECS),
        Level::Monthly | Level::Yearly => {
            let c = to_civil(start);
            let months = if level == Level::Monthly {
                k
            } else {
                k.saturating_mul(12)
            };
            let Some(index) = i64::try_from(months)
                .ok()
                .and_then(|m| (c.year * 12 + i64::from(c.month) - 1).checked_add(m))
                .filter(|&i| i < 12 * 100_000)
            else {
                return u64::MAX;
            };
            month_start(index / 12, (index % 12) as u32 + 1)
        }
    }
}

/// `20261125-143000`: how auto snapshots are named (sorts by time).
pub fn compact(unix_secs: u64) -> String {
    let c = to_civil(unix_secs);
    format!(
        "{:04}{:02}{:02}-{:02}{:02}{:02}",
        c.year, c.month, c.day, c.hour, c.minute, c.second
    )
}

/// `2026-11-25 14:30:00Z`: how times are shown.
pub fn display(unix_secs: u64) -> String {
    let c = to_civil(unix_secs);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}Z",
        c.year, c.month, c.day, c.hour, c.minute, c.second
    )
}

/// Parses a time for `--now`: `@UNIXSECONDS`, or `YYYY-MM-DD`,
/// `YYYY-MM-DDTHH:MM[:SS]` (also with a space for `T`, and an optional
/// trailing `Z`), always UTC.
pub fn parse_time(text: &str) -> Result<u64, String> {
    let bad = || format!("bad time {text:?}: give @UNIXSECONDS or YYYY-MM-DD[THH:MM[:SS]] (UTC)");
    if let Some(secs) = text.strip_prefix('@') {
        return secs.parse().map_err(|_| bad());
    }
    let text = text.trim_end_matches('Z');
    let (date, time) = match text.split_once(['T', ' ']) {
        Some((date, time)) => (date, Some(time)),
        None => (text, None),
    };
    let numbers = |part: &str, sep: char| -> Option<Vec<u32>> {
        part.split(sep).map(|n| n.parse().ok()).collect()
    };
    let d = numbers(date, '-')
        .filter(|d| d.len() == 3)
        .ok_or_else(bad)?;
    let t = match time {
        Some(time) => numbers(time, ':')
            .filter(|t| t.len() == 2 || t.len() == 3)
            .ok_or_else(bad)?,
        None => vec![0, 0],
    };
    from_civil(Civil {
        year: i64::from(d[0]),
        month: d[1],
        day: d[2],
        hour: t[0],
        minute: t[1],
        second: t.get(2).copied().unwrap_or(0),
    })
    .ok_or_else(bad)
}

/// Parses a duration for leases and periods: `90s`, `15m`, `12h`, `30d`,
/// `2w` (a bare number is seconds).
pub fn parse_duration(text: &str) -> Result<u64, String> {
    let bad =
        || format!("bad duration {text:?}: give a number with s, m, h, d or w (as 15m, 12h, 30d)");
    let (digits, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let scale = match unit {
        "" | "s" => 1,
        "m" => MINUTE_SECS,
        "h" => HOUR_SECS,
        "d" => DAY_SECS,
        "w" => WEEK_DAYS * DAY_SECS,
        _ => return Err(bad()),
    };
    n.checked_mul(scale).filter(|&s| s > 0).ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_dates_and_buckets() {
        // 2026-11-25 14:30:05 UTC, a Wednesday.
        let t = parse_time("2026-11-25T14:30:05Z").unwrap();
        assert_eq!(t, 1_795_617_005);
        assert_eq!(display(t), "2026-11-25 14:30:05Z");
        assert_eq!(compact(t), "20261125-143005");
        let starts = [
            (Level::Frequent, "2026-11-25 14:30:00Z"),
            (Level::Hourly, "2026-11-25 14:00:00Z"),
            (Level::Daily, "2026-11-25 00:00:00Z"),
            (Level::Weekly, "2026-11-23 00:00:00Z"),
            (Level::Monthly, "2026-11-01 00:00:00Z"),
            (Level::Yearly, "2026-01-01 00:00:00Z"),
        ];
        for (level, start) in starts {
            assert_eq!(display(bucket_start(level, t, 900)), start, "{level:?}");
        }
        assert_eq!(
            display(next_bucket_start(Level::Monthly, t, 900)),
            "2026-12-01 00:00:00Z"
        );
        let december = parse_time("2026-12-31 23:59").unwrap();
        assert_eq!(
            display(next_bucket_start(Level::Monthly, december, 900)),
            "2027-01-01 00:00:00Z"
        );
        assert_eq!(
            display(next_bucket_start(Level::Weekly, t, 900)),
            "2026-11-30 00:00:00Z"
        );
        assert_eq!(parse_time("@1700000000"), Ok(1_700_000_000));
        assert!(parse_time("2026-02-30").is_err());
        assert!(parse_time("yesterday").is_err());
        assert_eq!(parse_duration("15m"), Ok(900));
        assert_eq!(parse_duration("2w"), Ok(1_209_600));
        assert!(parse_duration("0h").is_err() && parse_duration("5y").is_err());
    }

    proptest! {
        #[test]
        fn civil_round_trips_and_buckets_nest(t in 0u64..8_000_000_000) {
            let c = to_civil(t);
            prop_assert_eq!(from_civil(c), Some(t));
            for level in Level::ALL {
                let start = bucket_start(level, t, 900);
                let next = next_bucket_start(level, t, 900);
                prop_assert!(start <= t && t < next, "{level}: {start} {t} {next}");
                prop_assert_eq!(bucket_start(level, next, 900), next);
                prop_assert_eq!(bucket_start(level, next - 1, 900), start);
                prop_assert_eq!(bucket_after(level, t, 1, 900), next);
                prop_assert_eq!(bucket_after(level, t, 0, 900), start);
                prop_assert_eq!(bucket_after(level, t, 3, 900),
                                next_bucket_start(level, next_bucket_start(level, next, 900), 900));
            }
            // Each level's period lies inside the next higher one's,
            // except weeks, which straddle months.
            for (low, high) in [(Level::Hourly, Level::Daily), (Level::Daily, Level::Monthly),
                                (Level::Monthly, Level::Yearly), (Level::Daily, Level::Weekly)] {
                prop_assert!(bucket_start(high, t, 900) <= bucket_start(low, t, 900));
            }
        }
    }
}
