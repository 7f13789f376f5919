//! Reading, writing, rebuilding and scrubbing one file's units through a
//! [`BranchIo`]: degraded reads rebuild lost units from mirrors or parity,
//! writes keep parity in step, and a branch that fails an I/O is marked
//! failed so that the rest of the mount runs degraded.

use crate::codec::{self, CodecError};
use crate::layout::{Layout, StripeMap};
use crate::level::Level;

/// The component files of one file, one per branch of its subset.
/// Bytes past a component's end read as zeros.
pub trait BranchIo {
    fn read_at(&self, branch: usize, offset: u64, buf: &mut [u8]) -> std::io::Result<()>;
    fn write_at(&self, branch: usize, offset: u64, data: &[u8]) -> std::io::Result<()>;
    /// Whether the branch is known to be failed (it is then never used).
    fn is_failed(&self, branch: usize) -> bool;
    /// Records that the branch failed an I/O: the mount is degraded.
    fn fail(&self, branch: usize, error: &std::io::Error);
    /// Which of `copies` (all healthy) to read first: the load balancer.
    fn choose(&self, copies: &[usize]) -> usize {
        copies[0]
    }
    /// Called when a write has put its new data in `stripe` (the data
    /// units, or a mirrored unit's first copy) and is about to write the
    /// redundancy (parity, or the other copies): the RAID write hole lies
    /// between the two. Nothing by default; a test hook can stop there.
    fn data_written(&self, _stripe: u64) {}
}

#[derive(Debug, thiserror::Error)]
pub enum RaidError {
    #[error("stripe {stripe}: {source}")]
    Lost {
        stripe: u64,
        #[source]
        source: CodecError,
    },
    #[error("stripe {stripe}: every copy of unit {unit} is on a failed branch")]
    NoCopy { stripe: u64, unit: usize },
}

/// What a scrub found in one stripe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub stripe: u64,
    /// Branches whose unit disagrees with what the data says it should be.
    pub branches: Vec<usize>,
}

/// Reads one unit's bytes from `branch`, marking it failed on error.
fn read_from(io: &dyn BranchIo, branch: usize, offset: u64, buf: &mut [u8]) -> bool {
    if io.is_failed(branch) {
        return false;
    }
    match io.read_at(branch, offset, buf) {
        Ok(()) => true,
        Err(e) => {
            io.fail(branch, &e);
            false
        }
    }
}

fn write_to(io: &dyn BranchIo, branch: usize, offset: u64, data: &[u8]) -> bool {
    if io.is_failed(branch) {
        return false;
    }
    match io.write_at(branch, offset, data) {
        Ok(()) => true,
        Err(e) => {
            io.fail(branch, &e);
            false
        }
    }
}

/// Copies in the order to try them: the balancer's choice first.
fn copy_order(io: &dyn BranchIo, copies: &[usize]) -> Vec<usize> {
    let healthy: Vec<usize> = copies
        .iter()
        .copied()
        .filter(|&b| !io.is_failed(b))
        .collect();
    if healthy.len() < 2 {
        return healthy;
    }
    let first = io.choose(&healthy);
    let mut order = vec![first];
    order.extend(healthy.into_iter().filter(|&b| b != first));
    order
}

/// Every unit of a stripe (data then parity), rebuilt where lost.
/// `skip` is a branch not to read (one being rebuilt).
pub fn read_stripe(
    layout: &Layout,
    io: &dyn BranchIo,
    stripe: u64,
    skip: Option<usize>,
) -> Result<Vec<Vec<u8>>, RaidError> {
    let map = layout.stripe_map(stripe);
    let unit = layout.stripe_unit_bytes as usize;
    let offset = layout.component_offset(stripe);
    let mut units: Vec<Option<Vec<u8>>> = Vec::with_capacity(map.data.len() + map.parity.len());
    let sources = map.data.iter().map(|c| c.as_slice());
    let sources = sources.chain(map.parity.iter().map(std::slice::from_ref));
    for copies in sources {
        let mut buf = vec![0u8; unit];
        let order = copy_order(io, copies);
        let found = order
            .into_iter()
            .filter(|&b| Some(b) != skip)
            .any(|b| read_from(io, b, offset, &mut buf));
        units.push(found.then_some(buf));
    }
    if layout.level.parity_units() == 0 {
        return units
            .into_iter()
            .enumerate()
            .map(|(unit, u)| u.ok_or(RaidError::NoCopy { stripe, unit }))
            .collect();
    }
    codec::recover(layout.level, &mut units)
        .map_err(|source| RaidError::Lost { stripe, source })?;
    Ok(units.into_iter().flatten().collect())
}

