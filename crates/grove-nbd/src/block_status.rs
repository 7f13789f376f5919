//! Block status answers: `base:allocation`, computed from a volume's mapped
//! extents (data where the volume maps blocks, holes that read as zeros
//! everywhere else), and `grove:changed:BASE`, computed from the extents
//! where the volume differs from BASE. Nothing here reads data, and nothing
//! here does I/O.

use crate::codec::{Descriptor, STATE_CHANGED, STATE_HOLE, STATE_ZERO};

/// Most descriptors in one block status chunk (one per selected context). The protocol asks for at
/// most 2^20; far fewer keeps a reply small, and clients ask again from
/// where a short reply ended.
pub const BLOCK_STATUS_DESCRIPTORS_MAX: usize = 1 << 16;

/// Status of an unmapped range: not allocated, reads as zeros.
pub const HOLE_FLAGS: u32 = STATE_HOLE | STATE_ZERO;
/// Status of a mapped range: allocated, contents unknown to this layer.
pub const DATA_FLAGS: u32 = 0;
/// Status of a range where the export differs from the base.
pub const CHANGED_FLAGS: u32 = STATE_CHANGED;
/// Status of a range where the export is the same as the base.
pub const UNCHANGED_FLAGS: u32 = 0;

/// Describes `[offset, offset + length)` from `extents`, the volume's mapped
/// byte ranges as (offset, length), sorted and not overlapping. With
/// `req_one`, returns exactly one descriptor. The request must lie inside
/// the export and have a nonzero length (the caller validated it).
pub fn allocation_descriptors(
    extents: &[(u64, u64)],
    offset: u64,
    length: u32,
    req_one: bool,
    descriptors_max: usize,
) -> Vec<Descriptor> {
    let statuses = Statuses {
        inside: DATA_FLAGS,
        outside: HOLE_FLAGS,
    };
    descriptors(extents, statuses, offset, length, req_one, descriptors_max)
}

/// Describes `[offset, offset + length)` for `grove:changed:BASE` from
/// `changes`, the byte ranges where the volume differs from BASE as
/// (offset, length), sorted and not overlapping: [`CHANGED_FLAGS`] inside
/// them, [`UNCHANGED_FLAGS`] elsewhere. Otherwise as
/// [`allocation_descriptors`].
pub fn changed_descriptors(
    changes: &[(u64, u64)],
    offset: u64,
    length: u32,
    req_one: bool,
    descriptors_max: usize,
) -> Vec<Descriptor> {
    let statuses = Statuses {
        inside: CHANGED_FLAGS,
        outside: UNCHANGED_FLAGS,
    };
    descriptors(changes, statuses, offset, length, req_one, descriptors_max)
}

/// The flags of a context's two states: inside the listed extents, and
/// outside them.
#[derive(Clone, Copy)]
struct Statuses {
    inside: u32,
    outside: u32,
}

