//! The header object's contents: the device's object size and length, as
//! three lines of text, so that `rados get` shows them to a person.

use std::io;

const MAGIC: &str = "grove-rados 1";

/// What the header holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) object_size: u64,
    pub(crate) len_bytes: u64,
}

impl Header {
    pub(crate) fn encode(&self) -> Vec<u8> {
        format!(
            "{MAGIC}\nobject_size {}\nlength {}\n",
            self.object_size, self.len_bytes
        )
        .into_bytes()
    }

    /// Parses a header; `name` is the object's, for the error.
    pub(crate) fn decode(bytes: &[u8], name: &str) -> io::Result<Header> {
        let bad = |why: &str| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("RADOS object {name} is not a grove-rados header: {why}"),
            )
        };
        let text = std::str::from_utf8(bytes).map_err(|_| bad("not text"))?;
        let mut lines = text.lines();
        if lines.next() != Some(MAGIC) {
            return Err(bad(&format!("its first line is not {MAGIC:?}")));
        }
        let mut field = |key: &str| -> io::Result<u64> {
            lines
                .next()
                .and_then(|line| line.strip_prefix(key))
                .and_then(|value| value.trim().parse::<u64>().ok())
                .ok_or_else(|| bad(&format!("no {key:?} line")))
        };
        let object_size = field("object_size ")?;
        let len_bytes = field("length ")?;
        if !(crate::layout::OBJECT_SIZE_MIN..=crate::layout::OBJECT_SIZE_MAX).contains(&object_size)
        {
            return Err(bad(&format!("object size {object_size} is out of range")));
        }
        Ok(Header {
            object_size,
            len_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_round_trips_and_garbage_is_refused() {
        let h = Header {
            object_size: 4 << 20,
            len_bytes: 12345,
        };
        assert_eq!(Header::decode(&h.encode(), "x").unwrap(), h);
        let err = Header::decode(b"hello", "x.header").unwrap_err();
        assert!(err.to_string().contains("x.header"), "{err}");
        assert!(Header::decode(b"grove-rados 1\nobject_size 0\nlength 1\n", "x").is_err());
    }
}
