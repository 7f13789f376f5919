//! How the device's bytes map onto RADOS objects: fixed-size stripes named
//! by their index, as RBD names its data objects.

/// RBD's default object size, and so ours.
pub const OBJECT_SIZE_DEFAULT: u64 = 4 << 20;

/// The largest object size accepted: librados reads and writes at most
/// UINT_MAX/2 bytes in one call, and the OSD's default `osd_max_object_size`
/// is 128 MiB.
pub(crate) const OBJECT_SIZE_MAX: u64 = 128 << 20;

/// The smallest: a header and a few blocks would otherwise span thousands of
/// objects.
pub(crate) const OBJECT_SIZE_MIN: u64 = 4096;

/// The object holding the device's length and object size; the exclusive
/// lock is taken on it too.
pub(crate) fn header_object(prefix: &str) -> String {
    format!("{prefix}.header")
}

/// The data object holding stripe `index`.
pub(crate) fn data_object(prefix: &str, index: u64) -> String {
    format!("{prefix}.{index:016x}")
}

/// One object's share of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    /// Which object.
    pub(crate) index: u64,
    /// Where in the object the share starts.
    pub(crate) object_offset: u64,
    /// Where in the request's buffer it starts.
    pub(crate) buf_offset: usize,
    /// Its length in bytes.
    pub(crate) len: usize,
}

impl Piece {
    /// Whether the piece covers its whole object.
    pub(crate) fn is_whole_object(&self, object_size: u64) -> bool {
        self.object_offset == 0 && self.len as u64 == object_size
    }

    /// Whether the piece runs to its object's end.
    pub(crate) fn reaches_object_end(&self, object_size: u64) -> bool {
        self.object_offset + self.len as u64 == object_size
    }
}

/// Splits `len` bytes at `offset` into one piece per object touched, in
/// order. `object_size` is never 0 (the header refuses it).
pub(crate) fn pieces(offset: u64, len: u64, object_size: u64) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut done = 0u64;
    while done < len {
        let at = offset + done;
        let object_offset = at % object_size;
        let take = (object_size - object_offset).min(len - done);
        out.push(Piece {
            index: at / object_size,
            object_offset,
            buf_offset: done as usize,
            len: take as usize,
        });
        done += take;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_splits_at_object_boundaries() {
        let p = pieces(4090, 20, 4096);
        assert_eq!(p.len(), 2);
        assert_eq!(
            (p[0].index, p[0].object_offset, p[0].buf_offset, p[0].len),
            (0, 4090, 0, 6)
        );
        assert_eq!(
            (p[1].index, p[1].object_offset, p[1].buf_offset, p[1].len),
            (1, 0, 6, 14)
        );
        assert!(p[0].reaches_object_end(4096));
        let whole = pieces(8192, 4096, 4096);
        assert_eq!(whole.len(), 1);
        assert!(whole[0].is_whole_object(4096));
        assert!(pieces(5, 0, 4096).is_empty());
    }

    #[test]
    fn object_names_sort_by_index() {
        assert_eq!(data_object("p", 0x1f), "p.000000000000001f");
        assert_eq!(header_object("p"), "p.header");
    }
}
