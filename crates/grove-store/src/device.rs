//! The device layer: where blocks live. The engine sees only this trait, so
//! the same engine runs on one file, on a RAID layout over branches, or on the
//! crash simulator's recording device.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Byte-addressed storage with positioned I/O. Implementations must allow
/// concurrent calls from many threads.
pub trait BlockDevice: Send + Sync {
    /// Fills `buf` from `offset`. Bytes past the end of the device read as
    /// zeros, as they do in a sparse file.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Fills `buf` with bytes the engine wrote and still maps (a volume's
    /// data). A device that can tell storage lost from storage never
    /// written refuses where it is lost, naming the place, rather than
    /// reading zeros there: a RADOS object is thin, so a missing one reads
    /// as a hole, yet the object under a mapped block must exist. The
    /// default reads as `read_at` does.
    fn read_written_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_at(buf, offset)
    }
    /// Writes all of `buf` at `offset`, growing the device if needed.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// Writes all of `buf` at `offset` and returns once those bytes are
    /// durable, with whatever the device needs to read them back (a
    /// file's block mapping and length). Writes not yet flushed elsewhere
    /// on the device need not become durable with them.
    ///
    /// The journal writes its transactions so: a commit that maps no
    /// unflushed data then costs a write of its own bytes, not a flush of
    /// every write the clients made since theirs (hundreds of MB under
    /// random writes, and the clients' writes queue behind it). The
    /// default writes and flushes everything.
    fn write_durable_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_at(buf, offset)?;
        self.flush()
    }
    /// Writes each `(offset, bytes)` of `writes`, which do not overlap, in
    /// no particular order; returns each write's result, in order. Like
    /// `write_at`, each is durable after the next `flush`.
    ///
    /// The engine hands over at once writes that need no order among
    /// them (a commit's images going home, a checkpoint step's blocks,
    /// a request's runs of data), so that a device whose writes each wait
    /// for a network round trip (RADOS) runs them side by side. The
    /// default writes them in turn.
    fn write_each_at(&self, writes: &[(u64, &[u8])]) -> Vec<io::Result<()>> {
        writes
            .iter()
            .map(|(offset, bytes)| self.write_at(bytes, *offset))
            .collect()
    }
    /// Current length in bytes.
    fn len_bytes(&self) -> io::Result<u64>;
    /// Sets the length: growing leaves a hole, which reads as zeros.
    fn set_len_bytes(&self, len_bytes: u64) -> io::Result<()>;
    /// A human-readable name for error messages.
    fn describe(&self) -> String;
    /// Gives the host back the space of `len_bytes` bytes at `offset`,
    /// which nothing references any more (a discard, a hole punch).
    ///
    /// Contract: afterwards every byte of the range reads as zero or as
    /// what it held before, and callers may rely on neither: the engine
    /// punches only blocks whose free is durable, and writes a block again
    /// before it reads it. Like a write, a punch is durable only after the
    /// next `flush`; a power cut before that may leave any part of it
    /// undone. The length never changes.
    ///
    /// The default cannot punch: it fails with `ErrorKind::Unsupported`,
    /// which the engine takes (as EOPNOTSUPP) to mean "stop punching".
    fn punch(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        let _ = (offset, len_bytes);
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
    /// Bytes the device takes on the host (a sparse file's allocated
    /// blocks), or None when that means nothing (memory).
    fn allocated_bytes(&self) -> io::Result<Option<u64>> {
        Ok(None)
    }
    /// Where the byte at `offset` is kept, when that says more than the
    /// device's name (the RADOS object holding it): an error about damage
    /// found there names it. None: `describe` says it all.
    fn place_of(&self, offset: u64) -> Option<String> {
        let _ = offset;
        None
    }
    /// The size of the pieces the device keeps, and can lose, apart (a
    /// RADOS object holds this many bytes of the device), for
    /// `lost_pieces`; None when it keeps no such pieces.
    fn piece_bytes(&self) -> Option<u64> {
        None
    }
    /// `check`'s question for data: of `needed`, each a piece's index (its
    /// first byte over `piece_bytes`) and how many of its bytes, from its
    /// start, hold data the engine maps, the pieces that are missing or
    /// cut short, one line each naming the piece and what is wrong. The
    /// default keeps no pieces and so has none to lose.
    fn lost_pieces(&self, needed: &[(u64, u64)]) -> io::Result<Vec<String>> {
        let _ = needed;
        Ok(Vec::new())
    }
    /// The room the store has to grow into, when the device knows it
    /// better than the file system under the pool directory does (a store
    /// laid over branches on other disks). None: ask that file system.
    fn host_space(&self) -> Option<crate::space_levels::HostSpace> {
        None
    }
    /// Requests worth running against the device at once, which is how
    /// many `grove serve` runs per connection. A file or local disk keeps
    /// the CPUs busy with a few; a device whose every request waits for a
    /// network round trip says more.
    fn queue_depth(&self) -> usize {
        QUEUE_DEPTH_DEFAULT
    }
    /// The longest write that neighbouring blocks of one request are
    /// merged into. A run never crosses a multiple of this length on the
    /// device, so a device that keeps its bytes in pieces of this size
    /// (RADOS objects) gets one write per piece.
    fn write_run_bytes_max(&self) -> usize {
        WRITE_RUN_BYTES_DEFAULT
    }
    /// Fills each `(offset, buf)` of `reads`, which do not overlap, as
    /// `read_written_at` does, in no particular order; the first error if
    /// any failed.
    ///
    /// A request whose blocks lie apart on the device is several reads,
    /// handed over at once so that a device whose reads each wait for a
    /// network round trip (RADOS) runs them side by side. The default
    /// reads them in turn.
    fn read_written_each_at(&self, reads: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        for (offset, buf) in reads.iter_mut() {
            self.read_written_at(buf, *offset)?;
        }
        Ok(())
    }
    /// `read_written_each_at` with `read_at`'s meaning: bytes never
    /// written read as zeros (metadata blocks, whose checksums tell).
    fn read_each_at(&self, reads: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        for (offset, buf) in reads.iter_mut() {
            self.read_at(buf, *offset)?;
        }
        Ok(())
    }
}

