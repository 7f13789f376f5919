//! A stream's work where the pool is open, for the commands (replicate.rs,
//! objects.rs) and for a daemon answering them over its control socket:
//! what to send for `grove send`'s arguments, sending and receiving, the
//! cursor moved after a send, the lines that describe the outcome, and
//! `grove hash` and `grove receive --status`.

use std::io::{Read, Write};

use anyhow::{bail, Context, Result};
use grove_send::{ReceiveError, ReceiveSummary, ResumeToken, SendRequest, SendSummary};
use grove_store::{DiffFrom, Pool};
use serde::{Deserialize, Serialize};

use crate::output::format_size;

/// `grove send`'s arguments, as the control socket carries them too.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SendArgs {
    pub snapshot: Option<String>,
    pub from: Option<String>,
    pub range_from: Option<String>,
    pub cursor: Option<String>,
    pub resume: Option<String>,
    /// Only the stream's bytes after this position (the rest of an
    /// interrupted upload).
    #[serde(default)]
    pub continue_at: Option<grove_send::Position>,
}

/// What the engine is asked to send for `args`.
pub fn request(pool: &Pool, args: &SendArgs) -> Result<SendRequest> {
    if let Some(text) = &args.resume {
        return Ok(SendRequest {
            resume: Some(ResumeToken::decode(text)?),
            ..SendRequest::default()
        });
    }
    let target = args.snapshot.clone().context("name the snapshot to send")?;
    let (from, range) = match (&args.from, &args.range_from) {
        (Some(base), None) => match base.strip_suffix("..") {
            Some(base) => (Some(DiffFrom::Name(base.to_string())), true),
            None => (Some(DiffFrom::Name(base.clone())), false),
        },
        (None, Some(base)) => (Some(DiffFrom::Name(base.clone())), true),
        (None, None) => match &args.cursor {
            Some(target) if pool.cursors().iter().any(|c| &c.target == target) => {
                (Some(DiffFrom::Cursor(target.clone())), false)
            }
            _ => (None, false),
        },
        (Some(_), Some(_)) => bail!("give the base once: --from BASE or -I BASE"),
    };
    Ok(SendRequest {
        target,
        from,
        range,
        continue_at: args.continue_at,
        ..SendRequest::default()
    })
}

/// Sends from an open pool: the stream goes to `out`, then the cursor
/// (if asked for) moves to the snapshot sent.
pub fn send_from_pool(pool: &Pool, args: &SendArgs, out: impl Write) -> Result<SendSummary> {
    let request = request(pool, args)?;
    let summary = grove_send::send(pool, &request, out, &mut |_| {})?;
    move_cursor(pool, args, &summary)?;
    Ok(summary)
}

/// After a whole stream went out: the cursor asked for points at its last
/// snapshot.
pub fn move_cursor(pool: &Pool, args: &SendArgs, summary: &SendSummary) -> Result<()> {
    if let Some(target) = &args.cursor {
        pool.set_cursor(target, &summary.target)
            .with_context(|| format!("the stream was sent, but moving cursor {target:?} failed"))?;
    }
    Ok(())
}

/// Which stream an upload of `grove send` with `args` holds.
pub fn fingerprint(pool: &Pool, args: &SendArgs) -> Result<[u8; 16]> {
    request_fingerprint(pool, &request(pool, args)?)
}

/// Which stream an upload of `request` holds: the snapshots it carries.
pub fn request_fingerprint(pool: &Pool, request: &SendRequest) -> Result<[u8; 16]> {
    let mut identities = pool.identity(&request.target)?.guid.to_vec();
    if let Some(base) = &request.from {
        identities.extend_from_slice(&pool.base_identity(base)?.guid);
    }
    identities.push(u8::from(request.range));
    Ok(grove_send::digest::fingerprint(&identities))
}

/// One line on what a send carried. A full stream leaves a volume's
/// unmapped space out (the receiver's new volume reads it as zeros); an
/// incremental one marks what the target unmapped as Hole records.
pub fn describe_send(summary: &SendSummary) -> String {
    let carried = if summary.full && summary.sections == 1 {
        let unmapped = summary
            .target_size_bytes
            .saturating_sub(summary.data_bytes + summary.zero_bytes);
        format!(
            "a full stream of a {} volume: {} of data, {} of zeros as records, {} unmapped left out",
            format_size(summary.target_size_bytes),
            format_size(summary.data_bytes),
            format_size(summary.zero_bytes),
            format_size(unmapped)
        )
    } else {
        format!(
            "{} of data, {} of zeros and {} unmapped since the base, as records",
            format_size(summary.data_bytes),
            format_size(summary.zero_bytes),
            format_size(summary.hole_bytes)
        )
    };
    format!(
        "sent {:?} ({} snapshot{}), {carried}; {} stream bytes",
        summary.target,
        summary.sections,
        if summary.sections == 1 { "" } else { "s" },
        summary.stream_bytes
    )
}

pub fn describe_receive(summary: &ReceiveSummary) -> String {
    format!(
        "received {} ({} of data, {} stream bytes), content digest verified",
        summary
            .snapshots
            .iter()
            .map(|s| format!("{s:?}"))
            .collect::<Vec<_>>()
            .join(", "),
        format_size(summary.data_bytes),
        summary.stream_bytes
    )
}

/// A failed receive as one error: its cause, what finished, and how to
/// resume.
pub fn receive_failure(error: ReceiveError) -> anyhow::Error {
    let finished = if error.finished.is_empty() {
        String::new()
    } else {
        format!(
            " (received before it stopped: {})",
            error.finished.join(", ")
        )
    };
    anyhow::anyhow!("cannot receive: {error}{finished}")
}

/// Receives into an open pool.
pub fn receive_into_pool(pool: &Pool, name: &str, input: impl Read) -> Result<ReceiveSummary> {
    grove_send::receive(pool, name, input, &mut |_| {}).map_err(receive_failure)
}

/// `grove hash`: the content digest of a volume, as hex.
pub fn hash(pool: &Pool, name: &str) -> Result<String> {
    let volume = pool.volume(name)?;
    let digest = grove_send::volume_digest(&volume)?;
    Ok(hex::encode(digest.finish(volume.size_bytes()?)))
}

/// `grove receive --status`: the token that resumes a partial receive.
pub fn status(pool: &Pool, name: &str) -> Result<String> {
    Ok(grove_send::resume_token(pool, name)?.encode())
}
