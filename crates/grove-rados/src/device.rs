//! `RadosDevice`: grove's BlockDevice over RADOS objects. The bytes are
//! striped over objects of a fixed size (layout.rs); an object exists only
//! once written, and a missing object, or the part past an object's end,
//! reads as zeros (save where the engine reads data it maps: written.rs). Every write is synchronous in librados, so it returns
//! only once the OSDs acknowledged it as stored: a completed write is
//! durable, and flush has nothing left to wait for.

use crate::cluster::{errno, io_error, EBLOCKLISTED, ENOENT};
use crate::fence::Fence;
use crate::header::Header;
use crate::io_pool::{IoPool, Op};
use crate::layout::{self, Piece};
use crate::target::RadosTarget;
use ceph::ceph::IoCtx;
use ceph::error::RadosError;
use grove_store::BlockDevice;
use std::io;
use std::sync::{Arc, Mutex};

/// Threads per device running one request's objects, or one batch's
/// pieces, at once.
const IO_THREADS: usize = 32;
/// Operations waiting for a thread, at most.
const IO_QUEUE: usize = 64;
/// Requests worth running at once (`BlockDevice::queue_depth`): each waits
/// for a network round trip rather than for the CPU or a local disk, so as
/// many as a client like fio's or QEMU's usually sends (RBD clients keep 16
/// to 64), where a file's few keep its CPUs busy.
const QUEUE_DEPTH: usize = 16;

/// A device whose bytes live in RADOS objects; see the module's comment.
pub struct RadosDevice {
    pub(crate) shared: Arc<Shared>,
    pool: IoPool,
}

/// What every I/O thread needs.
pub(crate) struct Shared {
    pub(crate) ioctx: IoCtx,
    pub(crate) target: RadosTarget,
    pub(crate) object_size: u64,
    /// The length, as the header object holds it. The lock makes this
    /// process the only writer, so memory is the truth once opened.
    pub(crate) len_bytes: Mutex<u64>,
    pub(crate) fence: Fence,
    /// The exclusive lock's cookie, given back on drop.
    pub(crate) cookie: String,
    /// The pool's room, asked of the monitor at most every few seconds.
    pub(crate) space: crate::space::SpaceCache,
}

impl RadosDevice {
    pub(crate) fn from_shared(shared: Shared) -> io::Result<RadosDevice> {
        Ok(RadosDevice {
            shared: Arc::new(shared),
            pool: IoPool::new(IO_THREADS, IO_QUEUE)?,
        })
    }

    /// The size of each data object.
    pub fn object_size(&self) -> u64 {
        self.shared.object_size
    }

    /// Whether the cluster fenced this device (another host took it over).
    pub fn is_fenced(&self) -> bool {
        self.shared.fence.is_tripped()
    }

    /// Fills each `(offset, buf)` of `reads`: every object's piece of
    /// every read at once, each read by `read`.
    fn read_pieces(
        &self,
        reads: &mut [(u64, &mut [u8])],
        read: fn(&Shared, Piece) -> io::Result<Vec<u8>>,
    ) -> io::Result<()> {
        let mut wanted: Vec<(usize, Piece)> = Vec::new();
        for (i, (offset, buf)) in reads.iter().enumerate() {
            offset
                .checked_add(buf.len() as u64)
                .ok_or_else(|| overflow(*offset, buf.len()))?;
            let size = self.shared.object_size;
            let pieces = layout::pieces(*offset, buf.len() as u64, size);
            wanted.extend(pieces.into_iter().map(|piece| (i, piece)));
        }
        let ops: Vec<Op<Vec<u8>>> = wanted
            .iter()
            .map(|&(_, piece)| {
                let shared = Arc::clone(&self.shared);
                Box::new(move || read(&shared, piece)) as Op<Vec<u8>>
            })
            .collect();
        let parts = self.run_ops(ops)?;
        for ((i, piece), data) in wanted.into_iter().zip(parts) {
            let buf = &mut reads[i].1;
            buf[piece.buf_offset..piece.buf_offset + piece.len].copy_from_slice(&data);
        }
        Ok(())
    }

    /// Runs one op per piece; see `run_ops`.
    fn for_each_piece<T: Send + 'static>(
        &self,
        pieces: &[Piece],
        op: impl Fn(Arc<Shared>, Piece) -> Op<T>,
    ) -> io::Result<Vec<T>> {
        let ops: Vec<Op<T>> = pieces
            .iter()
            .map(|p| op(Arc::clone(&self.shared), *p))
            .collect();
        self.run_ops(ops)
    }

    /// Runs the ops at once: inline when there is one (no thread hop for
    /// the common small request), else on the pool.
    pub(crate) fn run_ops<T: Send + 'static>(&self, mut ops: Vec<Op<T>>) -> io::Result<Vec<T>> {
        if ops.len() == 1 {
            let only = ops.remove(0);
            return only().map(|t| vec![t]);
        }
        self.pool.run_all(ops)
    }
}

impl Shared {
    pub(crate) fn header_name(&self) -> String {
        layout::header_object(&self.target.name)
    }

