//! Streams in object storage: `grove send --to URL`, `grove receive --from URL`.
