//! The levels of the rank tree. A snapshot's rank is one level; it counts
//! at that level and at every lower one (a daily snapshot is also an
//! hourly one), and higher levels keep snapshots longer.

/// A retention level, lowest first. Its number is the rank stored in a
/// snapshot's record (0 there means unranked).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    Frequent = 1,
    Hourly = 2,
    Daily = 3,
    Weekly = 4,
    Monthly = 5,
    Yearly = 6,
}

impl Level {
    /// Every level, lowest first.
    pub const ALL: [Level; 6] = [
        Level::Frequent,
        Level::Hourly,
        Level::Daily,
        Level::Weekly,
        Level::Monthly,
        Level::Yearly,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Level::Frequent => "frequent",
            Level::Hourly => "hourly",
            Level::Daily => "daily",
            Level::Weekly => "weekly",
            Level::Monthly => "monthly",
            Level::Yearly => "yearly",
        }
    }

    /// The level named `name` (as `name` spells it).
    pub fn from_name(name: &str) -> Option<Level> {
        Level::ALL.into_iter().find(|l| l.name() == name)
    }

    /// The rank stored in a snapshot's record.
    pub fn rank(self) -> u8 {
        self as u8
    }

    /// The level of a stored rank; None for 0 (unranked) or a rank this
    /// grove does not know.
    pub fn from_rank(rank: u8) -> Option<Level> {
        Level::ALL.into_iter().find(|l| l.rank() == rank)
    }

    /// Position in `Level::ALL`.
    pub fn index(self) -> usize {
        self as usize - 1
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ranks_round_trip_and_order_by_lifetime() {
        for (i, level) in Level::ALL.into_iter().enumerate() {
            assert_eq!(Level::from_name(level.name()), Some(level));
            assert_eq!(Level::from_rank(level.rank()), Some(level));
            assert_eq!(level.index(), i);
        }
        assert_eq!(Level::from_rank(0), None);
        assert_eq!(Level::from_rank(7), None);
        assert!(Level::Hourly < Level::Daily && Level::Monthly < Level::Yearly);
    }
}
