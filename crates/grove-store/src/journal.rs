//! The metadata journal: where transactions go in the circular journal
//! region, and how they are found again at replay.
//!
//! A transaction is written contiguously: at the write position if it fits
//! before the end of the region, else at the region's start. Replay looks at
//! the position after the previous transaction and, failing that, at the
//! region's start; the sequence number tells a live transaction from a stale
//! one of an earlier lap, and the checksums tell a complete one from a torn
//! one. The checkpoint moves the replay start (the head, in the superblock)
//! up to the write position, after which the whole region is free again.

use crate::device::BlockDevice;
use crate::error::{Error, Result};
use crate::format::journal::Descriptor;
use crate::types::BlockAddr;

/// A transaction read back from the journal.
pub struct ReplayedTransaction {
    pub descriptor: Descriptor,
    pub images: Vec<Vec<u8>>,
}

pub struct Journal {
    /// First block of the region.
    start: BlockAddr,
    /// Blocks in the region.
    blocks: u64,
    block_size_bytes: usize,
    /// Where replay starts: the position after the last checkpoint.
    head: u64,
    /// Sequence number of the transaction at the head.
    head_sequence: u64,
    /// Where the next transaction goes, if it fits there.
    next: u64,
    /// Sequence number of the next transaction.
    sequence: u64,
    /// Blocks written (or skipped at the end of a lap) since the checkpoint.
    used_blocks: u64,
    /// An append failed, and may have left a transaction with the current
    /// sequence behind. That sequence is burnt, and nothing more is
    /// appended until a checkpoint has recorded the next one: replay can
    /// then never take the failed attempt for its retry.
    checkpoint_required: bool,
}

impl Journal {
    pub fn new(
        start: BlockAddr,
        blocks: u64,
        block_size_bytes: u32,
        head: u64,
        sequence: u64,
    ) -> Journal {
        Journal {
            start,
            blocks,
            block_size_bytes: block_size_bytes as usize,
            head,
            head_sequence: sequence,
            next: head,
            sequence,
            used_blocks: 0,
            checkpoint_required: false,
        }
    }

    /// Largest transaction, in blocks, that a commit may write: half the
    /// region, so a transaction always fits after a checkpoint.
    pub fn max_transaction_blocks(&self) -> u64 {
        self.blocks / 2
    }

    /// True when a checkpoint is due: replay must stay short.
    pub fn wants_checkpoint(&self) -> bool {
        self.used_blocks > self.blocks / 2
    }

    /// No transaction has been written since the last checkpoint.
    pub fn is_empty(&self) -> bool {
        self.used_blocks == 0
    }

    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// The replay start a checkpoint taken now would record.
    pub fn write_position(&self) -> u64 {
        self.next
    }

    /// Records that a checkpoint made everything up to the write position
    /// durable at home.
    pub fn checkpointed(&mut self) {
        assert!(
            self.next <= self.blocks,
            "the write position is inside the journal"
        );
        self.head = self.next;
        self.head_sequence = self.sequence;
        self.used_blocks = 0;
        self.checkpoint_required = false;
        debug_assert!(self.is_empty() && self.head == self.next);
    }

    /// Where a transaction of `len` blocks would go, or None if it needs a
    /// checkpoint first.
    fn placement(&self, len: u64) -> Option<u64> {
        assert!(len <= self.max_transaction_blocks());
        if self.checkpoint_required {
            return None;
        }
        if self.used_blocks == 0 {
            return Some(if self.next + len <= self.blocks {
                self.next
            } else {
                0
            });
        }
        // Back at the head with something written: the journal is full.
        if self.next == self.head {
            return None;
        }
        if self.next > self.head {
            if self.next + len <= self.blocks {
                Some(self.next)
            } else if len <= self.head {
                Some(0)
            } else {
                None
            }
        } else if self.next + len <= self.head {
            Some(self.next)
        } else {
            None
        }
    }

