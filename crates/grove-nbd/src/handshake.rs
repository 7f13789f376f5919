//! Fixed newstyle negotiation: the greeting, then options until the client
//! picks an export (NBD_OPT_GO or NBD_OPT_EXPORT_NAME) or leaves.

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use grove_store::Pool;

use crate::codec::*;
use crate::export::{self, Export, ServerOptions};
use crate::stream::{discard, read_exact_or_eof};
use crate::tls::{TlsMode, TlsOptions};
use crate::validate::PAYLOAD_MAX_BYTES;

/// Largest option data read into memory. GO and INFO carry a name of at
/// most 4096 bytes and a few info types; meta context options carry a few
/// queries. Longer options are read past and refused with
/// NBD_REP_ERR_TOO_BIG.
pub const OPTION_DATA_MAX_BYTES: u32 = 64 * 1024;

/// Smallest request alignment the server accepts: the engine reads and
/// writes at byte granularity (partial blocks are read-modify-write).
pub const BLOCK_SIZE_MINIMUM_BYTES: u32 = 1;

/// The id this server gives `base:allocation` in NBD_OPT_SET_META_CONTEXT
/// replies and block status chunks. Any value works; clients echo nothing.
pub const BASE_ALLOCATION_CONTEXT_ID: u32 = 1;

/// The id of the first `grove:changed:BASE` context one
/// NBD_OPT_SET_META_CONTEXT selects; the next ones count up from it.
pub const CHANGED_CONTEXT_ID_FIRST: u32 = 2;

/// Most `grove:changed:BASE` contexts a LIST of the bare "grove:" namespace
/// offers (the newest bases): a reply stays small whatever the pool holds.
const LISTED_BASES_MAX: usize = 64;
/// Most `grove:changed:BASE` contexts one connection selects. Each costs a
/// diff and a chunk per BLOCK_STATUS request; more are skipped (with a
/// warning).
pub const CHANGED_CONTEXTS_MAX: usize = 8;

/// Handshake flags the server offers.
const HANDSHAKE_FLAGS: u16 = FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES;

/// Why negotiation ended the connection.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HandshakeError {
    #[error("connection failed during the handshake: {0}")]
    Io(#[from] io::Error),
    #[error("client broke the protocol during the handshake: {0}")]
    Protocol(String),
}

/// What the client settled on for the transmission phase.
pub(crate) struct Session {
    pub export: Export,
    pub structured_replies: bool,
    /// The metadata contexts BLOCK_STATUS answers for.
    pub meta_contexts: MetaContexts,
}

/// The metadata contexts NBD_OPT_SET_META_CONTEXT selected.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct MetaContexts {
    pub base_allocation: bool,
    /// `grove:changed:BASE` contexts, in the order they were selected.
    pub changed: Vec<ChangedContext>,
}

impl MetaContexts {
    /// How many contexts are selected: the chunks of a BLOCK_STATUS reply.
    pub fn count(&self) -> usize {
        usize::from(self.base_allocation) + self.changed.len()
    }
}

/// One selected `grove:changed:BASE` context.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ChangedContext {
    pub id: u32,
    /// The volume or removed snapshot the export is compared with.
    pub base: String,
}

pub(crate) enum Outcome {
    Transmission(Session),
    /// The client aborted or went away between options.
    Ended,
    /// NBD_OPT_STARTTLS was acknowledged: the caller runs the TLS handshake,
    /// then negotiation starts over (options agreed so far are forgotten)
    /// with [`negotiate_options`] on the TLS stream.
    StartTls,
}

/// What the negotiation has agreed so far.
#[derive(Default)]
struct State {
    structured_replies: bool,
    /// The export the last NBD_OPT_SET_META_CONTEXT selected contexts for,
    /// and what it selected.
    meta_contexts: Option<(String, MetaContexts)>,
}

