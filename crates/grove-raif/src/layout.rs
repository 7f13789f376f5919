//! Where a file's units live: the pure layout math, no I/O.
//!
//! A file is cut into stripe units of `stripe_unit_bytes`. Stripe `s`
//! holds `k` data units (k from the level) and the level's parity units,
//! one unit per branch, and every unit of stripe `s` sits at offset
//! `s * stripe_unit_bytes` of its branch's component file. A mirror copy
//! sits at the same offset as its original. Positions within a stripe are
//! rotated by the file's starting branch, so that files whose names hash
//! differently start (and keep their parity) on different branches:
//!
//! ```text
//! RAIF5 over 4 branches, start 0
//!   branch:  0   1   2   3
//!   s0:      D0  D1  D2  P
//!   s1:      D4  D5  P   D3
//!   s2:      D8  P   D6  D7
//! ```
//!
//! Exactly: RAIF5's parity of stripe `s` is at position `p = (n-1) - s mod n`
//! and data unit `j` at `(p + 1 + j) mod n` (left-symmetric, as md does);
//! RAIF6 puts P at `p`, Q at `p + 1` and data `j` at `p + 2 + j`; RAIF4
//! keeps parity at `n - 1`; RAIF10 puts data `j` on the pair `2j, 2j + 1`.
//! Branch = (position + start) mod n.

use crate::level::Level;

/// Smallest stripe unit: Reed-Solomon needs even units, and smaller units
/// only multiply requests.
pub const STRIPE_UNIT_MIN_BYTES: u64 = 512;
/// Largest stripe unit: one unit is held in memory per branch per stripe.
pub const STRIPE_UNIT_MAX_BYTES: u64 = 64 * 1024 * 1024;
/// The stripe unit when a rule gives none (the thesis's 64 KiB).
pub const STRIPE_UNIT_DEFAULT_BYTES: u64 = 64 * 1024;
/// Most branches one file may span (Reed-Solomon allows far more; this
/// keeps per-stripe buffers bounded).
pub const WIDTH_MAX: usize = 64;

/// The layout of one file over `width` branches of its branch subset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub level: Level,
    pub width: usize,
    pub stripe_unit_bytes: u64,
    /// Position 0 of every stripe sits on this branch (index in the subset).
    pub start: usize,
}

/// The branches of one stripe: for each data unit the branches that hold
/// a copy of it (one, but two for RAIF10 and `width` for RAIF1), then the
/// parity branches (P, then Q).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StripeMap {
    pub data: Vec<Vec<usize>>,
    pub parity: Vec<usize>,
}

/// One piece of a byte range that falls within a single data unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub stripe: u64,
    /// Which data unit of the stripe.
    pub unit: usize,
    /// Offset within the unit.
    pub unit_offset: u64,
    pub len: u64,
    /// Offset of the piece in the caller's buffer.
    pub buf_offset: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("{0}")]
    Width(String),
    #[error("stripe unit {0} bytes is not a power of two")]
    UnitNotPowerOfTwo(u64),
    #[error("stripe unit {0} bytes is outside {STRIPE_UNIT_MIN_BYTES}..={STRIPE_UNIT_MAX_BYTES}")]
    UnitOutOfRange(u64),
    #[error("{0} branches is more than the {WIDTH_MAX} a file may span")]
    TooWide(usize),
    #[error("starting branch {start} is not below the width {width}")]
    StartOutOfRange { start: usize, width: usize },
}

/// Checks a stripe unit: a power of two within the limits.
pub fn check_stripe_unit(stripe_unit_bytes: u64) -> Result<(), LayoutError> {
    if !stripe_unit_bytes.is_power_of_two() {
        return Err(LayoutError::UnitNotPowerOfTwo(stripe_unit_bytes));
    }
    if !(STRIPE_UNIT_MIN_BYTES..=STRIPE_UNIT_MAX_BYTES).contains(&stripe_unit_bytes) {
        return Err(LayoutError::UnitOutOfRange(stripe_unit_bytes));
    }
    Ok(())
}

