//! `check`'s look at where mapped data lives. Data blocks carry no
//! checksum, so damage inside one goes unseen; but a device that keeps its
//! bytes in pieces it can lose apart (RADOS objects) can say which pieces
//! under mapped data are gone or cut short. The blocks come in address
//! order, so each piece's need is known once the blocks move past it, and
//! the pieces go to the device a bounded batch at a time.

use crate::device::BlockDevice;
use std::io;

/// Pieces asked of the device at once, at most.
const PIECES_PER_ASK: usize = 4096;

/// One line for each piece of `device` that should hold some of the data
/// blocks `blocks` (addresses, ascending) but is missing or too short.
pub(crate) fn lost_pieces_under(
    device: &dyn BlockDevice,
    blocks: impl Iterator<Item = u64>,
    block_bytes: u64,
) -> io::Result<Vec<String>> {
    let Some(piece_bytes) = device.piece_bytes().filter(|&bytes| bytes > 0) else {
        return Ok(Vec::new());
    };
    let mut lost = Vec::new();
    let mut needed: Vec<(u64, u64)> = Vec::with_capacity(PIECES_PER_ASK);
    for addr in blocks {
        let start = addr.saturating_mul(block_bytes);
        let end = start.saturating_add(block_bytes);
        for index in start / piece_bytes..end.div_ceil(piece_bytes) {
            let need = (end - index * piece_bytes).min(piece_bytes);
            note_need(&mut needed, index, need);
        }
        if needed.len() > PIECES_PER_ASK {
            // All but the last piece are complete: later blocks lie past them.
            let last = needed.pop().expect("more than PIECES_PER_ASK pieces");
            lost.extend(device.lost_pieces(&needed)?);
            needed.clear();
            needed.push(last);
        }
    }
    lost.extend(device.lost_pieces(&needed)?);
    Ok(lost)
}

/// Piece `index` must hold at least `need` bytes from its start.
fn note_need(needed: &mut Vec<(u64, u64)>, index: u64, need: u64) {
    match needed.last_mut() {
        Some((last, most)) if *last == index => *most = (*most).max(need),
        Some((last, _)) => {
            assert!(*last < index, "blocks come in address order");
            needed.push((index, need));
        }
        None => needed.push((index, need)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemDevice;
    use std::sync::Mutex;

    /// A memory device in pieces of 16 KiB that records what is asked.
    struct Pieces {
        inner: MemDevice,
        asked: Mutex<Vec<(u64, u64)>>,
        /// How many pieces each call asked about.
        calls: Mutex<Vec<usize>>,
    }

    impl BlockDevice for Pieces {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            self.inner.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
            self.inner.write_at(buf, offset)
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
        fn len_bytes(&self) -> io::Result<u64> {
            self.inner.len_bytes()
        }
        fn set_len_bytes(&self, len_bytes: u64) -> io::Result<()> {
            self.inner.set_len_bytes(len_bytes)
        }
        fn describe(&self) -> String {
            "pieces".to_string()
        }
        fn piece_bytes(&self) -> Option<u64> {
            Some(16 << 10)
        }
        fn lost_pieces(&self, needed: &[(u64, u64)]) -> io::Result<Vec<String>> {
            self.asked.lock().unwrap().extend_from_slice(needed);
            self.calls.lock().unwrap().push(needed.len());
            Ok(needed
                .iter()
                .filter(|(index, _)| index % 2 == 1)
                .map(|(index, need)| format!("piece {index} lost ({need} bytes needed)"))
                .collect())
        }
    }

    #[test]
    fn each_piece_is_asked_once_for_its_furthest_block() {
        let device = Pieces {
            inner: MemDevice::new(),
            asked: Mutex::new(Vec::new()),
            calls: Mutex::new(Vec::new()),
        };
        // 4 KiB blocks: 0 and 2 in piece 0, 5 in piece 1, 12 in piece 3.
        let lost = lost_pieces_under(&device, [0, 2, 5, 12].into_iter(), 4096).unwrap();
        assert_eq!(
            *device.asked.lock().unwrap(),
            vec![(0, 12288), (1, 8192), (3, 4096)]
        );
        assert_eq!(
            lost,
            vec![
                "piece 1 lost (8192 bytes needed)",
                "piece 3 lost (4096 bytes needed)"
            ]
        );
    }

    #[test]
    fn a_block_larger_than_a_piece_needs_every_piece_it_covers() {
        let device = Pieces {
            inner: MemDevice::new(),
            asked: Mutex::new(Vec::new()),
            calls: Mutex::new(Vec::new()),
        };
        // 64 KiB blocks over 16 KiB pieces: block 1 is pieces 4 to 7.
        lost_pieces_under(&device, [1].into_iter(), 64 << 10).unwrap();
        let full = 16 << 10;
        assert_eq!(
            *device.asked.lock().unwrap(),
            vec![(4, full), (5, full), (6, full), (7, full)]
        );
    }

    #[test]
    fn many_pieces_go_in_bounded_batches_and_none_is_split() {
        let device = Pieces {
            inner: MemDevice::new(),
            asked: Mutex::new(Vec::new()),
            calls: Mutex::new(Vec::new()),
        };
        let blocks = (0..(PIECES_PER_ASK as u64 * 3)).map(|piece| piece * 4);
        lost_pieces_under(&device, blocks, 4096).unwrap();
        let asked = device.asked.lock().unwrap();
        assert_eq!(asked.len(), PIECES_PER_ASK * 3);
        assert!(asked.windows(2).all(|w| w[0].0 < w[1].0));
        let calls = device.calls.lock().unwrap();
        assert!(calls.len() >= 3, "{calls:?}");
        assert!(calls.iter().all(|&n| n <= PIECES_PER_ASK), "{calls:?}");
    }
}