pub(crate) struct Context<'a> {
    pub pool: &'a Pool,
    pub options: &'a ServerOptions,
    pub stopping: &'a AtomicBool,
    /// TLS this connection may start (TCP connections of a server with
    /// TLS settings); None: NBD_OPT_STARTTLS is unsupported.
    pub tls: Option<&'a TlsOptions>,
    /// Whether this connection already runs over TLS.
    pub tls_active: bool,
    /// Called once an export is chosen, before the reply that ends the
    /// handshake goes out: from then on the connection no longer gives
    /// way to newcomers, and the client cannot see its handshake done
    /// while the server still counts it as unfinished.
    pub entering_transmission: &'a dyn Fn(),
}

/// Sends the greeting and reads the client's flags; None if the client
/// left first.
pub(crate) fn greet(
    reader: &mut impl Read,
    writer: &mut impl Write,
) -> Result<Option<u32>, HandshakeError> {
    writer.write_all(&encode_greeting(HANDSHAKE_FLAGS))?;
    writer.flush()?;
    let mut flags = [0u8; CLIENT_FLAGS_BYTES];
    if !read_exact_or_eof(reader, &mut flags)? {
        return Ok(None);
    }
    let client_flags = decode_client_flags(&flags).expect("exactly four bytes");
    // proto.md: the server MUST close the connection on unknown client flags.
    if client_flags & !CLIENT_FLAGS_KNOWN != 0 {
        return Err(HandshakeError::Protocol(format!(
            "unknown client flags {client_flags:#x}"
        )));
    }
    if client_flags & FLAG_C_FIXED_NEWSTYLE == 0 {
        // Allowed by the protocol; every client of the last decade sets it.
        tracing::debug!("client did not set NBD_FLAG_C_FIXED_NEWSTYLE; continuing anyway");
    }
    Ok(Some(client_flags))
}

/// Answers options until the client picks an export, leaves, or starts
/// TLS.
pub(crate) fn negotiate_options(
    reader: &mut impl Read,
    writer: &mut impl Write,
    context: &Context<'_>,
    client_flags: u32,
) -> Result<Outcome, HandshakeError> {
    let no_zeroes = client_flags & FLAG_C_NO_ZEROES != 0;
    let mut state = State::default();
    loop {
        let (option, data) = match read_option(reader, writer)? {
            Incoming::Option(option, data) => (option, data),
            Incoming::Refused => continue,
            Incoming::Ended => return Ok(Outcome::Ended),
        };
        tracing::trace!(option, length = data.len(), "option");
        match gate_option(writer, context, option)? {
            Gate::Open => {}
            Gate::Refused => continue,
            Gate::End(outcome) => return Ok(outcome),
        }
        let handled = handle_option(writer, context, &mut state, option, &data, no_zeroes)?;
        if let Some(outcome) = handled {
            return Ok(outcome);
        }
    }
}

/// One option from the client, or why there is none to handle.
enum Incoming {
    Option(u32, Vec<u8>),
    /// Its data was over the limit: read past and refused.
    Refused,
    /// The client closed the connection between options.
    Ended,
}

/// Reads one option header and its data. Data over the limit is read past
/// without being held, and refused (or, for NBD_OPT_EXPORT_NAME, which has
/// no error reply, ends the session).
fn read_option(
    reader: &mut impl Read,
    writer: &mut impl Write,
) -> Result<Incoming, HandshakeError> {
    let mut header = [0u8; OPTION_HEADER_BYTES];
    if !read_exact_or_eof(reader, &mut header)? {
        return Ok(Incoming::Ended);
    }
    // A wrong magic means the stream lost its framing: no way to go on.
    let header =
        decode_option_header(&header).map_err(|e| HandshakeError::Protocol(e.to_string()))?;
    let option = header.option;
    if header.length > OPTION_DATA_MAX_BYTES {
        if option == OPT_EXPORT_NAME {
            // There is no error reply to NBD_OPT_EXPORT_NAME: the only
            // answer the protocol allows is to end the session.
            return Err(HandshakeError::Protocol(format!(
                "NBD_OPT_EXPORT_NAME with a {}-byte name",
                header.length
            )));
        }
        discard(reader, u64::from(header.length))?;
        send_reply(
            writer,
            option,
            REP_ERR_TOO_BIG,
            &format!(
                "option {option} has {} bytes of data; the limit is {OPTION_DATA_MAX_BYTES}",
                header.length
            ),
        )?;
        return Ok(Incoming::Refused);
    }
    let mut data = vec![0u8; header.length as usize];
    reader.read_exact(&mut data)?;
    Ok(Incoming::Option(option, data))
}

