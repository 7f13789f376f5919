//! The rank tree (Thresher): a snapshot ranked at a level counts at that
//! level and every lower one; each level keeps its newest `keep` snapshots
//! of that rank or higher; a snapshot stays while any level keeps it, so a
//! higher rank lives longer and, within a rank, the newest live longest.
//! Holds (and replication cursors) keep a snapshot whatever the policy
//! says, and unranked snapshots (taken by hand) are the policy's to keep,
//! never to prune.

use crate::calendar::{self, bucket_after, bucket_start, next_bucket_start};
use crate::level::Level;
use crate::policy::Policy;

/// What the planner needs to know of one snapshot of a volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotFacts {
    pub name: String,
    pub created_unix_secs: u64,
    pub rank: Option<Level>,
    /// What holds it whatever the policy says: hold tags, and
    /// `cursor:TARGET` for the snapshot a replication cursor marks.
    pub holds: Vec<String>,
}

/// Why a snapshot stays or goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Kept by holds (and maybe the policy too).
    Held { by: Vec<String> },
    /// Kept by `level`: the `position + 1`-th newest of the `keep` it
    /// keeps, until about `until_unix_secs`, when enough newer ones will
    /// have been taken.
    Kept {
        level: Level,
        position: u32,
        keep: u32,
        until_unix_secs: u64,
    },
    /// Taken by hand, never ranked: the policy does not prune it.
    Unranked,
    /// Ranked, but no level keeps it any more.
    Expired,
}

/// The verdict on one snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub name: String,
    pub created_unix_secs: u64,
    pub rank: Option<Level>,
    pub keep: bool,
    pub reason: Reason,
}

impl Verdict {
    /// One line for `grove policy show`.
    pub fn explain(&self) -> String {
        match &self.reason {
            Reason::Held { by } => format!("held by {}", by.join(", ")),
            Reason::Kept {
                level,
                position,
                keep,
                until_unix_secs,
            } => format!(
                "{} newest of {keep} {level}, until about {}",
                ordinal(position + 1),
                calendar::display(*until_unix_secs)
            ),
            Reason::Unranked => "not ranked (taken by hand): the policy keeps it".to_string(),
            Reason::Expired => "expired: no level keeps it any more".to_string(),
        }
    }
}

fn ordinal(n: u32) -> String {
    let suffix = match (n % 10, n % 100) {
        (1, 11) | (2, 12) | (3, 13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// Newest first: by creation time, then by name (two snapshots taken in
/// one second keep one order).
fn newest_first(snapshots: &[SnapshotFacts]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..snapshots.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (&snapshots[a], &snapshots[b]);
        (b.created_unix_secs, &b.name).cmp(&(a.created_unix_secs, &a.name))
    });
    order
}

/// The verdict on every snapshot of one volume under `policy` at `now`,
/// newest first. Costs O(n log n) in the volume's snapshots.
pub fn plan(policy: &Policy, snapshots: &[SnapshotFacts], now: u64) -> Vec<Verdict> {
    let order = newest_first(snapshots);
    // Per snapshot (by input index): the highest level keeping it, with its
    // position there.
    let mut kept_by: Vec<Option<(Level, u32)>> = vec![None; snapshots.len()];
    for level in Level::ALL {
        let keep = policy.keeps(level);
        let ranked_here = order
            .iter()
            .filter(|&&i| snapshots[i].rank.is_some_and(|r| r >= level));
        for (position, &i) in ranked_here.take(keep as usize).enumerate() {
            // Levels go up, so the last one to keep a snapshot is its highest.
            kept_by[i] = Some((level, position as u32));
        }
    }
    order
        .iter()
        .map(|&i| {
            let facts = &snapshots[i];
            let reason = if !facts.holds.is_empty() {
                Reason::Held {
                    by: facts.holds.clone(),
                }
            } else if facts.rank.is_none() {
                Reason::Unranked
            } else if let Some((level, position)) = kept_by[i] {
                let keep = policy.keeps(level);
                // Each period of `level` from the next one on brings one
                // newer snapshot of its rank; `keep - position` of them push
                // this one out.
                let until =
                    bucket_after(level, now, u64::from(keep - position), policy.frequent_secs);
                Reason::Kept {
                    level,
                    position,
                    keep,
                    until_unix_secs: until,
                }
            } else {
                Reason::Expired
            };
            Verdict {
                name: facts.name.clone(),
                created_unix_secs: facts.created_unix_secs,
                rank: facts.rank,
                keep: reason != Reason::Expired,
                reason,
            }
        })
        .collect()
}

/// The level a snapshot taken at `now` gets, if one is due: the highest
/// level the policy keeps whose current period holds no snapshot of that
/// rank or higher. None: nothing is due.
pub fn due_level(policy: &Policy, snapshots: &[SnapshotFacts], now: u64) -> Option<Level> {
    Level::ALL.into_iter().rev().find(|&level| {
        if policy.keeps(level) == 0 {
            return false;
        }
        let start = bucket_start(level, now, policy.frequent_secs);
        let end = next_bucket_start(level, now, policy.frequent_secs);
        !snapshots.iter().any(|s| {
            s.rank.is_some_and(|r| r >= level) && (start..end).contains(&s.created_unix_secs)
        })
    })
}

/// `VOLUME@auto-20261125-143000`.
pub fn auto_snapshot_name(volume: &str, now: u64) -> String {
    format!("{volume}@auto-{}", calendar::compact(now))
}

/// A snapshot space pressure may take, ordered as it takes them: expired
/// ones first (class 0), then by the level that keeps them, oldest first.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SpaceCandidate {
    /// 0 for an expired snapshot, else the rank of the level keeping it.
    pub class: u8,
    pub created_unix_secs: u64,
    pub name: String,
}

