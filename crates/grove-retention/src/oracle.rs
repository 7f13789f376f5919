//! What a policy keeps, read straight off the calendar: the reference the
//! planner and the scheduler are tested against, written apart from them.
//! A time a snapshot was taken at counts at level L if it was the first
//! taken in its period of some level L' >= L that the policy keeps; each
//! level keeps its newest `keep` of those.

use std::collections::BTreeSet;

use crate::calendar::bucket_start;
use crate::level::Level;
use crate::policy::Policy;

/// The times kept, of `taken` (the times snapshots were taken at, in
/// order, one snapshot each).
pub fn kept_by_calendar(policy: &Policy, taken: &[u64]) -> BTreeSet<u64> {
    // A time is first in its period when the time before it lies in an
    // earlier period.
    let firsts = |level: Level| -> BTreeSet<u64> {
        let period = |t: u64| bucket_start(level, t, policy.frequent_secs);
        taken
            .iter()
            .enumerate()
            .filter(|&(i, &t)| i == 0 || period(taken[i - 1]) != period(t))
            .map(|(_, &t)| t)
            .collect()
    };
    let first_in: Vec<BTreeSet<u64>> = Level::ALL.into_iter().map(firsts).collect();
    let mut kept = BTreeSet::new();
    for level in Level::ALL {
        let counted: Vec<u64> = taken
            .iter()
            .copied()
            .filter(|&t| {
                Level::ALL
                    .into_iter()
                    .filter(|&l| l >= level && policy.keeps(l) > 0)
                    .any(|l| first_in[l.index()].contains(&t))
            })
            .collect();
        kept.extend(counted.iter().rev().take(policy.keeps(level) as usize));
    }
    kept
}