/// What the gates before any option's own handling decided.
enum Gate {
    /// The option goes on to be handled.
    Open,
    /// Refused with an error reply; the client may send another option.
    Refused,
    /// The session ends here.
    End(Outcome),
}

/// Refuses options while the server stops, and every option but
/// NBD_OPT_STARTTLS (and NBD_OPT_ABORT) before TLS on a listener that
/// requires it.
fn gate_option(
    writer: &mut impl Write,
    context: &Context<'_>,
    option: u32,
) -> Result<Gate, HandshakeError> {
    if context.stopping.load(Ordering::SeqCst) && option != OPT_ABORT {
        if option == OPT_EXPORT_NAME {
            return Ok(Gate::End(Outcome::Ended));
        }
        send_reply(
            writer,
            option,
            REP_ERR_SHUTDOWN,
            "the server is shutting down",
        )?;
        return Ok(Gate::Refused);
    }
    let tls_required =
        context.tls.is_some_and(|tls| tls.mode == TlsMode::Require) && !context.tls_active;
    if tls_required && !matches!(option, OPT_STARTTLS | OPT_ABORT) {
        if option == OPT_EXPORT_NAME {
            // No error reply exists for it: proto.md has the server close
            // the connection.
            return Err(HandshakeError::Protocol(
                "NBD_OPT_EXPORT_NAME before NBD_OPT_STARTTLS on a server that requires TLS".into(),
            ));
        }
        send_reply(
            writer,
            option,
            REP_ERR_TLS_REQD,
            "this server requires TLS: send NBD_OPT_STARTTLS first",
        )?;
        return Ok(Gate::Refused);
    }
    Ok(Gate::Open)
}

/// Answers one option. Some: the negotiation ends with this outcome.
fn handle_option(
    writer: &mut impl Write,
    context: &Context<'_>,
    state: &mut State,
    option: u32,
    data: &[u8],
    no_zeroes: bool,
) -> Result<Option<Outcome>, HandshakeError> {
    match option {
        OPT_STARTTLS => return start_tls(writer, context, data),
        OPT_EXPORT_NAME => {
            let name = decode_string("export name", data)
                .map_err(|e| HandshakeError::Protocol(e.to_string()))?;
            let export = export::resolve(context.pool, context.options, &name)
                .map_err(|refusal| HandshakeError::Protocol(refusal.message))?;
            let flags = export::transmission_flags(export.read_only, state.structured_replies);
            (context.entering_transmission)();
            writer.write_all(&encode_export_name_reply(
                export.size_bytes,
                flags,
                no_zeroes,
            ))?;
            writer.flush()?;
            return Ok(Some(Outcome::Transmission(session(export, state))));
        }
        OPT_ABORT => {
            // The client may already be gone: its leaving is the point.
            let _ = writer
                .write_all(&encode_option_reply(OPT_ABORT, REP_ACK, &[]))
                .and_then(|()| writer.flush());
            return Ok(Some(Outcome::Ended));
        }
        OPT_LIST => send(writer, &list(context, data))?,
        OPT_INFO | OPT_GO => {
            let (out, export) = info(option, data, context, state);
            let entering = option == OPT_GO && export.is_some();
            if entering {
                (context.entering_transmission)();
            }
            send(writer, &out)?;
            if let (true, Some(export)) = (entering, export) {
                return Ok(Some(Outcome::Transmission(session(export, state))));
            }
        }
        OPT_STRUCTURED_REPLY => {
            let out = if data.is_empty() {
                state.structured_replies = true;
                encode_option_reply(option, REP_ACK, &[])
            } else {
                error_reply(
                    option,
                    REP_ERR_INVALID,
                    "NBD_OPT_STRUCTURED_REPLY takes no data",
                )
            };
            send(writer, &out)?;
        }
        OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
            send(writer, &meta_context(option, data, context, state))?;
        }
        _ => send_reply(
            writer,
            option,
            REP_ERR_UNSUP,
            &format!("option {option} is not supported by this server"),
        )?,
    }
    Ok(None)
}