    /// True if a transaction of `len` blocks can be written without a checkpoint.
    pub fn fits(&self, len: u64) -> bool {
        self.placement(len).is_some()
    }

    /// Claims room for a transaction of `len` blocks and moves past it as
    /// if it were written; returns the byte offset where it goes. The
    /// caller checked `fits`, then writes the transaction with
    /// [`write_transaction`] (perhaps without the pool's state lock) and
    /// calls [`Journal::append_failed`] if that fails.
    pub fn reserve(&mut self, len: u64) -> u64 {
        let position = self.placement(len).expect("the caller made room");
        // A lap's unused tail counts as used until the next checkpoint.
        let skipped = if position == 0 && self.next != 0 {
            self.blocks - self.next
        } else {
            0
        };
        self.used_blocks += skipped + len;
        self.next = position + len;
        // Open refuses a sequence within JOURNAL_SEQUENCE_HEADROOM of
        // wrapping: no run commits that many transactions.
        self.sequence = self
            .sequence
            .checked_add(1)
            .expect("the journal sequence has headroom");
        assert!(self.used_blocks <= self.blocks);
        assert!(
            self.next <= self.blocks,
            "a transaction ends inside the journal"
        );
        (self.start.0 + position) * self.block_size_bytes as u64
    }

    /// A reserved transaction could not be written, and may have left
    /// part of itself behind. Its sequence stays burnt, and nothing more is
    /// appended until a checkpoint has recorded a later one: replay can
    /// then never take the failed attempt for a retry.
    pub fn append_failed(&mut self) {
        // Only a reserved transaction can fail: something was appended.
        debug_assert!(!self.is_empty(), "a failed append without a reservation");
        self.checkpoint_required = true;
        debug_assert!(!self.fits(0));
    }

    /// Writes a transaction (descriptor blocks then images, as one write)
    /// and makes it durable. The caller checked `fits`.
    pub fn append(
        &mut self,
        device: &dyn BlockDevice,
        descriptor: &[u8],
        images: &[Vec<u8>],
    ) -> Result<()> {
        let bytes = transaction_bytes(self.block_size_bytes, descriptor, images);
        let offset = self.reserve((bytes.len() / self.block_size_bytes) as u64);
        debug_assert!(!self.is_empty());
        let written = write_transaction(device, offset, &bytes);
        if written.is_err() {
            self.append_failed();
        }
        written
    }

    /// Reads the journal back from the head without changing anything, and
    /// checks that it holds exactly the transactions written since the last
    /// checkpoint. Returns how many there are.
    pub fn verify(&self, device: &dyn BlockDevice, pool_uuid: &[u8; 16]) -> Result<u64> {
        let mut reader = Journal::new(
            self.start,
            self.blocks,
            self.block_size_bytes as u32,
            self.head,
            self.head_sequence,
        );
        let found = reader.scan(device, pool_uuid)?;
        if reader.sequence != self.sequence || reader.next != self.next {
            return Err(Error::corrupt(format!(
                "journal: transactions {} to {} were committed but only {} can be read back (damaged journal)",
                self.head_sequence,
                self.sequence.saturating_sub(1),
                found.len()
            )));
        }
        Ok(found.len() as u64)
    }