/// The snapshots of one volume space pressure may take, in the order it
/// takes them (`SpaceCandidate`'s order, which also merges volumes). Never
/// a held or unranked one, nor the newest `policy.minimum` of the ranked
/// ones it could take.
pub fn space_order(policy: &Policy, verdicts: &[Verdict]) -> Vec<SpaceCandidate> {
    let mut takeable: Vec<SpaceCandidate> = verdicts
        .iter()
        .filter_map(|v| {
            let class = match &v.reason {
                Reason::Expired => 0,
                Reason::Kept { level, .. } => level.rank(),
                Reason::Held { .. } | Reason::Unranked => return None,
            };
            Some(SpaceCandidate {
                class,
                created_unix_secs: v.created_unix_secs,
                name: v.name.clone(),
            })
        })
        .collect();
    // The newest ones stay, whatever their rank.
    takeable.sort_by(|a, b| (b.created_unix_secs, &b.name).cmp(&(a.created_unix_secs, &a.name)));
    let mut order: Vec<SpaceCandidate> =
        takeable.into_iter().skip(policy.minimum as usize).collect();
    order.sort();
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calendar::parse_time;
    use crate::policy::builtin_templates;

    fn facts(name: &str, at: &str, rank: Option<Level>) -> SnapshotFacts {
        SnapshotFacts {
            name: name.into(),
            created_unix_secs: parse_time(at).unwrap(),
            rank,
            holds: Vec::new(),
        }
    }

    #[test]
    fn higher_ranks_outlive_lower_ones_and_holds_and_hand_taken_snapshots_stay() {
        let policy = Policy {
            keep: [0, 2, 1, 0, 0, 0],
            frequent_secs: 900,
            minimum: 1,
        };
        let mut snaps = vec![
            facts("d1", "2026-11-24T00:00", Some(Level::Daily)),
            facts("h1", "2026-11-24T01:00", Some(Level::Hourly)),
            facts("h2", "2026-11-24T02:00", Some(Level::Hourly)),
            facts("h3", "2026-11-24T03:00", Some(Level::Hourly)),
            facts("manual", "2026-11-24T01:30", None),
        ];
        snaps[1].holds = vec!["backup".into()];
        let now = parse_time("2026-11-24T03:30").unwrap();
        let verdicts = plan(&policy, &snaps, now);
        let kept: Vec<&str> = verdicts
            .iter()
            .filter(|v| v.keep)
            .map(|v| v.name.as_str())
            .collect();
        // h3, h2 are the 2 newest hourly; d1 is the daily; h1 is held.
        assert_eq!(kept, ["h3", "h2", "manual", "h1", "d1"]);
        let h3 = &verdicts[0];
        assert_eq!(
            h3.reason,
            Reason::Kept {
                level: Level::Hourly,
                position: 0,
                keep: 2,
                until_unix_secs: parse_time("2026-11-24T05:00").unwrap()
            }
        );
        assert_eq!(
            h3.explain(),
            "1st newest of 2 hourly, until about 2026-11-24 05:00:00Z"
        );
        let d1 = verdicts.iter().find(|v| v.name == "d1").unwrap();
        assert!(matches!(
            d1.reason,
            Reason::Kept {
                level: Level::Daily,
                ..
            }
        ));
        // Under pressure: hourly before daily, oldest first; never the
        // held, the unranked or the newest one.
        let order: Vec<String> = space_order(&policy, &verdicts)
            .into_iter()
            .map(|c| c.name)
            .collect();
        assert_eq!(order, ["h2", "d1"]);
    }

    #[test]
    fn the_highest_due_level_ranks_the_next_snapshot() {
        let policy = builtin_templates()["frequent"].clone();
        let monday = "2026-11-23T00:00";
        assert_eq!(
            due_level(&policy, &[], parse_time(monday).unwrap()),
            Some(Level::Yearly)
        );
        let taken = vec![facts("w", monday, Some(Level::Weekly))];
        let later = parse_time("2026-11-23T00:10").unwrap();
        // Weekly, daily, hourly and frequent are all covered by a weekly
        // snapshot this week, this day, this hour, this quarter hour; the
        // month and year have none.
        assert_eq!(due_level(&policy, &taken, later), Some(Level::Yearly));
        let taken = vec![facts("y", monday, Some(Level::Yearly))];
        assert_eq!(due_level(&policy, &taken, later), None);
        let quarter = parse_time("2026-11-23T00:15").unwrap();
        assert_eq!(due_level(&policy, &taken, quarter), Some(Level::Frequent));
        assert_eq!(auto_snapshot_name("vm", quarter), "vm@auto-20261123-001500");
    }
}