/// NBD_OPT_STARTTLS: acknowledged when this listener has TLS and it is not
/// running yet; the caller then wraps the connection.
fn start_tls(
    writer: &mut impl Write,
    context: &Context<'_>,
    data: &[u8],
) -> Result<Option<Outcome>, HandshakeError> {
    let refusal = if context.tls.is_none() {
        Some((REP_ERR_UNSUP, "this server has no TLS on this listener"))
    } else if context.tls_active {
        Some((REP_ERR_INVALID, "TLS is already running on this connection"))
    } else if !data.is_empty() {
        Some((REP_ERR_INVALID, "NBD_OPT_STARTTLS takes no data"))
    } else {
        None
    };
    match refusal {
        Some((reply_type, message)) => {
            send_reply(writer, OPT_STARTTLS, reply_type, message)?;
            Ok(None)
        }
        None => {
            send(writer, &encode_option_reply(OPT_STARTTLS, REP_ACK, &[]))?;
            Ok(Some(Outcome::StartTls))
        }
    }
}

/// NBD_OPT_LIST: every export the client may name, then an ack.
fn list(context: &Context<'_>, data: &[u8]) -> Vec<u8> {
    if !data.is_empty() {
        return error_reply(OPT_LIST, REP_ERR_INVALID, "NBD_OPT_LIST takes no data");
    }
    let mut out = Vec::new();
    for (name, description) in export::list(context.pool, context.options) {
        out.extend(encode_option_reply(
            OPT_LIST,
            REP_SERVER,
            &encode_rep_server(&name, &description),
        ));
    }
    out.extend(encode_option_reply(OPT_LIST, REP_ACK, &[]));
    out
}

fn session(export: Export, state: &State) -> Session {
    let meta_contexts = match &state.meta_contexts {
        Some((name, contexts)) if state.structured_replies && *name == export.name => {
            contexts.clone()
        }
        _ => MetaContexts::default(),
    };
    Session {
        export,
        structured_replies: state.structured_replies,
        meta_contexts,
    }
}

fn send(writer: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    writer.write_all(bytes)?;
    writer.flush()
}

fn send_reply(
    writer: &mut impl Write,
    option: u32,
    reply_type: u32,
    message: &str,
) -> io::Result<()> {
    send(writer, &error_reply(option, reply_type, message))
}

/// An option error reply; its payload is a message for humans.
fn error_reply(option: u32, reply_type: u32, message: &str) -> Vec<u8> {
    debug_assert!(is_option_error(reply_type));
    tracing::debug!(option, reply_type, message, "option refused");
    encode_option_reply(
        option,
        reply_type,
        truncate_message(message, STRING_MAX_BYTES).as_bytes(),
    )
}

/// Answers NBD_OPT_INFO or NBD_OPT_GO; returns the replies and, on
/// success, the export.
fn info(
    option: u32,
    data: &[u8],
    context: &Context<'_>,
    state: &State,
) -> (Vec<u8>, Option<Export>) {
    let request = match decode_info_request(data) {
        Ok(request) => request,
        Err(e) => return (error_reply(option, REP_ERR_INVALID, &e.to_string()), None),
    };
    let export = match export::resolve(context.pool, context.options, &request.name) {
        Ok(export) => export,
        Err(refusal) => {
            return (
                error_reply(option, refusal.reply_type, &refusal.message),
                None,
            )
        }
    };
    let flags = export::transmission_flags(export.read_only, state.structured_replies);
    let mut out = encode_option_reply(
        option,
        REP_INFO,
        &encode_info_export(export.size_bytes, flags),
    );
    // Sent whether or not asked for: the preferred size tells clients to
    // write whole blocks, which avoids read-modify-write in the engine.
    let preferred_bytes = export.block_size_bytes.max(512);
    out.extend(encode_option_reply(
        option,
        REP_INFO,
        &encode_info_block_size(BLOCK_SIZE_MINIMUM_BYTES, preferred_bytes, PAYLOAD_MAX_BYTES),
    ));
    // The canonical name matters when the client asked for the default.
    if request.info_types.contains(&INFO_NAME) || request.name.is_empty() {
        out.extend(encode_option_reply(
            option,
            REP_INFO,
            &encode_info_string(INFO_NAME, &export.name),
        ));
    }
    if request.info_types.contains(&INFO_DESCRIPTION) {
        out.extend(encode_option_reply(
            option,
            REP_INFO,
            &encode_info_string(INFO_DESCRIPTION, &export.description),
        ));
    }
    out.extend(encode_option_reply(option, REP_ACK, &[]));
    (out, Some(export))
}

