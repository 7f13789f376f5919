//! Replication streams, as ddsnap replicates snapshot deltas: `send` turns
//! a snapshot (or what changed since a base) into a self-describing,
//! checksummed stream, and `receive` turns a stream back into snapshots,
//! resumably. The stream's bytes are in `format`, the content digest both
//! sides check in `digest`, resume tokens in `token`, the cursors of
//! streams kept in object storage in `cursor`.

pub mod cursor;
pub mod digest;
pub mod format;
pub mod receive;
pub mod send;
pub mod token;

pub use cursor::Cursor;
pub use format::{Position, Positions};
pub use receive::{
    abort, receive, restart_point, resume_token, ReceiveError, ReceiveSummary, RestartPoint,
};
pub use send::{send, send_to_sink, volume_digest, SendRequest, SendSummary, StreamSink};
pub use token::ResumeToken;