/// Reads `buf.len()` bytes of file data at `offset` (the caller keeps the
/// range within the file).
pub fn read(
    layout: &Layout,
    io: &dyn BranchIo,
    offset: u64,
    buf: &mut [u8],
) -> Result<(), RaidError> {
    for seg in layout.segments(offset, buf.len() as u64) {
        let map = layout.stripe_map(seg.stripe);
        let at = layout.component_offset(seg.stripe) + seg.unit_offset;
        let out = &mut buf[seg.buf_offset as usize..(seg.buf_offset + seg.len) as usize];
        let done = copy_order(io, &map.data[seg.unit])
            .into_iter()
            .any(|b| read_from(io, b, at, out));
        if !done {
            let units = read_stripe(layout, io, seg.stripe, None)?;
            let from = seg.unit_offset as usize;
            out.copy_from_slice(&units[seg.unit][from..from + out.len()]);
        }
    }
    Ok(())
}

/// Writes `data` at `offset`, keeping parity and mirrors in step. A unit
/// whose every copy is on a failed branch, or a parity stripe that lost
/// more units than its level survives, fails the write.
pub fn write(
    layout: &Layout,
    io: &dyn BranchIo,
    offset: u64,
    data: &[u8],
) -> Result<(), RaidError> {
    let segments = layout.segments(offset, data.len() as u64);
    if layout.level.parity_units() == 0 {
        for seg in segments {
            let map = layout.stripe_map(seg.stripe);
            let at = layout.component_offset(seg.stripe) + seg.unit_offset;
            let piece = &data[seg.buf_offset as usize..(seg.buf_offset + seg.len) as usize];
            let mut written = 0;
            for (copy, &b) in map.data[seg.unit].iter().enumerate() {
                if copy == 1 {
                    io.data_written(seg.stripe);
                }
                written += usize::from(write_to(io, b, at, piece));
            }
            if written == 0 {
                return Err(RaidError::NoCopy {
                    stripe: seg.stripe,
                    unit: seg.unit,
                });
            }
        }
        return Ok(());
    }
    let mut at = 0;
    while at < segments.len() {
        let stripe = segments[at].stripe;
        let end = segments[at..]
            .iter()
            .position(|s| s.stripe != stripe)
            .map_or(segments.len(), |n| at + n);
        write_parity_stripe(layout, io, stripe, &segments[at..end], data)?;
        at = end;
    }
    Ok(())
}

/// Read-modify-write of one parity stripe: the stripe's data (rebuilt if
/// need be, skipped when the write covers it all), the new bytes laid
/// over it, fresh parity, then the changed data units and the parity.
fn write_parity_stripe(
    layout: &Layout,
    io: &dyn BranchIo,
    stripe: u64,
    segments: &[crate::layout::Segment],
    data: &[u8],
) -> Result<(), RaidError> {
    let map = layout.stripe_map(stripe);
    let unit = layout.stripe_unit_bytes as usize;
    let k = map.data.len();
    let covered: u64 = segments.iter().map(|s| s.len).sum();
    let mut units = if covered == layout.stripe_data_bytes() {
        vec![vec![0u8; unit]; k]
    } else {
        let mut all = read_stripe(layout, io, stripe, None)?;
        all.truncate(k);
        all
    };
    let mut changed = vec![false; k];
    for seg in segments {
        let from = seg.unit_offset as usize;
        let piece = &data[seg.buf_offset as usize..(seg.buf_offset + seg.len) as usize];
        units[seg.unit][from..from + piece.len()].copy_from_slice(piece);
        changed[seg.unit] = true;
    }
    let refs: Vec<&[u8]> = units.iter().map(|u| u.as_slice()).collect();
    let parity =
        codec::parity(layout.level, &refs).map_err(|source| RaidError::Lost { stripe, source })?;
    let offset = layout.component_offset(stripe);
    let mut lost = 0;
    for j in (0..k).filter(|&j| changed[j]) {
        if !write_to(io, map.data[j][0], offset, &units[j]) {
            lost += 1;
        }
    }
    lost += (0..k)
        .filter(|&j| !changed[j] && io.is_failed(map.data[j][0]))
        .count();
    io.data_written(stripe);
    for (branch, unit) in map.parity.iter().zip(&parity) {
        if !write_to(io, *branch, offset, unit) {
            lost += 1;
        }
    }
    let tolerated = layout.level.parity_units();
    if lost > tolerated {
        return Err(RaidError::Lost {
            stripe,
            source: CodecError::TooManyLost {
                level: layout.level,
                missing: lost,
                tolerated,
            },
        });
    }
    Ok(())
}