fn descriptors(
    extents: &[(u64, u64)],
    statuses: Statuses,
    offset: u64,
    length: u32,
    req_one: bool,
    descriptors_max: usize,
) -> Vec<Descriptor> {
    assert!(length > 0, "block status of an empty range");
    assert!(descriptors_max > 0);
    let end = offset + u64::from(length);
    let mut out: Vec<Descriptor> = Vec::new();
    let push = |len: u64, flags: u32, out: &mut Vec<Descriptor>| {
        // Every piece lies inside a request of at most u32::MAX bytes.
        let len = u32::try_from(len).expect("piece is shorter than the request");
        debug_assert!(len > 0);
        match out.last_mut() {
            // Engines may return touching extents; the protocol prefers
            // different statuses in consecutive descriptors.
            Some(last) if last.flags == flags => last.length += len,
            _ => out.push(Descriptor { length: len, flags }),
        }
    };
    // First extent that ends after `offset`.
    let mut index = extents.partition_point(|&(start, len)| start.saturating_add(len) <= offset);
    let mut position = offset;
    while position < end {
        if out.len() >= descriptors_max || (req_one && !out.is_empty()) {
            // Only stop at a boundary between descriptors: the last one may
            // still be growing from merged extents.
            let last_flags = out.last().map(|d| d.flags);
            let next_flags = match extents.get(index) {
                Some(&(start, _)) if start <= position => statuses.inside,
                _ => statuses.outside,
            };
            if Some(next_flags) != last_flags {
                break;
            }
        }
        match extents.get(index) {
            Some(&(start, len)) if start <= position => {
                let piece_end = start.saturating_add(len).min(end);
                push(piece_end - position, statuses.inside, &mut out);
                position = piece_end;
                index += 1;
            }
            next => {
                let piece_end = next.map_or(end, |&(start, _)| start.min(end));
                push(piece_end - position, statuses.outside, &mut out);
                position = piece_end;
            }
        }
    }
    debug_assert!(!out.is_empty());
    debug_assert!(out.iter().map(|d| u64::from(d.length)).sum::<u64>() <= u64::from(length));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(length: u32, flags: u32) -> Descriptor {
        Descriptor { length, flags }
    }

    #[test]
    fn holes_and_data_alternate() {
        let extents = [(4096, 4096), (16384, 8192)];
        let got = allocation_descriptors(&extents, 0, 32768, false, 100);
        assert_eq!(
            got,
            vec![
                d(4096, HOLE_FLAGS),
                d(4096, DATA_FLAGS),
                d(8192, HOLE_FLAGS),
                d(8192, DATA_FLAGS),
                d(8192, HOLE_FLAGS),
            ]
        );
    }

    #[test]
    fn ranges_that_start_and_end_inside_extents() {
        let extents = [(4096, 4096), (16384, 8192)];
        let got = allocation_descriptors(&extents, 6000, 12000, false, 100);
        assert_eq!(
            got,
            vec![
                d(2192, DATA_FLAGS),
                d(8192, HOLE_FLAGS),
                d(1616, DATA_FLAGS)
            ]
        );
        let total: u32 = got.iter().map(|d| d.length).sum();
        assert_eq!(total, 12000);
    }

    #[test]
    fn touching_extents_merge() {
        let extents = [(0, 4096), (4096, 4096)];
        assert_eq!(
            allocation_descriptors(&extents, 0, 16384, false, 100),
            vec![d(8192, DATA_FLAGS), d(8192, HOLE_FLAGS)]
        );
    }

    #[test]
    fn req_one_and_the_descriptor_cap() {
        let extents = [(4096, 4096), (16384, 8192)];
        assert_eq!(
            allocation_descriptors(&extents, 0, 32768, true, 100),
            vec![d(4096, HOLE_FLAGS)]
        );
        assert_eq!(
            allocation_descriptors(&extents, 4096, 32768 - 4096, true, 100),
            vec![d(4096, DATA_FLAGS)]
        );
        assert_eq!(
            allocation_descriptors(&extents, 0, 32768, false, 2).len(),
            2
        );
        assert_eq!(
            allocation_descriptors(&[], 0, 512, false, 1),
            vec![d(512, HOLE_FLAGS)]
        );
    }

    #[test]
    fn changed_ranges_are_flagged_and_the_rest_is_not() {
        // Changes as a diff reports them: whole blocks, touching runs of
        // rewritten data and of unmapped holes.
        let changes = [(0, 4096), (4096, 8192), (32768, 4096)];
        assert_eq!(
            changed_descriptors(&changes, 0, 65536, false, 100),
            vec![
                d(12288, CHANGED_FLAGS),
                d(20480, UNCHANGED_FLAGS),
                d(4096, CHANGED_FLAGS),
                d(28672, UNCHANGED_FLAGS),
            ]
        );
        // A window that starts and ends inside changed runs.
        assert_eq!(
            changed_descriptors(&changes, 6000, 28000, false, 100),
            vec![
                d(6288, CHANGED_FLAGS),
                d(20480, UNCHANGED_FLAGS),
                d(1232, CHANGED_FLAGS),
            ]
        );
        // Nothing changed: one unchanged descriptor for the whole window.
        assert_eq!(
            changed_descriptors(&[], 512, 1 << 20, false, 100),
            vec![d(1 << 20, UNCHANGED_FLAGS)]
        );
    }

    #[test]
    fn changed_req_one_and_the_descriptor_cap() {
        let changes = [(4096, 4096), (16384, 8192)];
        assert_eq!(
            changed_descriptors(&changes, 0, 32768, true, 100),
            vec![d(4096, UNCHANGED_FLAGS)]
        );
        assert_eq!(
            changed_descriptors(&changes, 5000, 32768 - 5000, true, 100),
            vec![d(3192, CHANGED_FLAGS)]
        );
        let capped = changed_descriptors(&changes, 0, 32768, false, 3);
        assert_eq!(
            capped,
            vec![
                d(4096, UNCHANGED_FLAGS),
                d(4096, CHANGED_FLAGS),
                d(8192, UNCHANGED_FLAGS),
            ]
        );
        // The cap never splits a run that merges several changes.
        let touching = [(0, 4096), (4096, 4096), (8192, 4096)];
        assert_eq!(
            changed_descriptors(&touching, 0, 16384, false, 1),
            vec![d(12288, CHANGED_FLAGS)]
        );
    }
}