/// What `BlockDevice::queue_depth` says unless the device knows better.
const QUEUE_DEPTH_DEFAULT: usize = 4;

/// What `BlockDevice::write_run_bytes_max` says unless the device knows
/// better: the host's page cache sizes its folios by the write, so 1 MiB
/// writes to a file leave 1 MiB folios, and every later 4K overwrite inside
/// one costs ext4 a walk over the whole folio. Measured here, random 4K
/// overwrites of a volume imported with 1 MiB runs: 59k IOPS (256 KiB
/// runs: 71-78k; 64 KiB: 99k; 4 KiB writes: 102k); sequential 1M writes
/// through NBD keep about 0.75 of nbdkit at 64 KiB against 0.6 with 4 KiB
/// writes.
const WRITE_RUN_BYTES_DEFAULT: usize = 64 * 1024;

/// What `stat` counts `st_blocks` in, whatever the file system's block size.
pub const STAT_BLOCK_BYTES: u64 = 512;

/// True if a failed punch means the device (its file system) cannot punch
/// holes at all, rather than that this one punch failed.
pub fn is_punch_unsupported(error: &io::Error) -> bool {
    let errno = error.raw_os_error();
    error.kind() == io::ErrorKind::Unsupported
        || errno == Some(rustix::io::Errno::OPNOTSUPP.raw_os_error())
        || errno == Some(rustix::io::Errno::NOSYS.raw_os_error())
}

/// A device backed by one regular file, usually sparse.
pub struct FileDevice {
    file: File,
    path: PathBuf,
}

impl FileDevice {
    pub fn open(path: &Path) -> io::Result<FileDevice> {
        let file = File::options().read(true).write(true).open(path)?;
        Ok(FileDevice {
            file,
            path: path.to_path_buf(),
        })
    }

    /// Creates a new file; fails if it exists, so that init never clobbers data.
    pub fn create_new(path: &Path) -> io::Result<FileDevice> {
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        Ok(FileDevice {
            file,
            path: path.to_path_buf(),
        })
    }
}