/// Answers NBD_OPT_LIST_META_CONTEXT and NBD_OPT_SET_META_CONTEXT.
fn meta_context(option: u32, data: &[u8], context: &Context<'_>, state: &mut State) -> Vec<u8> {
    let set = option == OPT_SET_META_CONTEXT;
    if set {
        // A SET replaces the selection even when it fails.
        state.meta_contexts = None;
    }
    if !state.structured_replies {
        return error_reply(
            option,
            REP_ERR_INVALID,
            "negotiate NBD_OPT_STRUCTURED_REPLY before metadata contexts",
        );
    }
    let request = match decode_meta_context_request(data) {
        Ok(request) => request,
        Err(e) => return error_reply(option, REP_ERR_INVALID, &e.to_string()),
    };
    let export = match export::resolve(context.pool, context.options, &request.name) {
        Ok(export) => export,
        Err(refusal) => return error_reply(option, refusal.reply_type, &refusal.message),
    };
    let queried = match read_queries(&request.queries, set) {
        Ok(queried) => queried,
        Err(why) => return error_reply(option, REP_ERR_INVALID, &why),
    };
    let mut bases = queried.bases;
    if queried.list_changed {
        for base in listed_bases(context.pool, &export.name) {
            if !bases.contains(&base) {
                bases.push(base);
            }
        }
    }
    let selected = MetaContexts {
        base_allocation: queried.base_allocation,
        changed: select_changed(&export, &bases, set),
    };
    let out = meta_context_replies(option, set, &selected);
    if set && selected.count() > 0 {
        state.meta_contexts = Some((export.name, selected));
    }
    out
}

/// What a LIST or SET of metadata contexts asked for.
struct Queried {
    base_allocation: bool,
    /// Bases of grove:changed: contexts named, each once.
    bases: Vec<String>,
    /// A LIST of "grove:" or "grove:changed:": the export's newest earlier
    /// snapshots are listed as bases.
    list_changed: bool,
}

/// Reads the queries of a LIST or SET. LIST with no query lists every
/// context but grove:changed:, which has one per base; LIST of "grove:"
/// or "grove:changed:" lists those of the export's newest earlier
/// snapshots (SET selects only named bases).
fn read_queries(queries: &[String], set: bool) -> Result<Queried, String> {
    let mut queried = Queried {
        base_allocation: queries.is_empty() && !set,
        bases: Vec::new(),
        list_changed: false,
    };
    for query in queries {
        let Some((namespace, leaf)) = query.split_once(':') else {
            return Err(format!("metadata context query {query:?} has no namespace"));
        };
        // Unknown namespaces and leaves are ignored, as the protocol asks;
        // "base:" lists the namespace but selects nothing, and "grove:" or
        // "grove:changed:" (no base) select nothing.
        if namespace == "base" && (leaf == "allocation" || (leaf.is_empty() && !set)) {
            queried.base_allocation = true;
        }
        if let Some(base) = query.strip_prefix(META_CONTEXT_GROVE_CHANGED_PREFIX) {
            if !base.is_empty() && !queried.bases.iter().any(|b| b == base) {
                queried.bases.push(base.to_string());
            }
        }
        let whole_namespace = query == "grove:" || query == META_CONTEXT_GROVE_CHANGED_PREFIX;
        queried.list_changed |= !set && whole_namespace;
    }
    Ok(queried)
}

