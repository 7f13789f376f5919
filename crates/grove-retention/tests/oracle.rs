//! A year of scheduled snapshots, planned and pruned as the scheduler does,
//! against an oracle that reads the policy straight off the calendar: the
//! snapshot taken first in a period of a level counts at that level and
//! below, and each level keeps its newest `keep`.

use std::collections::BTreeSet;

use grove_retention::calendar::{parse_time, HOUR_SECS, MINUTE_SECS};
use grove_retention::oracle::kept_by_calendar;
use grove_retention::{due_level, plan, Policy, SnapshotFacts};
use proptest::prelude::*;

/// The scheduler's loop without a pool: at each tick take the due
/// snapshot, then drop what the plan does not keep.
fn simulate(policy: &Policy, start: u64, ticks: u64, step: u64) -> (Vec<SnapshotFacts>, Vec<u64>) {
    let mut live: Vec<SnapshotFacts> = Vec::new();
    let mut taken = Vec::new();
    for tick in 0..ticks {
        let now = start + tick * step;
        if let Some(level) = due_level(policy, &live, now) {
            live.push(SnapshotFacts {
                name: format!("s{now}"),
                created_unix_secs: now,
                rank: Some(level),
                holds: Vec::new(),
            });
            taken.push(now);
        }
        let keep: BTreeSet<String> = plan(policy, &live, now)
            .into_iter()
            .filter(|v| v.keep)
            .map(|v| v.name)
            .collect();
        live.retain(|s| keep.contains(&s.name));
    }
    (live, taken)
}

fn oracle(policy: &Policy, taken: &[u64]) -> BTreeSet<u64> {
    kept_by_calendar(policy, taken)
}

#[test]
fn a_year_of_hourly_snapshots_keeps_what_the_calendar_says() {
    let policy = Policy {
        keep: [0, 24, 7, 4, 12, 2],
        frequent_secs: 15 * MINUTE_SECS,
        minimum: 1,
    };
    let start = parse_time("2025-01-01T00:00").unwrap();
    let hours = 366 * 24;
    let (live, taken) = simulate(&policy, start, hours, HOUR_SECS);
    assert_eq!(taken.len() as u64, hours, "a snapshot every hour");
    let kept: BTreeSet<u64> = live.iter().map(|s| s.created_unix_secs).collect();
    assert_eq!(kept, oracle(&policy, &taken));
    // 24 hourly, 7 daily (one is today's among the hourly), 4 weekly, 12
    // monthly, 2 yearly, minus the ones that count twice.
    assert!(
        kept.len() < 24 + 7 + 4 + 12 + 2 && kept.len() > 30,
        "{}",
        kept.len()
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn any_policy_and_pace_keep_what_the_calendar_says(
        keep in proptest::array::uniform6(0u32..6),
        frequent_minutes in 5u64..60,
        step_minutes in prop::sample::select(vec![5u64, 15, 60, 240, 1440]),
        start_day in 0u64..400,
    ) {
        let policy = Policy { keep, frequent_secs: frequent_minutes * MINUTE_SECS, minimum: 1 };
        let start = parse_time("2024-06-01T00:00").unwrap() + start_day * 86_400;
        // Long enough to roll every level at least once at the slower paces.
        let ticks = (200 * 86_400 / (step_minutes * MINUTE_SECS)).min(3000);
        let (live, taken) = simulate(&policy, start, ticks, step_minutes * MINUTE_SECS);
        let kept: BTreeSet<u64> = live.iter().map(|s| s.created_unix_secs).collect();
        // The oracle sees only what was taken; a tick counts as first in a
        // period only among taken times, as the scheduler saw them.
        prop_assert_eq!(kept, oracle(&policy, &taken));
    }
}