impl BlockDevice for FileDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        // read_exact_at fails with UnexpectedEof past the end; a sparse
        // device instead reads zeros there, so read what exists and zero-fill.
        let mut filled = 0;
        while filled < buf.len() {
            match self
                .file
                .read_at(&mut buf[filled..], offset + filled as u64)
            {
                Ok(0) => {
                    buf[filled..].fill(0);
                    break;
                }
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    /// pwritev2 with RWF_DSYNC: the write is durable as by fdatasync, but
    /// only its own range is written back. A kernel or file system that
    /// refuses the flag gets a write and an fdatasync instead.
    fn write_durable_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        use rustix::io::{pwritev2, Errno, ReadWriteFlags};
        let mut done = 0;
        while done < buf.len() {
            let part = [io::IoSlice::new(&buf[done..])];
            match pwritev2(
                &self.file,
                &part,
                offset + done as u64,
                ReadWriteFlags::DSYNC,
            ) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(n) => done += n,
                Err(Errno::INTR) => {}
                Err(Errno::OPNOTSUPP | Errno::NOSYS | Errno::INVAL) => {
                    self.file.write_all_at(&buf[done..], offset + done as u64)?;
                    return self.file.sync_data();
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    fn len_bytes(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn set_len_bytes(&self, len_bytes: u64) -> io::Result<()> {
        self.file.set_len(len_bytes)
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    /// fallocate(PUNCH_HOLE | KEEP_SIZE): the file's blocks in the range
    /// go back to the file system, the range reads as zeros, and the
    /// length stays. A file system without hole punching answers
    /// EOPNOTSUPP, which is passed on (see `is_punch_unsupported`).
    fn punch(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        use rustix::fs::{fallocate, FallocateFlags};
        let mode = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
        loop {
            match fallocate(&self.file, mode, offset, len_bytes) {
                Err(rustix::io::Errno::INTR) => {}
                result => return result.map_err(io::Error::from),
            }
        }
    }

    fn allocated_bytes(&self) -> io::Result<Option<u64>> {
        Ok(Some(self.file.metadata()?.blocks() * STAT_BLOCK_BYTES))
    }
}

/// A device in memory, for tests and the crash simulator's images.
#[derive(Default)]
pub struct MemDevice {
    bytes: std::sync::Mutex<Vec<u8>>,
}

impl MemDevice {
    pub fn new() -> MemDevice {
        MemDevice::default()
    }

    pub fn from_bytes(bytes: Vec<u8>) -> MemDevice {
        MemDevice {
            bytes: std::sync::Mutex::new(bytes),
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        self.bytes.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl BlockDevice for MemDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let bytes = self.bytes.lock().unwrap_or_else(|e| e.into_inner());
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(bytes.len());
        let available = (bytes.len() - start).min(buf.len());
        buf[..available].copy_from_slice(&bytes[start..start + available]);
        buf[available..].fill(0);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut bytes = self.bytes.lock().unwrap_or_else(|e| e.into_inner());
        let start = usize::try_from(offset)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
        let end = start + buf.len();
        if bytes.len() < end {
            bytes.resize(end, 0);
        }
        bytes[start..end].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn len_bytes(&self) -> io::Result<u64> {
        Ok(self.bytes.lock().unwrap_or_else(|e| e.into_inner()).len() as u64)
    }

    fn set_len_bytes(&self, len_bytes: u64) -> io::Result<()> {
        let len = usize::try_from(len_bytes)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "length too large"))?;
        self.bytes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .resize(len, 0);
        Ok(())
    }

    fn describe(&self) -> String {
        "memory device".to_string()
    }

    /// Zeros the range (one of the two outcomes the contract allows), so
    /// that tests in memory see a punched block as the engine must expect.
    fn punch(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        let mut bytes = self.bytes.lock().unwrap_or_else(|e| e.into_inner());
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(bytes.len());
        let end = usize::try_from(offset.saturating_add(len_bytes))
            .unwrap_or(usize::MAX)
            .min(bytes.len());
        bytes[start..end].fill(0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A durable write lands like any write, grows the file past its end,
    /// and is read back before any flush.
    #[test]
    fn a_durable_write_to_a_file_reads_back_and_grows_it() {
        let dir = tempfile::tempdir().unwrap();
        let device = FileDevice::create_new(&dir.path().join("store")).unwrap();
        device.write_at(&[1; 8192], 0).unwrap();
        let journal: Vec<u8> = (0..12288u32).map(|i| (i % 251) as u8).collect();
        device.write_durable_at(&journal, 4096).unwrap();
        assert_eq!(device.len_bytes().unwrap(), 4096 + 12288);
        let mut back = vec![0; 4096 + 12288];
        device.read_at(&mut back, 0).unwrap();
        assert!(back[..4096].iter().all(|&b| b == 1));
        assert_eq!(&back[4096..], &journal[..]);
    }
}