    /// Reads every complete transaction from the head on, in order, and
    /// leaves the journal positioned after the last one.
    ///
    /// The journal ends at the first position where the next sequence is
    /// not found whole. After a crash that is a torn transaction, the last
    /// one written: each transaction is flushed before the next is written,
    /// so none can follow it. If one does follow (damage in the middle, not
    /// a crash), the transactions from the damaged one on were all
    /// acknowledged: the scan refuses, rather than drop them in silence.
    pub fn scan(
        &mut self,
        device: &dyn BlockDevice,
        pool_uuid: &[u8; 16],
    ) -> Result<Vec<ReplayedTransaction>> {
        let mut found = Vec::new();
        let mut position = self.head;
        let mut reader = ReadAhead::new(device, self);
        loop {
            let mut candidate = self.read_transaction(&mut reader, position, pool_uuid)?;
            let mut at = position;
            if !matches!(candidate, Candidate::Whole(..)) && position != 0 {
                let at_start = self.read_transaction(&mut reader, 0, pool_uuid)?;
                if matches!(at_start, Candidate::Whole(..)) || !matches!(candidate, Candidate::Torn)
                {
                    candidate = at_start;
                    at = 0;
                }
            }
            let (transaction, len) = match candidate {
                Candidate::Whole(transaction, len) => (transaction, len),
                Candidate::Absent => break,
                Candidate::Torn => {
                    self.refuse_if_a_later_transaction_follows(&mut reader, pool_uuid)?;
                    break;
                }
            };
            let skipped = if at == 0 && position != 0 {
                self.blocks - position
            } else {
                0
            };
            self.used_blocks += skipped + len;
            position = at + len;
            // Open refuses a sequence within JOURNAL_SEQUENCE_HEADROOM of
            // wrapping, and a journal holds far fewer transactions.
            self.sequence = self.sequence.checked_add(1).ok_or_else(|| {
                Error::corrupt("journal: the sequence numbers of its transactions wrap around")
            })?;
            found.push(transaction);
            if self.used_blocks > self.blocks {
                return Err(Error::corrupt(
                    "the journal holds more transactions than fit in it",
                ));
            }
        }
        self.next = position;
        debug_assert!(self.next <= self.blocks && self.used_blocks <= self.blocks);
        Ok(found)
    }

    /// The scan found transaction `self.sequence` torn. Looks through the
    /// whole journal for a well-formed descriptor of the one after it; if
    /// there is one, the torn transaction was acknowledged (it was flushed
    /// before its successor was written) and replay cannot honour it.
    /// Only reached after a crash or damage, so an ordinary open never
    /// reads the whole journal.
    fn refuse_if_a_later_transaction_follows(
        &self,
        reader: &mut ReadAhead,
        pool_uuid: &[u8; 16],
    ) -> Result<()> {
        let Some(next_sequence) = self.sequence.checked_add(1) else {
            return Ok(());
        };
        let block = self.block_size_bytes;
        for position in 0..self.blocks {
            let first = reader.read(position, 1)?;
            let Some(descriptor_blocks) = Descriptor::peek_blocks(first, next_sequence, pool_uuid)
            else {
                continue;
            };
            let descriptor_blocks = u64::from(descriptor_blocks);
            if position + descriptor_blocks > self.blocks {
                continue;
            }
            let descriptor = reader.read(position, descriptor_blocks)?;
            if Descriptor::decode_checked(descriptor, next_sequence, pool_uuid, block)
                .is_ok_and(|d| d.is_some())
            {
                return Err(Error::corrupt(format!(
                    "journal: transaction {} is damaged, but transaction {next_sequence} after it is intact at journal block {position}: acknowledged writes would be lost; refusing to open",
                    self.sequence
                )));
            }
        }
        Ok(())
    }

