//! What a store must do, in S3's terms: flat keys ("STREAM/OBJECT"),
//! whole-object puts (optionally create-only), ranged gets, listing, and
//! multipart uploads whose id the caller can record and abort later. The
//! stream logic in lib.rs is written once against this trait; `file.rs` and
//! `s3.rs` implement it.

use crate::error::Result;
use std::ops::Range;

/// Ranged reads of one `get_ranges` call in flight at a time at most: a few
/// keep a gateway's per-request latency (about 3 ms on radosgw here) off
/// the critical path without crowding its threads.
pub(crate) const RANGES_IN_FLIGHT: usize = 4;

/// One object of a stream, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The object's name within its stream (no '/').
    pub name: String,
    pub size_bytes: u64,
}

/// What a paged listing hands each page to.
pub(crate) type PageVisitor<'a> = dyn FnMut(&[Entry]) -> Result<()> + 'a;

/// Entries per page when the caller has no reason to choose: S3's own
/// page (ListObjectsV2 answers at most 1,000 keys).
pub(crate) const LIST_PAGE_ENTRIES: usize = 1000;

/// Gathers listed entries into pages of at most `limit` and hands each
/// full page (and the last, partial one) to the visitor; the one buffer is
/// reused, so a listing holds at most one page.
pub(crate) struct Pager<'v, 'a> {
    page: Vec<Entry>,
    limit: usize,
    visit: &'v mut PageVisitor<'a>,
}

impl<'v, 'a> Pager<'v, 'a> {
    pub(crate) fn new(limit: usize, visit: &'v mut PageVisitor<'a>) -> Pager<'v, 'a> {
        // A zero limit would never hand a page over; FolderStore refuses it.
        let limit = limit.max(1);
        Pager {
            page: Vec::with_capacity(limit.min(LIST_PAGE_ENTRIES)),
            limit,
            visit,
        }
    }

    pub(crate) fn push(&mut self, entry: Entry) -> Result<()> {
        self.page.push(entry);
        if self.page.len() >= self.limit {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if !self.page.is_empty() {
            (self.visit)(&self.page)?;
            self.page.clear();
        }
        debug_assert!(self.page.is_empty());
        Ok(())
    }

    /// Hands over the last, partial page.
    pub(crate) fn finish(mut self) -> Result<()> {
        self.flush()
    }
}

/// An object being stored a piece at a time ([`Backend::put_streamed`]).
/// Dropped without `finish` (after an error too), it removes what it
/// stored.
pub(crate) trait StreamedPut {
    /// Appends `data` to the object.
    fn write(&mut self, data: &[u8]) -> Result<()>;
    /// Places the object whole under its name.
    fn finish(self: Box<Self>) -> Result<()>;
}

pub(crate) trait Backend: Send + Sync + 'static {
    /// The store, for messages: "s3://bucket/prefix at http://..." or "file:///dir".
    fn describe(&self) -> String;
    /// The objects of stream `stream` (keys "stream/NAME"), in any order,
    /// handed to `visit` in pages of at most `page_limit` (at least 1)
    /// entries, so that memory does not grow with the stream: S3 gives key
    /// order, a directory its own order. Objects created or removed while
    /// the listing runs may or may not be seen; every other object is seen
    /// exactly once. The first error of `visit` ends the listing.
    fn list_pages(&self, stream: &str, page_limit: usize, visit: &mut PageVisitor) -> Result<()>;
    /// The whole listing at once, for streams and folders known to be small.
    fn list(&self, stream: &str) -> Result<Vec<Entry>> {
        let mut entries = Vec::new();
        self.list_pages(stream, LIST_PAGE_ENTRIES, &mut |page| {
            entries.extend_from_slice(page);
            Ok(())
        })?;
        Ok(entries)
    }
    /// The names of the streams that have at least one object.
    fn list_streams(&self) -> Result<Vec<String>>;
    /// Stores `data` at `key` whole: readers see all of it or none.
    /// With `create_only`, fails with ErrorKind::AlreadyExists if the key
    /// exists, atomically.
    fn put(&self, key: &str, data: &[u8], create_only: bool) -> Result<()>;
    /// `put` of data the caller gives up: a backend that sends it whole
    /// (S3) takes it without a copy, so a big object is held once.
    fn put_owned(&self, key: &str, data: Vec<u8>, create_only: bool) -> Result<()> {
        self.put(key, &data, create_only)
    }
    /// Bytes `range` of the object at `key` (shorter if the object is).
    fn get_range(&self, key: &str, range: Range<u64>) -> Result<Vec<u8>>;
    /// Each of `ranges` of the object at `key`, as `get_range` gives it, in
    /// order; concurrently where the store can (at most
    /// [`RANGES_IN_FLIGHT`] requests at a time). Every result is held until
    /// all are in: the caller bounds the bytes asked for.
    fn get_ranges(&self, key: &str, ranges: &[Range<u64>]) -> Result<Vec<Vec<u8>>> {
        ranges
            .iter()
            .map(|range| self.get_range(key, range.clone()))
            .collect()
    }
    /// The whole object at `key`.
    fn get(&self, key: &str) -> Result<Vec<u8>>;
    /// Removes the objects; missing ones are not an error.
    fn delete(&self, keys: &[String]) -> Result<()>;
    /// Starts a multipart upload to `key` and returns its id.
    fn multipart_begin(&self, key: &str) -> Result<String>;
    /// Uploads chunks `first..first + chunks.len()` (at least 5 MiB each but
    /// the last of the object), concurrently where the store can; the first
    /// starts at byte `offset` of the object and the others follow it.
    /// Returns their tags, in order.
    fn multipart_put(
        &self,
        key: &str,
        id: &str,
        first: usize,
        offset: u64,
        chunks: &[&[u8]],
    ) -> Result<Vec<String>>;
    /// Makes the object at `key` from the chunks' tags, atomically.
    fn multipart_complete(&self, key: &str, id: &str, tags: Vec<String>) -> Result<()>;
    /// Aborts the upload: its chunks are freed. An upload that no longer
    /// exists (completed or already aborted) is not an error.
    fn multipart_abort(&self, key: &str, id: &str) -> Result<()>;
    /// Starts storing the object at `key` a piece at a time, holding a
    /// bounded part of it: readers see nothing of it until `finish` places
    /// it whole. A local store never replaces an object of that name (it
    /// fails with ErrorKind::AlreadyExists); S3 does so only for an object
    /// of one part (a multipart upload's completion cannot be conditional
    /// on radosgw 16). A writer killed meanwhile leaves what
    /// `clean_interrupted` removes.
    fn put_streamed(&self, key: &str) -> Result<Box<dyn StreamedPut + '_>>;
    /// Removes what streamed puts into `folder` left when their process
    /// was killed (temporary files, incomplete multipart uploads); returns
    /// how many. Only while no streamed put into `folder` is in progress.
    fn clean_interrupted(&self, folder: &str) -> Result<usize>;
    /// Removes what an interrupted writer of `stream` left that is no
    /// object (a local backend's temporary files); S3 has none.
    fn clean_stream(&self, _stream: &str) -> Result<()> {
        Ok(())
    }
}