    pub(crate) fn object_name(&self, index: u64) -> String {
        layout::data_object(&self.target.name, index)
    }

    /// The error for a failed call on `object`; a refusal because this
    /// client is blocklisted trips the fence.
    pub(crate) fn failed(&self, what: &str, object: &str, error: &RadosError) -> io::Error {
        if errno(error) == Some(EBLOCKLISTED) {
            return self.fence.trip();
        }
        io_error(
            &format!("{what} RADOS object {object} of {}", self.target.location()),
            error,
        )
    }

    /// The bytes object `piece.index` holds in the piece, at most
    /// `piece.len` (fewer when the object ends inside it), or None when
    /// the object does not exist.
    pub(crate) fn read_stored(&self, piece: Piece) -> io::Result<Option<Vec<u8>>> {
        let name = self.object_name(piece.index);
        let mut data = Vec::with_capacity(piece.len);
        match self
            .ioctx
            .rados_object_read(&name, &mut data, piece.object_offset)
        {
            Ok(_) => {}
            Err(e) if errno(&e) == Some(ENOENT) => return Ok(None),
            Err(e) => return Err(self.failed("cannot read", &name, &e)),
        }
        // The binding reads up to the buffer's capacity, which may exceed len.
        data.truncate(piece.len);
        Ok(Some(data))
    }

    fn read_piece(&self, piece: Piece) -> io::Result<Vec<u8>> {
        // Past the object's end (or no object at all) reads as zeros.
        let mut data = self.read_stored(piece)?.unwrap_or_default();
        data.resize(piece.len, 0);
        Ok(data)
    }

    pub(crate) fn write_piece(&self, piece: Piece, data: &[u8]) -> io::Result<()> {
        self.fence.check()?;
        let name = self.object_name(piece.index);
        self.ioctx
            .rados_object_write(&name, data, piece.object_offset)
            .map_err(|e| self.failed("cannot write", &name, &e))
    }

    /// The object's size, or None if it does not exist.
    pub(crate) fn object_len(&self, name: &str) -> io::Result<Option<u64>> {
        match self.ioctx.rados_object_stat(name) {
            Ok((size, _)) => Ok(Some(size)),
            Err(e) if errno(&e) == Some(ENOENT) => Ok(None),
            Err(e) => Err(self.failed("cannot stat", name, &e)),
        }
    }

    /// Gives back the space of one piece: a whole object is removed, a tail
    /// up to the object's end truncated, and anything else zeroed (the
    /// binding wraps no rados_write_op_zero, which would punch it). Nothing
    /// is created: a missing object, or a range past its end, is left alone.
    pub(crate) fn punch_piece(&self, piece: Piece) -> io::Result<()> {
        self.fence.check()?;
        let name = self.object_name(piece.index);
        if piece.is_whole_object(self.object_size) {
            return match self.ioctx.rados_object_remove(&name) {
                Ok(()) => Ok(()),
                Err(e) if errno(&e) == Some(ENOENT) => Ok(()),
                Err(e) => Err(self.failed("cannot remove", &name, &e)),
            };
        }
        let Some(size) = self.object_len(&name)? else {
            return Ok(());
        };
        let start = piece.object_offset;
        let end = (start + piece.len as u64).min(size);
        if start >= end {
            return Ok(());
        }
        // Truncating is safe only when the piece runs to the object's end:
        // then nothing after it in the object is in use. A piece that only
        // reaches the object's current size is zeroed instead, since a
        // block past it may be being written right now.
        if piece.reaches_object_end(self.object_size) {
            // Never from 0: a piece from 0 to the end is whole, removed above.
            return self
                .ioctx
                .rados_object_trunc(&name, start)
                .map_err(|e| self.failed("cannot truncate", &name, &e));
        }
        let zeros = vec![0u8; (end - start) as usize];
        self.ioctx
            .rados_object_write(&name, &zeros, start)
            .map_err(|e| self.failed("cannot zero", &name, &e))
    }

    /// Rewrites the header with a new length.
    pub(crate) fn write_header(&self, len_bytes: u64) -> io::Result<()> {
        self.fence.check()?;
        let name = self.header_name();
        let header = Header {
            object_size: self.object_size,
            len_bytes,
        };
        self.ioctx
            .rados_object_write_full(&name, &header.encode())
            .map_err(|e| self.failed("cannot write", &name, &e))
    }

    /// Grows the recorded length to `end` if it is shorter.
    pub(crate) fn grow_to(&self, end: u64) -> io::Result<()> {
        let mut len = self.len_bytes.lock().unwrap_or_else(|e| e.into_inner());
        if *len < end {
            self.write_header(end)?;
            *len = end;
        }
        debug_assert!(*len >= end);
        Ok(())
    }