/// The units of stripe `stripe` that belong on `branch`, computed from the
/// other branches and written there: how a replaced branch is refilled.
pub fn rebuild_stripe(
    layout: &Layout,
    io: &dyn BranchIo,
    stripe: u64,
    branch: usize,
) -> Result<(), RaidError> {
    let map = layout.stripe_map(stripe);
    let units = read_stripe(layout, io, stripe, Some(branch))?;
    let offset = layout.component_offset(stripe);
    for (index, holders) in all_holders(&map).iter().enumerate() {
        if holders.contains(&branch) {
            let _ = write_to(io, branch, offset, &units[index]);
        }
    }
    Ok(())
}

/// For each unit of the stripe in order (data, then parity), its branches.
fn all_holders(map: &StripeMap) -> Vec<Vec<usize>> {
    let mut holders = map.data.clone();
    holders.extend(map.parity.iter().map(|&b| vec![b]));
    holders
}

/// Checks that mirrors agree with the first healthy copy and parity with
/// the data; with `repair`, rewrites what disagrees from the data.
pub fn scrub_stripe(
    layout: &Layout,
    io: &dyn BranchIo,
    stripe: u64,
    repair: bool,
) -> Result<Option<Mismatch>, RaidError> {
    let map = layout.stripe_map(stripe);
    let unit = layout.stripe_unit_bytes as usize;
    let offset = layout.component_offset(stripe);
    let mut bad = Vec::new();
    let mut data = Vec::with_capacity(map.data.len());
    for (j, copies) in map.data.iter().enumerate() {
        let mut reference: Option<Vec<u8>> = None;
        for &b in copies {
            let mut buf = vec![0u8; unit];
            if !read_from(io, b, offset, &mut buf) {
                continue;
            }
            match &reference {
                None => reference = Some(buf),
                Some(r) if *r != buf => bad.push((b, j)),
                Some(_) => {}
            }
        }
        data.push(reference.ok_or(RaidError::NoCopy { stripe, unit: j })?);
    }
    let refs: Vec<&[u8]> = data.iter().map(|u| u.as_slice()).collect();
    let parity =
        codec::parity(layout.level, &refs).map_err(|source| RaidError::Lost { stripe, source })?;
    let mut bad_parity = Vec::new();
    for (&b, expected) in map.parity.iter().zip(&parity) {
        let mut buf = vec![0u8; unit];
        if read_from(io, b, offset, &mut buf) && buf != *expected {
            bad_parity.push((b, expected));
        }
    }
    if bad.is_empty() && bad_parity.is_empty() {
        return Ok(None);
    }
    if repair {
        for &(b, j) in &bad {
            let _ = write_to(io, b, offset, &data[j]);
        }
        for &(b, expected) in &bad_parity {
            let _ = write_to(io, b, offset, expected);
        }
    }
    let mut branches: Vec<usize> = bad.iter().map(|&(b, _)| b).collect();
    branches.extend(bad_parity.iter().map(|&(b, _)| b));
    Ok(Some(Mismatch { stripe, branches }))
}

/// Whether every unit of a file is still reachable with these branches
/// failed: false if some stripe lost more than its level survives.
pub fn survives(layout: &Layout, failed: &[usize]) -> bool {
    let rotations = layout.width as u64;
    (0..rotations).all(|stripe| {
        let map = layout.stripe_map(stripe);
        let lost_parity_stripe = all_holders(&map)
            .iter()
            .filter(|h| h.iter().all(|b| failed.contains(b)))
            .count();
        match layout.level {
            Level::Raif4 | Level::Raif5 | Level::Raif6 => {
                lost_parity_stripe <= layout.level.parity_units()
            }
            _ => lost_parity_stripe == 0,
        }
    })
}