    /// The transaction with the expected sequence at `position`, with its
    /// length in blocks; or Torn if its descriptor's first block is there
    /// but the transaction is not whole; or Absent.
    fn read_transaction(
        &self,
        reader: &mut ReadAhead,
        position: u64,
        pool_uuid: &[u8; 16],
    ) -> Result<Candidate> {
        let block = self.block_size_bytes;
        if position >= self.blocks {
            return Ok(Candidate::Absent);
        }
        let first = reader.read(position, 1)?;
        let Some(descriptor_blocks) = Descriptor::peek_blocks(first, self.sequence, pool_uuid)
        else {
            return Ok(Candidate::Absent);
        };
        let descriptor_blocks = u64::from(descriptor_blocks);
        if position + descriptor_blocks > self.blocks {
            return Ok(Candidate::Torn);
        }
        let descriptor_bytes = reader.read(position, descriptor_blocks)?;
        let descriptor =
            match Descriptor::decode_checked(descriptor_bytes, self.sequence, pool_uuid, block) {
                Ok(Some(descriptor)) => descriptor,
                Ok(None) => return Ok(Candidate::Torn),
                Err(why) => {
                    return Err(Error::corrupt(format!(
                        "journal transaction {} at journal block {position} passes its checksum but {why}; replay refuses it rather than lose it and what follows",
                        self.sequence
                    )))
                }
            };
        let image_count = descriptor.homes.len() as u64;
        let len = descriptor_blocks + image_count;
        if position + len > self.blocks {
            return Err(Error::corrupt(format!(
                "journal transaction {} at journal block {position} passes its checksum but its {len} blocks run past the journal's {}",
                self.sequence, self.blocks
            )));
        }
        let image_bytes = reader.read(position + descriptor_blocks, image_count)?;
        if crc32c::crc32c(image_bytes) != descriptor.images_crc {
            return Ok(Candidate::Torn);
        }
        let images = image_bytes.chunks(block).map(|c| c.to_vec()).collect();
        Ok(Candidate::Whole(
            ReplayedTransaction { descriptor, images },
            len,
        ))
    }
}

/// Journal blocks a scan reads at once (1 MiB of 4 KiB blocks).
const READ_AHEAD_BLOCKS: u64 = 256;

/// The journal as a scan reads it: each read is served from a window of
/// up to READ_AHEAD_BLOCKS blocks read in one request. Read block by block
/// and three reads per transaction, a scan cost a network round trip each
/// on RADOS: seconds of a takeover for a full journal, and 4,096 round
/// trips to look through the whole default journal after a torn write.
struct ReadAhead<'a> {
    device: &'a dyn BlockDevice,
    /// The journal's first block on the device, its length and block size.
    start: u64,
    blocks: u64,
    block_bytes: usize,
    /// The journal block the window starts at, and the window's bytes.
    window_at: u64,
    window: Vec<u8>,
}

