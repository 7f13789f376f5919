//! A pack streamed into its object as it fills: the header first, each
//! slot as it comes, the table and footer last, so that writing a pack
//! holds its table and the store's part buffer, never the whole pack. The
//! object appears whole when `finish` places it; a writer dropped
//! unfinished removes what it stored, and a killed one leaves what the
//! sweep cleans (never a pack object).

use crate::error::Result;
use crate::format::pack::{PackEncoder, SlotEntry};
use grove_objects::ObjectWriter;

pub(crate) struct PackWriter<'a> {
    encoder: PackEncoder,
    object: ObjectWriter<'a>,
    /// Bytes written so far.
    bytes: u64,
    /// Its number among the packs this process started (a test hook's).
    ordinal: u64,
}

impl<'a> PackWriter<'a> {
    /// Starts pack `encoder` in `object`, writing its header.
    pub(crate) fn start(encoder: PackEncoder, mut object: ObjectWriter<'a>) -> Result<Self> {
        let header = encoder.header();
        object.write(&header)?;
        Ok(PackWriter {
            encoder,
            object,
            bytes: header.len() as u64,
            ordinal: crate::hooks::pack_started(),
        })
    }

    pub(crate) fn id(&self) -> u64 {
        self.encoder.id()
    }

    pub(crate) fn slots(&self) -> u32 {
        self.encoder.slots()
    }

    pub(crate) fn is_full(&self) -> bool {
        self.encoder.is_full()
    }

    /// Adds `entry`'s version, `data` (one block), as the next slot.
    pub(crate) fn push(&mut self, entry: SlotEntry, data: &[u8]) -> Result<()> {
        let checksum = self.encoder.slot(entry, data);
        self.object.write(&checksum)?;
        self.object.write(data)?;
        self.bytes += (checksum.len() + data.len()) as u64;
        crate::hooks::stall_in_pack(self.ordinal, self.bytes);
        Ok(())
    }

    /// Writes the table and footer and places the pack; returns its bytes.
    pub(crate) fn finish(mut self) -> Result<u64> {
        crate::hooks::before_request()?;
        let tail = self.encoder.finish();
        self.object.write(&tail)?;
        self.object.finish()?;
        Ok(self.bytes + tail.len() as u64)
    }
}