    fn current_len(&self) -> u64 {
        *self.len_bytes.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub(crate) fn overflow(offset: u64, len: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("a request of {len} bytes at {offset} runs past 2^64"),
    )
}

impl BlockDevice for RadosDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_pieces(&mut [(offset, buf)], Shared::read_piece)
    }

    /// Missing or short objects refused, naming them: written.rs.
    fn read_written_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_pieces(&mut [(offset, buf)], Shared::read_written_piece)
    }

    /// Every read's pieces at once.
    fn read_each_at(&self, reads: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        self.read_pieces(reads, Shared::read_piece)
    }

    /// Every read's pieces at once; missing or short objects refused.
    fn read_written_each_at(&self, reads: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        self.read_pieces(reads, Shared::read_written_piece)
    }

    /// A run of neighbouring blocks may fill an object: one RADOS write
    /// per object touched (runs stop at object boundaries).
    fn write_run_bytes_max(&self) -> usize {
        usize::try_from(self.shared.object_size).unwrap_or(usize::MAX)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let end = offset
            .checked_add(buf.len() as u64)
            .ok_or_else(|| overflow(offset, buf.len()))?;
        self.shared.fence.check()?;
        let pieces = layout::pieces(offset, buf.len() as u64, self.shared.object_size);
        if pieces.len() == 1 {
            self.shared.write_piece(pieces[0], buf)?;
        } else {
            self.for_each_piece(&pieces, |shared, piece| {
                let data = buf[piece.buf_offset..piece.buf_offset + piece.len].to_vec();
                Box::new(move || shared.write_piece(piece, &data))
            })?;
        }
        self.shared.grow_to(end)
    }

    /// Neighbours merged, and every object's piece at once: batch.rs.
    fn write_each_at(&self, writes: &[(u64, &[u8])]) -> Vec<io::Result<()>> {
        self.write_batch(writes)
    }

    /// Every completed write is already stored (writes are synchronous);
    /// a fenced device says so here too, so that nothing takes a flush for
    /// success after the OSDs refused its writes.
    fn flush(&self) -> io::Result<()> {
        self.shared.fence.check()
    }

    fn len_bytes(&self) -> io::Result<u64> {
        Ok(self.shared.current_len())
    }

    fn set_len_bytes(&self, len_bytes: u64) -> io::Result<()> {
        self.shared.fence.check()?;
        let mut len = self
            .shared
            .len_bytes
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if len_bytes < *len {
            // The cut-off bytes must read as zeros if it grows again.
            let size = self.shared.object_size;
            let pieces = layout::pieces(len_bytes, *len - len_bytes, size);
            self.for_each_piece(&pieces, |shared, piece| {
                Box::new(move || shared.punch_piece(piece))
            })?;
        }
        self.shared.write_header(len_bytes)?;
        *len = len_bytes;
        debug_assert_eq!(*len, len_bytes);
        Ok(())
    }

    fn describe(&self) -> String {
        self.shared.target.location()
    }

    fn queue_depth(&self) -> usize {
        QUEUE_DEPTH
    }

    /// The RADOS pool's room, not the local file system's.
    fn host_space(&self) -> Option<grove_store::HostSpace> {
        self.shared.space.pool_space(&self.shared.target)
    }

    /// The data object holding the byte, by the name `rados` lists it
    /// under.
    fn place_of(&self, offset: u64) -> Option<String> {
        let index = offset / self.shared.object_size;
        Some(format!(
            "RADOS object {} of pool {}",
            self.shared.object_name(index),
            self.shared.target.pool
        ))
    }

    fn piece_bytes(&self) -> Option<u64> {
        Some(self.shared.object_size)
    }

    /// One stat per object: written.rs.
    fn lost_pieces(&self, needed: &[(u64, u64)]) -> io::Result<Vec<String>> {
        self.lost_objects(needed)
    }

    fn punch(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        self.shared.fence.check()?;
        // Nothing past the last object of the length exists, so nothing
        // there to give back. (Not cut at the length itself: a punch that
        // runs to an object's end may truncate it, one that stops short
        // must not.)
        let size = self.shared.object_size;
        let last_object_end = self
            .shared
            .current_len()
            .div_ceil(size)
            .saturating_mul(size);
        let end = offset.saturating_add(len_bytes).min(last_object_end);
        if offset >= end {
            return Ok(());
        }
        // Only whole objects (removed) and tails (truncated) give space
        // back. A middle would be zeroed, which BlueStore stores as any
        // other bytes: a stat and a write for nothing, and freed blocks
        // are mostly scattered middles (a daemon stopping with 25,000 to
        // punch took minutes). The contract lets a middle keep its bytes.
        let pieces: Vec<Piece> = layout::pieces(offset, end - offset, size)
            .into_iter()
            .filter(|piece| piece.reaches_object_end(size))
            .collect();
        self.for_each_piece(&pieces, |shared, piece| {
            Box::new(move || shared.punch_piece(piece))
        })?;
        Ok(())
    }
}

impl Drop for RadosDevice {
    /// Gives the lock back, so the next opener needs no takeover. A fenced
    /// device has no lock left to give.
    fn drop(&mut self) {
        if self.shared.fence.is_tripped() {
            return;
        }
        let header = self.shared.header_name();
        if let Err(e) = crate::ownership::unlock(&self.shared.ioctx, &header, &self.shared.cookie) {
            tracing::warn!("{e}");
        }
    }
}