impl<'a> ReadAhead<'a> {
    fn new(device: &'a dyn BlockDevice, journal: &Journal) -> ReadAhead<'a> {
        ReadAhead {
            device,
            start: journal.start.0,
            blocks: journal.blocks,
            block_bytes: journal.block_size_bytes,
            window_at: 0,
            window: Vec::new(),
        }
    }

    /// `count` journal blocks from journal block `at`, which the caller
    /// knows lie inside the journal.
    fn read(&mut self, at: u64, count: u64) -> Result<&[u8]> {
        assert!(
            at + count <= self.blocks,
            "a journal read stays inside the journal"
        );
        let window_end = self.window_at + (self.window.len() / self.block_bytes) as u64;
        if at < self.window_at || at + count > window_end {
            let len = READ_AHEAD_BLOCKS.min(self.blocks - at).max(count);
            self.window.resize(len as usize * self.block_bytes, 0);
            let offset = (self.start + at) * self.block_bytes as u64;
            if let Err(e) = self.device.read_at(&mut self.window, offset) {
                self.window.clear();
                return Err(Error::io(
                    format!("cannot read the journal of {}", self.device.describe()),
                    e,
                ));
            }
            self.window_at = at;
        }
        let from = (at - self.window_at) as usize * self.block_bytes;
        let bytes = &self.window[from..from + count as usize * self.block_bytes];
        debug_assert_eq!(bytes.len(), count as usize * self.block_bytes);
        Ok(bytes)
    }
}

/// What the scan finds where the next transaction may be.
enum Candidate {
    /// The transaction, whole, with its length in blocks.
    Whole(ReplayedTransaction, u64),
    /// Its descriptor's first block is there, but not the rest of it whole:
    /// a torn write, or damage.
    Torn,
    /// No descriptor of the expected sequence.
    Absent,
}

/// A transaction as it is written: descriptor blocks, then the images.
pub fn transaction_bytes(block_bytes: usize, descriptor: &[u8], images: &[Vec<u8>]) -> Vec<u8> {
    assert!(descriptor.len().is_multiple_of(block_bytes));
    let mut bytes = Vec::with_capacity(descriptor.len() + images.len() * block_bytes);
    bytes.extend_from_slice(descriptor);
    for image in images {
        assert_eq!(image.len(), block_bytes);
        bytes.extend_from_slice(image);
    }
    bytes
}

/// Writes a reserved transaction at `offset` and flushes it: once this
/// returns Ok, the transaction survives a crash.
pub fn write_transaction(device: &dyn BlockDevice, offset: u64, bytes: &[u8]) -> Result<()> {
    device.write_durable_at(bytes, offset).map_err(|e| {
        Error::io(
            format!("cannot write the journal of {}", device.describe()),
            e,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemDevice;
    use crate::format::journal::Roots;
    use crate::types::VolumeId;

    const BLOCK: usize = 1024;
    const UUID: [u8; 16] = [7; 16];

    /// Appends a transaction of `images` images (plus its descriptor block).
    fn append(journal: &mut Journal, device: &dyn BlockDevice, images: usize) -> Result<()> {
        let images: Vec<Vec<u8>> = (0..images).map(|i| vec![i as u8; BLOCK]).collect();
        let mut images_crc = 0;
        for image in &images {
            images_crc = crc32c::crc32c_append(images_crc, image);
        }
        let descriptor = Descriptor {
            sequence: journal.sequence(),
            pool_uuid: UUID,
            descriptor_blocks: 1,
            images_crc,
            roots: Roots {
                volume_table_root: BlockAddr(0),
                volume_table_height: 0,
                next_volume_id: VolumeId(1),
                group_count: 1,
                birth_generation: 1,
            },
            homes: (0..images.len() as u64)
                .map(|i| BlockAddr(100 + i))
                .collect(),
            extents: Vec::new(),
            share_runs: Vec::new(),
        };
        journal.append(device, &descriptor.encode(BLOCK), &images)
    }

    /// Regression (found in review): a transaction that wraps and ends
    /// exactly at the head fills the journal. The next one used to be placed
    /// on top of the first transaction replay still needed.
    #[test]
    fn a_full_journal_asks_for_a_checkpoint_instead_of_overwriting() {
        let device = MemDevice::new();
        let mut journal = Journal::new(BlockAddr(2), 64, BLOCK as u32, 32, 10);
        append(&mut journal, &device, 31).unwrap(); // blocks 32..64
        append(&mut journal, &device, 31).unwrap(); // wraps: blocks 0..32, up to the head
        assert!(
            !journal.fits(2),
            "a full journal must not take another transaction"
        );
        let mut reader = Journal::new(BlockAddr(2), 64, BLOCK as u32, 32, 10);
        assert_eq!(reader.scan(&device, &UUID).unwrap().len(), 2);
        assert_eq!(journal.verify(&device, &UUID).unwrap(), 2);
        journal.checkpointed();
        assert!(journal.fits(32));
    }

    /// A failed append burns its sequence and needs a checkpoint first, so
    /// a half-written attempt is never replayed in place of its retry.
    #[test]
    fn a_failed_append_burns_its_sequence() {
        let device = MemDevice::new();
        let mut journal = Journal::new(BlockAddr(2), 64, BLOCK as u32, 0, 5);
        append(&mut journal, &device, 3).unwrap();
        let faulty = crate::testing::FaultyDevice::new(MemDevice::from_bytes(device.to_bytes()));
        faulty.arm(crate::testing::Fault::FlushEio, 0, false);
        assert!(append(&mut journal, &faulty, 3).is_err());
        assert_eq!(
            journal.sequence(),
            7,
            "the failed attempt's sequence is used up"
        );
        assert!(
            !journal.fits(1),
            "no append before a checkpoint records the new sequence"
        );
        journal.checkpointed();
        assert!(journal.fits(1));
    }
}
