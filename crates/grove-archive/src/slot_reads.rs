//! Many scattered slots of one pack in few requests: the wanted slots are
//! grouped into spans, one ranged read each, that also read through short
//! gaps (on an object store a request costs about as much as a few hundred
//! KiB more of one read), and the spans are fetched a window at a time with
//! several requests in flight, so that the bytes held stay bounded.

use crate::archive::Archive;
use crate::error::Result;
use crate::format::pack::PackHeader;
use std::ops::Range;

/// Unwanted bytes read through rather than making two requests of one.
const GAP_BYTES: u64 = 256 << 10;
/// The longest span, in bytes.
const SPAN_BYTES: u64 = 4 << 20;
/// The spans fetched together at most, in bytes: what a read holds.
const WINDOW_BYTES: u64 = 8 << 20;

/// The runs of slots (spans) that cover `slots` (ascending, distinct): a
/// gap of at most `gap_slots` unwanted slots is read through, and no span
/// is longer than `span_slots` (at least 1).
pub(crate) fn plan(slots: &[u32], gap_slots: u32, span_slots: u32) -> Vec<Range<u32>> {
    let span_slots = span_slots.max(1);
    let mut spans: Vec<Range<u32>> = Vec::new();
    for &slot in slots {
        match spans.last_mut() {
            Some(span)
                if slot >= span.end
                    && slot - span.end <= gap_slots
                    && slot - span.start < span_slots =>
            {
                span.end = slot + 1;
            }
            _ => spans.push(slot..slot + 1),
        }
    }
    spans
}

/// Hands `visit` the data of each of `slots` (ascending, distinct) of the
/// pack `header` describes, in order, each checked.
pub(crate) fn for_each_slot(
    archive: &Archive,
    header: &PackHeader,
    slots: &[u32],
    visit: &mut dyn FnMut(u32, &[u8]) -> Result<()>,
) -> Result<()> {
    debug_assert!(slots.windows(2).all(|w| w[0] < w[1]), "ascending slots");
    let slot_bytes = header.slot_bytes();
    let spans = plan(
        slots,
        (GAP_BYTES / slot_bytes) as u32,
        (SPAN_BYTES / slot_bytes) as u32,
    );
    let span_bytes = |span: &Range<u32>| u64::from(span.end - span.start) * slot_bytes;
    let mut wanted = slots.iter().copied().peekable();
    let mut start = 0;
    while start < spans.len() {
        let mut end = start + 1;
        let mut held = span_bytes(&spans[start]);
        while end < spans.len() && held + span_bytes(&spans[end]) <= WINDOW_BYTES {
            held += span_bytes(&spans[end]);
            end += 1;
        }
        let window = &spans[start..end];
        let records = archive.read_spans(header, window)?;
        for (span, bytes) in window.iter().zip(&records) {
            while let Some(slot) = wanted.next_if(|&s| s < span.end) {
                let at = (u64::from(slot - span.start) * slot_bytes) as usize;
                let record = &bytes[at..at + slot_bytes as usize];
                visit(slot, archive.checked_slot(header, slot, record)?)?;
            }
        }
        start = end;
    }
    debug_assert!(wanted.next().is_none(), "every wanted slot visited");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spans(slots: &[u32], gap: u32, longest: u32) -> Vec<(u32, u32)> {
        plan(slots, gap, longest)
            .into_iter()
            .map(|s| (s.start, s.end - s.start))
            .collect()
    }

    #[test]
    fn consecutive_slots_are_one_span() {
        assert_eq!(spans(&[3, 4, 5, 6], 0, 100), vec![(3, 4)]);
        assert_eq!(spans(&[], 4, 100), vec![]);
        assert_eq!(spans(&[7], 4, 100), vec![(7, 1)]);
    }

    #[test]
    fn short_gaps_are_read_through_and_long_ones_split() {
        // Gaps of 2 and 4 unwanted slots, then one of 5.
        assert_eq!(spans(&[0, 3, 8, 14], 4, 100), vec![(0, 9), (14, 1)]);
        assert_eq!(
            spans(&[0, 3, 8, 14], 0, 100),
            vec![(0, 1), (3, 1), (8, 1), (14, 1)]
        );
    }

    #[test]
    fn no_span_is_longer_than_asked() {
        let slots: Vec<u32> = (0..10).collect();
        assert_eq!(spans(&slots, 0, 4), vec![(0, 4), (4, 4), (8, 2)]);
        assert_eq!(spans(&[0, 2, 4, 6], 8, 3), vec![(0, 3), (4, 3)]);
        assert_eq!(spans(&[0, 1], 8, 0), vec![(0, 1), (1, 1)]);
    }

    #[test]
    fn every_wanted_slot_is_in_exactly_one_span() {
        let slots: Vec<u32> = (0..500u32).filter(|s| s % 7 == 0 || s % 11 == 3).collect();
        for (gap, longest) in [(0, 1), (3, 16), (10, 64), (100, 1000)] {
            let planned = plan(&slots, gap, longest);
            for &slot in &slots {
                let holding = planned.iter().filter(|s| s.contains(&slot)).count();
                assert_eq!(holding, 1, "slot {slot} with gap {gap}, longest {longest}");
            }
            for span in &planned {
                assert!(span.end - span.start <= longest.max(1));
                assert!(slots.contains(&span.start));
                assert!(slots.contains(&(span.end - 1)));
            }
        }
    }
}
