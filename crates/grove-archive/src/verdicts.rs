//! What the archive's policy says of each archived snapshot: kept or not,
//! and until about when (the owner of copied versions is the one kept
//! longest). Snapshots pushed by hand (no rank) are kept until released.

use crate::format::catalog::Catalog;
use grove_retention::{plan, Level, Policy, Reason, SnapshotFacts};
use std::collections::BTreeMap;

/// The policy's verdict on every archived snapshot, by seq.
#[derive(Debug, Clone)]
pub struct Verdicts {
    /// seq → (kept, until about when; u64::MAX for "until released").
    by_seq: BTreeMap<u64, (bool, u64, String)>,
}

impl Verdicts {
    pub fn keeps(&self, seq: u64) -> bool {
        self.by_seq.get(&seq).is_some_and(|v| v.0)
    }

    pub fn kept_until(&self, seq: u64) -> u64 {
        self.by_seq.get(&seq).map_or(0, |v| v.1)
    }

    /// One line on why.
    pub fn explain(&self, seq: u64) -> &str {
        self.by_seq.get(&seq).map_or("", |v| v.2.as_str())
    }
}

/// The archived snapshots as the retention planner sees them: name, time
/// and rank (the archive has no holds: a snapshot pushed by hand is
/// unranked, and so kept until released).
pub fn facts(catalog: &Catalog) -> Vec<SnapshotFacts> {
    catalog
        .snapshots
        .iter()
        .map(|s| SnapshotFacts {
            name: s.name.clone(),
            created_unix_secs: s.created_unix_secs,
            rank: Level::from_rank(s.rank),
            holds: Vec::new(),
        })
        .collect()
}

pub fn judge(catalog: &Catalog, policy: &Policy, now_unix_secs: u64) -> Verdicts {
    let facts = facts(catalog);
    let verdicts = plan(policy, &facts, now_unix_secs);
    let released: Vec<u64> = catalog
        .snapshots
        .iter()
        .filter(|s| s.released)
        .map(|s| s.seq)
        .collect();
    let by_name: BTreeMap<&str, u64> = catalog
        .snapshots
        .iter()
        .map(|s| (s.name.as_str(), s.seq))
        .collect();
    let by_seq = verdicts
        .iter()
        .filter_map(|v| {
            let until = match v.reason {
                Reason::Kept {
                    until_unix_secs, ..
                } => until_unix_secs,
                Reason::Held { .. } | Reason::Unranked => u64::MAX,
                Reason::Expired => 0,
            };
            let seq = *by_name.get(v.name.as_str())?;
            if released.contains(&seq) {
                return Some((
                    seq,
                    (false, 0, "pushed by hand, since released".to_string()),
                ));
            }
            Some((seq, (v.keep, until, v.explain())))
        })
        .collect();
    Verdicts { by_seq }
}
