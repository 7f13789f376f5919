//! Buffers for write data and read replies, reused across requests. A new
//! buffer per request costs a zeroing pass and, past malloc's mmap
//! threshold, a page fault on every page: under sequential 1 MiB writes
//! perf showed memset, page faults and clear_page at about 14% of
//! `grove serve`. The pool is server-wide and bounded, so idle buffers
//! stay a few MiB whatever the number of connections.

use std::sync::Mutex;

/// Buffers the pool keeps at most.
pub(crate) const POOLED_BUFFERS_MAX: usize = 16;

/// Largest buffer the pool keeps: one 1 MiB request with its reply header.
/// A larger one is made for its request and freed after it.
pub(crate) const POOLED_BUFFER_BYTES_MAX: usize = 1024 * 1024 + 64;

#[derive(Default)]
pub(crate) struct BufferPool {
    free: Mutex<Vec<Vec<u8>>>,
}

/// `len` bytes on loan from a [`BufferPool`]. The bytes behind it may be
/// longer; they stay initialized for the next loan, so that lending a
/// buffer again zeroes nothing. What the bytes hold on loan is whatever
/// the last borrower left: a borrower fills them before they are read.
pub(crate) struct Buffer {
    bytes: Vec<u8>,
    len: usize,
}

impl Buffer {
    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.bytes[..self.len]
    }
}

impl BufferPool {
    /// A buffer of `len` bytes: a kept one if one is free (grown, zeroing
    /// only the growth, if it is too short), else a new one.
    pub(crate) fn take(&self, len: usize) -> Buffer {
        let kept = if len <= POOLED_BUFFER_BYTES_MAX {
            self.lock().pop()
        } else {
            None
        };
        let mut bytes = kept.unwrap_or_default();
        if bytes.len() < len {
            bytes.resize(len, 0);
        }
        debug_assert!(bytes.len() >= len);
        Buffer { bytes, len }
    }

    /// Takes a buffer back, unless the pool is full or it is too large.
    pub(crate) fn give(&self, buffer: Buffer) {
        if buffer.bytes.len() > POOLED_BUFFER_BYTES_MAX {
            return;
        }
        let mut free = self.lock();
        if free.len() < POOLED_BUFFERS_MAX {
            free.push(buffer.bytes);
        }
        debug_assert!(free.len() <= POOLED_BUFFERS_MAX);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_is_lent_again_without_losing_its_length() {
        let pool = BufferPool::default();
        let mut first = pool.take(8192);
        first.as_mut_slice().fill(7);
        pool.give(first);
        let second = pool.take(4096);
        assert_eq!(second.as_slice().len(), 4096);
        assert_eq!(second.bytes.len(), 8192, "the kept buffer was reused whole");
        pool.give(second);
        let third = pool.take(8192);
        assert_eq!(third.as_slice().len(), 8192);
    }

    #[test]
    fn the_pool_keeps_a_bounded_number_of_bounded_buffers() {
        let pool = BufferPool::default();
        let loans: Vec<Buffer> = (0..POOLED_BUFFERS_MAX + 4)
            .map(|_| pool.take(4096))
            .collect();
        for buffer in loans {
            pool.give(buffer);
        }
        assert_eq!(pool.lock().len(), POOLED_BUFFERS_MAX);
        pool.give(pool.take(POOLED_BUFFER_BYTES_MAX + 1));
        assert!(pool
            .lock()
            .iter()
            .all(|b| b.len() <= POOLED_BUFFER_BYTES_MAX));
    }
}