impl Layout {
    pub fn new(
        level: Level,
        width: usize,
        stripe_unit_bytes: u64,
        start: usize,
    ) -> Result<Layout, LayoutError> {
        level.check_width(width).map_err(LayoutError::Width)?;
        if width > WIDTH_MAX {
            return Err(LayoutError::TooWide(width));
        }
        check_stripe_unit(stripe_unit_bytes)?;
        if start >= width {
            return Err(LayoutError::StartOutOfRange { start, width });
        }
        Ok(Layout {
            level,
            width,
            stripe_unit_bytes,
            start,
        })
    }

    /// Data units per stripe.
    pub fn data_units(&self) -> usize {
        self.level.data_units(self.width)
    }

    /// Bytes of file data in one stripe.
    pub fn stripe_data_bytes(&self) -> u64 {
        self.data_units() as u64 * self.stripe_unit_bytes
    }

    /// Stripes that hold a file of `size_bytes` (the last may be partial).
    pub fn stripe_count(&self, size_bytes: u64) -> u64 {
        size_bytes.div_ceil(self.stripe_data_bytes())
    }

    /// Length of every component file for a file of `size_bytes`: whole
    /// units, so that parity of a partial last stripe covers zeros.
    pub fn component_bytes(&self, size_bytes: u64) -> u64 {
        self.stripe_count(size_bytes) * self.stripe_unit_bytes
    }

    /// Offset of stripe `stripe`'s units in each component file.
    pub fn component_offset(&self, stripe: u64) -> u64 {
        stripe * self.stripe_unit_bytes
    }

    fn branch(&self, position: usize) -> usize {
        (position + self.start) % self.width
    }

    /// The branches of stripe `stripe`.
    pub fn stripe_map(&self, stripe: u64) -> StripeMap {
        let n = self.width;
        let k = self.data_units();
        let rotation = (stripe % n as u64) as usize;
        let (data, parity): (Vec<Vec<usize>>, Vec<usize>) = match self.level {
            Level::Raif0 => ((0..n).map(|j| vec![j]).collect(), vec![]),
            Level::Raif1 => (vec![(0..n).collect()], vec![]),
            Level::Raif4 => ((0..k).map(|j| vec![j]).collect(), vec![n - 1]),
            Level::Raif5 => {
                let p = n - 1 - rotation;
                let data = (0..k).map(|j| vec![(p + 1 + j) % n]).collect();
                (data, vec![p])
            }
            Level::Raif6 => {
                let p = n - 1 - rotation;
                let data = (0..k).map(|j| vec![(p + 2 + j) % n]).collect();
                (data, vec![p, (p + 1) % n])
            }
            Level::Raif10 => ((0..k).map(|j| vec![2 * j, 2 * j + 1]).collect(), vec![]),
        };
        StripeMap {
            data: data
                .into_iter()
                .map(|copies| copies.into_iter().map(|p| self.branch(p)).collect())
                .collect(),
            parity: parity.into_iter().map(|p| self.branch(p)).collect(),
        }
    }

    /// Cuts the byte range `offset..offset + len` into per-unit pieces.
    pub fn segments(&self, offset: u64, len: u64) -> Vec<Segment> {
        let unit = self.stripe_unit_bytes;
        let k = self.data_units() as u64;
        let mut pieces = Vec::new();
        let mut done = 0;
        while done < len {
            let at = offset + done;
            let unit_index = at / unit;
            let unit_offset = at % unit;
            let piece = (unit - unit_offset).min(len - done);
            pieces.push(Segment {
                stripe: unit_index / k,
                unit: (unit_index % k) as usize,
                unit_offset,
                len: piece,
                buf_offset: done,
            });
            done += piece;
        }
        pieces
    }

    /// The branch holding the file's first data unit: where its metadata
    /// lives when the file's layout and the mount agree on the subset.
    pub fn first_branch(&self) -> usize {
        self.stripe_map(0).data[0][0]
    }
}

/// FNV-1a, 64 bits: a stable hash of a file name, the same on every
/// machine and in every version, so a file's starting branch never moves.
pub fn name_hash(name: &[u8]) -> u64 {
    const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
    name.iter().fold(FNV_OFFSET, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(FNV_PRIME)
    })
}

/// The starting branch of a file named `name` over `width` branches.
pub fn start_branch(name: &[u8], width: usize) -> usize {
    (name_hash(name) % width.max(1) as u64) as usize
}
