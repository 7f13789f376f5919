//! Data the pool maps must be there. An object exists only once written,
//! so a missing one reads as a hole (device.rs), as storage never written
//! does. But the engine reads a volume's data only where it mapped a block
//! after writing it whole, so there the object must exist and reach past
//! the block: a read that finds it missing or cut short found damage (an
//! object lost or removed outside grove), and refuses with one line naming
//! it rather than return zeros. `grove check` asks the same of every
//! object under mapped data, one stat each.

use crate::device::{RadosDevice, Shared};
use crate::io_pool::Op;
use crate::layout::Piece;
use std::io;
use std::sync::Arc;

/// Objects stat'ed at once by one `lost_objects` call, at most: the
/// caller's list is taken a batch at a time.
const STATS_PER_BATCH: usize = 256;

impl RadosDevice {
    /// `BlockDevice::lost_pieces`: each (object index, bytes needed from
    /// its start) whose object is missing or shorter, as one line.
    pub(crate) fn lost_objects(&self, needed: &[(u64, u64)]) -> io::Result<Vec<String>> {
        let mut lost = Vec::new();
        for batch in needed.chunks(STATS_PER_BATCH) {
            let ops: Vec<Op<Option<String>>> = batch
                .iter()
                .map(|&(index, needed_bytes)| {
                    let shared = Arc::clone(&self.shared);
                    let op: Op<Option<String>> =
                        Box::new(move || shared.lost_object(index, needed_bytes));
                    op
                })
                .collect();
            lost.extend(self.run_ops(ops)?.into_iter().flatten());
        }
        Ok(lost)
    }
}

impl Shared {
    /// One object's piece of `BlockDevice::read_written_at`: `read_piece`,
    /// but a missing object, or one that ends before the piece, is an
    /// error naming it.
    pub(crate) fn read_written_piece(&self, piece: Piece) -> io::Result<Vec<u8>> {
        let needed_bytes = piece.object_offset + piece.len as u64;
        match self.read_stored(piece)? {
            None => Err(self.lost(piece.index, None, needed_bytes)),
            Some(data) if data.len() < piece.len => {
                let size = piece.object_offset + data.len() as u64;
                Err(self.lost(piece.index, Some(size), needed_bytes))
            }
            Some(data) => Ok(data),
        }
    }

    /// The line for object `index` if it is missing or shorter than
    /// `needed_bytes`; None if it holds them.
    fn lost_object(&self, index: u64, needed_bytes: u64) -> io::Result<Option<String>> {
        let size = self.object_len(&self.object_name(index))?;
        if size.is_some_and(|size| size >= needed_bytes) {
            return Ok(None);
        }
        Ok(Some(self.lost(index, size, needed_bytes).to_string()))
    }

    /// Damage to object `index`: missing (`size` None), or `size` bytes
    /// long where the pool maps data up to byte `needed_bytes` of it.
    fn lost(&self, index: u64, size: Option<u64>, needed_bytes: u64) -> io::Error {
        let object = format!(
            "RADOS object {} of pool {}",
            self.object_name(index),
            self.target.pool
        );
        let message = match size {
            None => format!("{object} is missing, yet the pool maps data in it (lost or removed outside grove)"),
            Some(size) => format!(
                "{object} is {size} bytes, yet the pool maps data up to byte {needed_bytes} of it (cut short outside grove)"
            ),
        };
        io::Error::new(io::ErrorKind::InvalidData, message)
    }
}