/// The grove:changed: contexts of `bases` that can be served, numbered
/// in order; a SET selects at most CHANGED_CONTEXTS_MAX. Those left out
/// are logged.
fn select_changed(export: &Export, bases: &[String], set: bool) -> Vec<ChangedContext> {
    let mut changed: Vec<ChangedContext> = Vec::new();
    for base in bases {
        let name = format!("{META_CONTEXT_GROVE_CHANGED_PREFIX}{base}");
        if set && changed.len() >= CHANGED_CONTEXTS_MAX {
            tracing::warn!(
                "metadata context {:?} not selected for export {:?}: a connection selects at most {CHANGED_CONTEXTS_MAX} grove:changed: contexts",
                truncate_message(&name, LOGGED_NAME_MAX_BYTES),
                export.name
            );
            continue;
        }
        if let Err(why) = changed_base_usable(export, base) {
            let name = truncate_message(&name, LOGGED_NAME_MAX_BYTES);
            if set {
                tracing::warn!(
                    "metadata context {name:?} not selected for export {:?}: {why}",
                    export.name
                );
            } else {
                tracing::debug!(
                    "metadata context {name:?} not listed for export {:?}: {why}",
                    export.name
                );
            }
            continue;
        }
        let id = CHANGED_CONTEXT_ID_FIRST + changed.len() as u32;
        changed.push(ChangedContext {
            id,
            base: base.to_string(),
        });
    }
    changed
}

/// One reply per context listed or selected (ids only for a SET), then
/// the ACK.
fn meta_context_replies(option: u32, set: bool, selected: &MetaContexts) -> Vec<u8> {
    let mut out = Vec::new();
    if selected.base_allocation {
        let id = if set { BASE_ALLOCATION_CONTEXT_ID } else { 0 };
        out.extend(encode_option_reply(
            option,
            REP_META_CONTEXT,
            &encode_rep_meta_context(id, META_CONTEXT_BASE_ALLOCATION),
        ));
    }
    for changed in &selected.changed {
        let id = if set { changed.id } else { 0 };
        let name = format!("{META_CONTEXT_GROVE_CHANGED_PREFIX}{}", changed.base);
        out.extend(encode_option_reply(
            option,
            REP_META_CONTEXT,
            &encode_rep_meta_context(id, &name),
        ));
    }
    out.extend(encode_option_reply(option, REP_ACK, &[]));
    out
}

/// Longest context name a log line quotes; longer ones are cut.
const LOGGED_NAME_MAX_BYTES: usize = 200;

/// Whether `grove:changed:BASE` can be answered for `export`: BASE names a
/// volume, snapshot or removed snapshot that the engine can compare the
/// export with. Cheap: the engine checks without computing a diff.
/// The bases a LIST of "grove:" offers for export `name`, newest first, at
/// most LISTED_BASES_MAX: a volume's snapshots, or a snapshot's earlier
/// ones in its line.
fn listed_bases(pool: &Pool, name: &str) -> Vec<String> {
    let summaries = pool.volume_summaries();
    let is_snapshot = summaries
        .iter()
        .any(|s| s.name == name && s.kind == grove_store::VolumeKind::Snapshot);
    let mut bases: Vec<(u64, String)> = if is_snapshot {
        pool.earlier_snapshots(name)
            .unwrap_or_default()
            .into_iter()
            .map(|s| (s.created_generation, s.name))
            .collect()
    } else {
        summaries
            .into_iter()
            .filter(|s| {
                s.kind == grove_store::VolumeKind::Snapshot && s.parent.as_deref() == Some(name)
            })
            .map(|s| (s.id, s.name))
            .collect()
    };
    bases.sort_by_key(|b| std::cmp::Reverse(b.0));
    bases.truncate(LISTED_BASES_MAX);
    bases.into_iter().map(|(_, name)| name).collect()
}

fn changed_base_usable(export: &Export, base: &str) -> Result<(), String> {
    grove_store::validate_volume_name(base)
        .map_err(|_| "it is not a valid volume name".to_string())?;
    export
        .source
        .diff_in(base, 0, 0)
        .map(|_| ())
        .map_err(|e| e.to_string())
}
