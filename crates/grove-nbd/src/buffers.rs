//! Buffers for write data and read replies, reused across requests. A new
//! buffer per request costs a zeroing pass and, past malloc's mmap
//! threshold, a page fault on every page: under sequential 1 MiB writes
//! perf showed memset, page faults and clear_page at about 14% of
//! `grove serve`. The pool is server-wide and bounded, so idle buffers
//! stay a few MiB whatever the number of connections; and once the
//! server has been idle a moment they are let go (memory back to the
//! system, not held for the next burst that may never come).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Buffers the pool keeps at most.
pub(crate) const POOLED_BUFFERS_MAX: usize = 16;

/// Largest buffer the pool keeps: one 1 MiB request with its reply header.
/// A larger one is made for its request and freed after it.
pub(crate) const POOLED_BUFFER_BYTES_MAX: usize = 1024 * 1024 + 64;

/// How long no buffer is taken or given back before the kept ones are
/// freed: longer than the gaps of a client working with queue depth one.
pub(crate) const BUFFERS_IDLE_MS: u64 = 2_000;

pub(crate) struct BufferPool {
    free: Mutex<Free>,
}

struct Free {
    buffers: Vec<Vec<u8>>,
    last_used: Instant,
    /// Set once an idle spell has been trimmed; cleared by the next use.
    trimmed: bool,
}

impl Default for BufferPool {
    fn default() -> Self {
        BufferPool {
            free: Mutex::new(Free {
                buffers: Vec::new(),
                last_used: Instant::now(),
                trimmed: true,
            }),
        }
    }
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
        let kept = {
            let mut free = self.lock();
            free.used();
            if len <= POOLED_BUFFER_BYTES_MAX {
                free.buffers.pop()
            } else {
                None
            }
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
        free.used();
        if free.buffers.len() < POOLED_BUFFERS_MAX {
            free.buffers.push(buffer.bytes);
        }
        debug_assert!(free.buffers.len() <= POOLED_BUFFERS_MAX);
    }

    /// Frees the kept buffers once nothing has used the pool for
    /// [`BUFFERS_IDLE_MS`]. Returns true once per idle spell (when it
    /// trims), so the caller can give the allocator's memory back too.
    pub(crate) fn trim_if_idle(&self, now: Instant) -> bool {
        let mut free = self.lock();
        let idle =
            now.saturating_duration_since(free.last_used) >= Duration::from_millis(BUFFERS_IDLE_MS);
        if free.trimmed || !idle {
            return false;
        }
        free.buffers = Vec::new();
        free.trimmed = true;
        true
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Free> {
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Free {
    fn used(&mut self) {
        self.last_used = Instant::now();
        self.trimmed = false;
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
        assert_eq!(pool.lock().buffers.len(), POOLED_BUFFERS_MAX);
        pool.give(pool.take(POOLED_BUFFER_BYTES_MAX + 1));
        assert!(pool
            .lock()
            .buffers
            .iter()
            .all(|b| b.len() <= POOLED_BUFFER_BYTES_MAX));
    }

    #[test]
    fn kept_buffers_are_freed_once_the_pool_has_been_idle() {
        let pool = BufferPool::default();
        pool.give(pool.take(4096));
        let now = Instant::now();
        assert!(!pool.trim_if_idle(now), "just used: kept");
        assert_eq!(pool.lock().buffers.len(), 1);
        let later = now + Duration::from_millis(BUFFERS_IDLE_MS + 1);
        assert!(pool.trim_if_idle(later));
        assert!(pool.lock().buffers.is_empty());
        assert!(!pool.trim_if_idle(later), "once per idle spell");
        pool.give(pool.take(4096));
        assert!(pool.trim_if_idle(Instant::now() + Duration::from_millis(BUFFERS_IDLE_MS + 1)));
    }
}
