//! RAIF levels: how many units of a stripe hold data, how many branches a
//! level needs, and how many lost branches it survives.

use std::fmt;
use std::str::FromStr;

/// A RAID level as RAIF applies it to one file (thesis §2.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Striping, no redundancy.
    Raif0,
    /// Every branch holds a full copy.
    Raif1,
    /// Striping with one parity unit on a fixed branch.
    Raif4,
    /// Striping with one parity unit that rotates from stripe to stripe.
    Raif5,
    /// Striping with two Reed-Solomon parity units that rotate.
    Raif6,
    /// Striping over mirrored pairs.
    Raif10,
}

/// Every level, in the order the documentation lists them.
pub const ALL_LEVELS: [Level; 6] = [
    Level::Raif0,
    Level::Raif1,
    Level::Raif4,
    Level::Raif5,
    Level::Raif6,
    Level::Raif10,
];

impl Level {
    /// The fewest branches the level can use.
    pub fn min_branches(self) -> usize {
        match self {
            Level::Raif0 => 1,
            Level::Raif1 => 2,
            Level::Raif4 | Level::Raif5 => 3,
            Level::Raif6 | Level::Raif10 => 4,
        }
    }

    /// Whether `width` branches suit the level (RAIF10 pairs them up).
    pub fn check_width(self, width: usize) -> Result<(), String> {
        if width < self.min_branches() {
            return Err(format!(
                "{self} needs at least {} branches, got {width}",
                self.min_branches()
            ));
        }
        if self == Level::Raif10 && !width.is_multiple_of(2) {
            return Err(format!(
                "{self} needs an even number of branches, got {width}"
            ));
        }
        Ok(())
    }

    /// Data units in one stripe over `width` branches.
    pub fn data_units(self, width: usize) -> usize {
        match self {
            Level::Raif0 => width,
            Level::Raif1 => 1,
            Level::Raif4 | Level::Raif5 => width - 1,
            Level::Raif6 => width - 2,
            Level::Raif10 => width / 2,
        }
    }

    /// Parity units in one stripe.
    pub fn parity_units(self) -> usize {
        match self {
            Level::Raif4 | Level::Raif5 => 1,
            Level::Raif6 => 2,
            Level::Raif0 | Level::Raif1 | Level::Raif10 => 0,
        }
    }

    /// How many lost branches any stripe survives, whichever they are.
    pub fn tolerated_losses(self, width: usize) -> usize {
        match self {
            Level::Raif0 => 0,
            Level::Raif1 => width - 1,
            Level::Raif4 | Level::Raif5 | Level::Raif10 => 1,
            Level::Raif6 => 2,
        }
    }

    /// Whether reads can choose between copies (load balancing applies).
    pub fn is_replicated(self) -> bool {
        matches!(self, Level::Raif1 | Level::Raif10)
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Level::Raif0 => "raif0",
            Level::Raif1 => "raif1",
            Level::Raif4 => "raif4",
            Level::Raif5 => "raif5",
            Level::Raif6 => "raif6",
            Level::Raif10 => "raif10",
        };
        f.write_str(name)
    }
}

impl FromStr for Level {
    type Err = String;

    fn from_str(s: &str) -> Result<Level, String> {
        let lower = s.to_ascii_lowercase();
        let digits = lower
            .strip_prefix("raif")
            .or_else(|| lower.strip_prefix("raid"))
            .unwrap_or(&lower);
        match digits {
            "0" => Ok(Level::Raif0),
            "1" => Ok(Level::Raif1),
            "4" => Ok(Level::Raif4),
            "5" => Ok(Level::Raif5),
            "6" => Ok(Level::Raif6),
            "10" => Ok(Level::Raif10),
            _ => Err(format!(
                "unknown level {s:?} (raif0, raif1, raif4, raif5, raif6 or raif10)"
            )),
        }
    }
}
