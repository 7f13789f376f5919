//! The NBD wire format: constants, and pure functions that encode and decode
//! handshake messages, option data, requests and replies. Nothing here does
//! I/O or touches the engine, so the decoders can be fuzzed on arbitrary
//! bytes and the encoders can be checked against them.
//!
//! Everything on the wire is big-endian. The byte layout of each message is
//! written above its encoder; decoders check every length they read against
//! the bytes actually present and never allocate more than they were given.

use std::fmt;

// ---------------------------------------------------------------------------
// Magic numbers.

/// "NBDMAGIC": the first 8 bytes a server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": newstyle negotiation, and the prefix of every client option.
pub const IHAVEOPT_MAGIC: u64 = 0x4948_4156_454f_5054;
/// Prefix of every option reply in fixed newstyle negotiation.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Prefix of every transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Prefix of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Prefix of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// ---------------------------------------------------------------------------
// Handshake flags (server, 16 bits) and client flags (32 bits).

pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;
/// Every client flag this server understands; any other bit ends the session.
pub const CLIENT_FLAGS_KNOWN: u32 = FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES;

// ---------------------------------------------------------------------------
// Transmission flags (16 bits), sent with the export size.

pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_ROTATIONAL: u16 = 1 << 4;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_RESIZE: u16 = 1 << 9;
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// ---------------------------------------------------------------------------
// Options (client to server, during the handshake).

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

// Option reply types. Errors have bit 31 set.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
const REP_ERROR_BIT: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_ERROR_BIT | 1;
pub const REP_ERR_POLICY: u32 = REP_ERROR_BIT | 2;
pub const REP_ERR_INVALID: u32 = REP_ERROR_BIT | 3;
pub const REP_ERR_PLATFORM: u32 = REP_ERROR_BIT | 4;
pub const REP_ERR_TLS_REQD: u32 = REP_ERROR_BIT | 5;
pub const REP_ERR_UNKNOWN: u32 = REP_ERROR_BIT | 6;
pub const REP_ERR_SHUTDOWN: u32 = REP_ERROR_BIT | 7;
pub const REP_ERR_BLOCK_SIZE_REQD: u32 = REP_ERROR_BIT | 8;
pub const REP_ERR_TOO_BIG: u32 = REP_ERROR_BIT | 9;

/// Whether an option reply type is an error (bit 31).
pub fn is_option_error(reply_type: u32) -> bool {
    reply_type & REP_ERROR_BIT != 0
}

// Information types in NBD_REP_INFO replies to NBD_OPT_INFO and NBD_OPT_GO.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// ---------------------------------------------------------------------------
// Transmission: command types, command flags, reply chunk types and flags.

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

pub const REPLY_FLAG_DONE: u16 = 1 << 0;

pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;
pub const REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) | 2;

// Errors in replies. These are the protocol's values, not the host's errnos.
pub const NBD_EPERM: u32 = 1;
pub const NBD_EIO: u32 = 5;
pub const NBD_ENOMEM: u32 = 12;
pub const NBD_EINVAL: u32 = 22;
pub const NBD_ENOSPC: u32 = 28;
pub const NBD_EOVERFLOW: u32 = 75;
pub const NBD_ENOTSUP: u32 = 95;
pub const NBD_ESHUTDOWN: u32 = 108;

// `base:allocation` status flags.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

// `grove:changed:BASE` status flags.
pub const STATE_CHANGED: u32 = 1 << 0;

/// The standard metadata context: holes and data.
pub const META_CONTEXT_BASE_ALLOCATION: &str = "base:allocation";
/// The `base:` namespace prefix; as a query on its own it lists the namespace.
pub const META_NAMESPACE_BASE: &str = "base:";
/// The prefix of grove's changed-blocks contexts: `grove:changed:BASE`
/// marks where the export differs from BASE, a volume, snapshot or removed
/// snapshot (bookmark) of its line. BASE is everything after the prefix.
pub const META_CONTEXT_GROVE_CHANGED_PREFIX: &str = "grove:changed:";

// ---------------------------------------------------------------------------
// Sizes of the fixed parts of messages.

/// The protocol's limit on any string: export names, queries, messages.
pub const STRING_MAX_BYTES: usize = 4096;
pub const GREETING_BYTES: usize = 18;
pub const CLIENT_FLAGS_BYTES: usize = 4;
pub const OPTION_HEADER_BYTES: usize = 16;
pub const OPTION_REPLY_HEADER_BYTES: usize = 20;
/// Zero padding after an NBD_OPT_EXPORT_NAME reply, unless NO_ZEROES.
pub const EXPORT_NAME_PADDING_BYTES: usize = 124;
pub const REQUEST_BYTES: usize = 28;
pub const SIMPLE_REPLY_BYTES: usize = 16;
pub const STRUCTURED_REPLY_HEADER_BYTES: usize = 20;
/// The offset that starts an NBD_REPLY_TYPE_OFFSET_DATA payload.
pub const OFFSET_DATA_PREFIX_BYTES: usize = 8;
/// One (length, flags) descriptor in an NBD_REPLY_TYPE_BLOCK_STATUS chunk.
pub const BLOCK_STATUS_DESCRIPTOR_BYTES: usize = 8;

/// What went wrong decoding bytes from the wire.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("{what}: needs {needed} bytes, got {got}")]
    Short {
        what: &'static str,
        needed: usize,
        got: usize,
    },
    #[error("{what}: bad magic {found:#x}")]
    BadMagic { what: &'static str, found: u64 },
    #[error("{what}: {len} bytes is longer than the limit of {max}")]
    TooLong {
        what: &'static str,
        len: usize,
        max: usize,
    },
    #[error("{what} is not valid UTF-8")]
    NotUtf8 { what: &'static str },
    #[error("{what} contains a NUL byte")]
    Nul { what: &'static str },
    #[error("{what}: {extra} bytes left over after the last field")]
    Trailing { what: &'static str, extra: usize },
}

/// Reads big-endian fields off a byte slice, failing instead of panicking
/// when the slice runs out.
struct Cursor<'a> {
    what: &'static str,
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn new(what: &'static str, buf: &'a [u8]) -> Self {
        Cursor { what, buf, pos: 0 }
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, len: usize) -> Result<&'a [u8], CodecError> {
        if len > self.remaining() {
            return Err(CodecError::Short {
                what: self.what,
                needed: self.pos.saturating_add(len),
                got: self.buf.len(),
            });
        }
        let out = &self.buf[self.pos..self.pos + len];
        self.pos += len;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], CodecError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u16(&mut self) -> Result<u16, CodecError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, CodecError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, CodecError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    /// A string whose length the message gave before it.
    fn string(&mut self, len: u32) -> Result<String, CodecError> {
        let len = len as usize;
        if len > STRING_MAX_BYTES {
            return Err(CodecError::TooLong {
                what: self.what,
                len,
                max: STRING_MAX_BYTES,
            });
        }
        decode_string(self.what, self.take(len)?)
    }

    fn finish(self) -> Result<(), CodecError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(CodecError::Trailing {
                what: self.what,
                extra,
            }),
        }
    }
}

/// Checks an NBD string: at most STRING_MAX_BYTES of UTF-8 without NUL.
pub fn decode_string(what: &'static str, bytes: &[u8]) -> Result<String, CodecError> {
    if bytes.len() > STRING_MAX_BYTES {
        return Err(CodecError::TooLong {
            what,
            len: bytes.len(),
            max: STRING_MAX_BYTES,
        });
    }
    let text = std::str::from_utf8(bytes).map_err(|_| CodecError::NotUtf8 { what })?;
    if text.contains('\0') {
        return Err(CodecError::Nul { what });
    }
    Ok(text.to_string())
}

/// Cuts a human-readable message to at most `max_bytes`, on a character
/// boundary, so that it always fits the field that carries it.
pub fn truncate_message(message: &str, max_bytes: usize) -> &str {
    if message.len() <= max_bytes {
        return message;
    }
    let mut end = max_bytes;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    &message[..end]
}

fn string_len_u32(s: &str) -> u32 {
    assert!(
        s.len() <= STRING_MAX_BYTES,
        "NBD strings are at most 4096 bytes"
    );
    s.len() as u32
}

// ---------------------------------------------------------------------------
// Handshake.

// Server greeting (18 bytes):
//
//   offset size field
//        0    8 NBD_MAGIC "NBDMAGIC"
//        8    8 IHAVEOPT_MAGIC "IHAVEOPT"
//       16    2 handshake flags
pub fn encode_greeting(handshake_flags: u16) -> [u8; GREETING_BYTES] {
    let mut out = [0u8; GREETING_BYTES];
    out[0..8].copy_from_slice(&NBD_MAGIC.to_be_bytes());
    out[8..16].copy_from_slice(&IHAVEOPT_MAGIC.to_be_bytes());
    out[16..18].copy_from_slice(&handshake_flags.to_be_bytes());
    out
}

/// Decodes the greeting (for clients and tests); returns the handshake flags.
pub fn decode_greeting(buf: &[u8]) -> Result<u16, CodecError> {
    let mut c = Cursor::new("greeting", buf);
    let magic = c.u64()?;
    if magic != NBD_MAGIC {
        return Err(CodecError::BadMagic {
            what: "greeting",
            found: magic,
        });
    }
    let opt_magic = c.u64()?;
    if opt_magic != IHAVEOPT_MAGIC {
        return Err(CodecError::BadMagic {
            what: "greeting",
            found: opt_magic,
        });
    }
    let flags = c.u16()?;
    c.finish()?;
    Ok(flags)
}

// Client flags (4 bytes): one 32-bit field, answered to the greeting.
pub fn decode_client_flags(buf: &[u8]) -> Result<u32, CodecError> {
    let mut c = Cursor::new("client flags", buf);
    let flags = c.u32()?;
    c.finish()?;
    Ok(flags)
}

/// The fixed part of a client option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    /// Bytes of option data that follow the header.
    pub length: u32,
}

// Option header (16 bytes), followed by `length` bytes of option data:
//
//   offset size field
//        0    8 IHAVEOPT_MAGIC
//        8    4 option
//       12    4 length of the option data
pub fn encode_option_header(header: OptionHeader) -> [u8; OPTION_HEADER_BYTES] {
    let mut out = [0u8; OPTION_HEADER_BYTES];
    out[0..8].copy_from_slice(&IHAVEOPT_MAGIC.to_be_bytes());
    out[8..12].copy_from_slice(&header.option.to_be_bytes());
    out[12..16].copy_from_slice(&header.length.to_be_bytes());
    out
}

pub fn decode_option_header(buf: &[u8]) -> Result<OptionHeader, CodecError> {
    let mut c = Cursor::new("option header", buf);
    let magic = c.u64()?;
    if magic != IHAVEOPT_MAGIC {
        return Err(CodecError::BadMagic {
            what: "option header",
            found: magic,
        });
    }
    let header = OptionHeader {
        option: c.u32()?,
        length: c.u32()?,
    };
    c.finish()?;
    Ok(header)
}

/// The fixed part of an option reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionReplyHeader {
    pub option: u32,
    pub reply_type: u32,
    pub length: u32,
}

// Option reply (20 bytes + payload):
//
//   offset size field
//        0    8 OPTION_REPLY_MAGIC
//        8    4 the option this answers
//       12    4 reply type (NBD_REP_*)
//       16    4 payload length
//       20    n payload
pub fn encode_option_reply(option: u32, reply_type: u32, payload: &[u8]) -> Vec<u8> {
    let length = u32::try_from(payload.len()).expect("option replies are small");
    let mut out = Vec::with_capacity(OPTION_REPLY_HEADER_BYTES + payload.len());
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply_type.to_be_bytes());
    out.extend_from_slice(&length.to_be_bytes());
    out.extend_from_slice(payload);
    debug_assert_eq!(
        decode_option_reply_header(&out[..OPTION_REPLY_HEADER_BYTES]),
        Ok(OptionReplyHeader {
            option,
            reply_type,
            length
        })
    );
    out
}

pub fn decode_option_reply_header(buf: &[u8]) -> Result<OptionReplyHeader, CodecError> {
    let mut c = Cursor::new("option reply header", buf);
    let magic = c.u64()?;
    if magic != OPTION_REPLY_MAGIC {
        return Err(CodecError::BadMagic {
            what: "option reply header",
            found: magic,
        });
    }
    let header = OptionReplyHeader {
        option: c.u32()?,
        reply_type: c.u32()?,
        length: c.u32()?,
    };
    c.finish()?;
    Ok(header)
}

// Reply to NBD_OPT_EXPORT_NAME (10 or 134 bytes); no option reply header:
//
//   offset size field
//        0    8 export size in bytes
//        8    2 transmission flags
//       10  124 zeros, left out when the client set NBD_FLAG_C_NO_ZEROES
pub fn encode_export_name_reply(
    size_bytes: u64,
    transmission_flags: u16,
    no_zeroes: bool,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(10 + EXPORT_NAME_PADDING_BYTES);
    out.extend_from_slice(&size_bytes.to_be_bytes());
    out.extend_from_slice(&transmission_flags.to_be_bytes());
    if !no_zeroes {
        out.resize(10 + EXPORT_NAME_PADDING_BYTES, 0);
    }
    out
}

/// The data of NBD_OPT_INFO and NBD_OPT_GO.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    /// NBD_INFO_* types the client asks for.
    pub info_types: Vec<u16>,
}

// NBD_OPT_INFO / NBD_OPT_GO data:
//
//   offset   size  field
//        0      4  name length n
//        4      n  export name (UTF-8)
//      4+n      2  number of information requests k
//      6+n   2*k   NBD_INFO_* types
pub fn encode_info_request(request: &InfoRequest) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&string_len_u32(&request.name).to_be_bytes());
    out.extend_from_slice(request.name.as_bytes());
    let count = u16::try_from(request.info_types.len()).expect("at most 65535 info requests");
    out.extend_from_slice(&count.to_be_bytes());
    for info in &request.info_types {
        out.extend_from_slice(&info.to_be_bytes());
    }
    out
}

pub fn decode_info_request(data: &[u8]) -> Result<InfoRequest, CodecError> {
    let mut c = Cursor::new("NBD_OPT_INFO/GO data", data);
    let name_len = c.u32()?;
    let name = c.string(name_len)?;
    let count = c.u16()?;
    // Each request is 2 bytes: check the count against what is there before
    // allocating, so a lying count costs nothing.
    let needed = usize::from(count) * 2;
    if needed != c.remaining() {
        return Err(CodecError::Short {
            what: "NBD_OPT_INFO/GO information requests",
            needed: c.pos + needed,
            got: data.len(),
        });
    }
    let mut info_types = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        info_types.push(c.u16()?);
    }
    c.finish()?;
    Ok(InfoRequest { name, info_types })
}

/// The data of NBD_OPT_LIST_META_CONTEXT and NBD_OPT_SET_META_CONTEXT.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaContextRequest {
    pub name: String,
    pub queries: Vec<String>,
}

// NBD_OPT_LIST_META_CONTEXT / NBD_OPT_SET_META_CONTEXT data:
//
//   offset   size  field
//        0      4  export name length n
//        4      n  export name
//      4+n      4  number of queries k
//      8+n      -  k times: 4-byte query length m, then m bytes of query
pub fn encode_meta_context_request(request: &MetaContextRequest) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&string_len_u32(&request.name).to_be_bytes());
    out.extend_from_slice(request.name.as_bytes());
    let count = u32::try_from(request.queries.len()).expect("query count fits u32");
    out.extend_from_slice(&count.to_be_bytes());
    for query in &request.queries {
        out.extend_from_slice(&string_len_u32(query).to_be_bytes());
        out.extend_from_slice(query.as_bytes());
    }
    out
}

pub fn decode_meta_context_request(data: &[u8]) -> Result<MetaContextRequest, CodecError> {
    let mut c = Cursor::new("meta context option data", data);
    let name_len = c.u32()?;
    let name = c.string(name_len)?;
    let count = c.u32()?;
    // Every query takes at least its 4-byte length, so a count larger than
    // that allows is a lie; reject it before reserving anything.
    if (count as usize).saturating_mul(4) > c.remaining() {
        return Err(CodecError::Short {
            what: "meta context queries",
            needed: c.pos.saturating_add((count as usize).saturating_mul(4)),
            got: data.len(),
        });
    }
    let mut queries = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let len = c.u32()?;
        queries.push(c.string(len)?);
    }
    c.finish()?;
    Ok(MetaContextRequest { name, queries })
}

// NBD_REP_INFO payload for NBD_INFO_EXPORT (12 bytes):
//
//   offset size field
//        0    2 NBD_INFO_EXPORT
//        2    8 export size in bytes
//       10    2 transmission flags
pub fn encode_info_export(size_bytes: u64, transmission_flags: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(12);
    out.extend_from_slice(&INFO_EXPORT.to_be_bytes());
    out.extend_from_slice(&size_bytes.to_be_bytes());
    out.extend_from_slice(&transmission_flags.to_be_bytes());
    out
}

// NBD_REP_INFO payload for NBD_INFO_BLOCK_SIZE (14 bytes):
//
//   offset size field
//        0    2 NBD_INFO_BLOCK_SIZE
//        2    4 minimum block size
//        6    4 preferred block size
//       10    4 maximum payload size
pub fn encode_info_block_size(
    minimum_bytes: u32,
    preferred_bytes: u32,
    payload_max_bytes: u32,
) -> Vec<u8> {
    // The protocol's constraints on the three values (proto.md, "Size
    // constraints"); a server that breaks them confuses every client.
    assert!(minimum_bytes.is_power_of_two() && minimum_bytes <= 1 << 16);
    assert!(preferred_bytes.is_power_of_two() && preferred_bytes >= minimum_bytes.max(512));
    assert!(payload_max_bytes >= preferred_bytes);
    let mut out = Vec::with_capacity(14);
    out.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    out.extend_from_slice(&minimum_bytes.to_be_bytes());
    out.extend_from_slice(&preferred_bytes.to_be_bytes());
    out.extend_from_slice(&payload_max_bytes.to_be_bytes());
    out
}

// NBD_REP_INFO payload for NBD_INFO_NAME or NBD_INFO_DESCRIPTION:
//
//   offset size field
//        0    2 NBD_INFO_NAME or NBD_INFO_DESCRIPTION
//        2    n the string
pub fn encode_info_string(info_type: u16, text: &str) -> Vec<u8> {
    debug_assert!(info_type == INFO_NAME || info_type == INFO_DESCRIPTION);
    let text = truncate_message(text, STRING_MAX_BYTES);
    let mut out = Vec::with_capacity(2 + text.len());
    out.extend_from_slice(&info_type.to_be_bytes());
    out.extend_from_slice(text.as_bytes());
    out
}

// NBD_REP_SERVER payload (a reply to NBD_OPT_LIST):
//
//   offset size field
//        0    4 name length n
//        4    n export name
//      4+n    - description for humans (rest of the payload)
pub fn encode_rep_server(name: &str, description: &str) -> Vec<u8> {
    let description = truncate_message(description, STRING_MAX_BYTES);
    let mut out = Vec::with_capacity(4 + name.len() + description.len());
    out.extend_from_slice(&string_len_u32(name).to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(description.as_bytes());
    out
}

// NBD_REP_META_CONTEXT payload:
//
//   offset size field
//        0    4 context id (0 in replies to LIST_META_CONTEXT)
//        4    n context name
pub fn encode_rep_meta_context(context_id: u32, name: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + name.len());
    out.extend_from_slice(&context_id.to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    out
}

// ---------------------------------------------------------------------------
// Transmission.

/// A transmission command, with unknown values kept so that the server can
/// answer them with an error instead of dropping the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Command {
    Read,
    Write,
    Disc,
    Flush,
    Trim,
    Cache,
    WriteZeroes,
    BlockStatus,
    Unknown(u16),
}

impl Command {
    pub fn from_u16(value: u16) -> Command {
        match value {
            CMD_READ => Command::Read,
            CMD_WRITE => Command::Write,
            CMD_DISC => Command::Disc,
            CMD_FLUSH => Command::Flush,
            CMD_TRIM => Command::Trim,
            CMD_CACHE => Command::Cache,
            CMD_WRITE_ZEROES => Command::WriteZeroes,
            CMD_BLOCK_STATUS => Command::BlockStatus,
            other => Command::Unknown(other),
        }
    }

    pub fn to_u16(self) -> u16 {
        match self {
            Command::Read => CMD_READ,
            Command::Write => CMD_WRITE,
            Command::Disc => CMD_DISC,
            Command::Flush => CMD_FLUSH,
            Command::Trim => CMD_TRIM,
            Command::Cache => CMD_CACHE,
            Command::WriteZeroes => CMD_WRITE_ZEROES,
            Command::BlockStatus => CMD_BLOCK_STATUS,
            Command::Unknown(other) => other,
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Command::Read => f.write_str("READ"),
            Command::Write => f.write_str("WRITE"),
            Command::Disc => f.write_str("DISC"),
            Command::Flush => f.write_str("FLUSH"),
            Command::Trim => f.write_str("TRIM"),
            Command::Cache => f.write_str("CACHE"),
            Command::WriteZeroes => f.write_str("WRITE_ZEROES"),
            Command::BlockStatus => f.write_str("BLOCK_STATUS"),
            Command::Unknown(value) => write!(f, "command {value}"),
        }
    }
}

/// A transmission request header. A WRITE is followed on the wire by
/// `length` bytes of data, which are not part of this struct.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub command: Command,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

impl Request {
    /// Bytes of data that follow this header on the wire.
    pub fn payload_bytes(&self) -> u32 {
        match self.command {
            Command::Write => self.length,
            _ => 0,
        }
    }
}

// Request (28 bytes), followed by `length` bytes of data for NBD_CMD_WRITE:
//
//   offset size field
//        0    4 REQUEST_MAGIC
//        4    2 command flags
//        6    2 command type
//        8    8 cookie (opaque; echoed in the reply)
//       16    8 offset in bytes
//       24    4 length in bytes
pub fn encode_request(request: &Request) -> [u8; REQUEST_BYTES] {
    let mut out = [0u8; REQUEST_BYTES];
    out[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&request.flags.to_be_bytes());
    out[6..8].copy_from_slice(&request.command.to_u16().to_be_bytes());
    out[8..16].copy_from_slice(&request.cookie.to_be_bytes());
    out[16..24].copy_from_slice(&request.offset.to_be_bytes());
    out[24..28].copy_from_slice(&request.length.to_be_bytes());
    debug_assert_eq!(decode_request(&out).as_ref(), Ok(request));
    out
}

/// Decodes a request header. A wrong magic means the stream has lost its
/// framing, and the caller must drop the connection: there is no way to
/// find the next request.
pub fn decode_request(buf: &[u8]) -> Result<Request, CodecError> {
    let mut c = Cursor::new("request", buf);
    let magic = c.u32()?;
    if magic != REQUEST_MAGIC {
        return Err(CodecError::BadMagic {
            what: "request",
            found: u64::from(magic),
        });
    }
    let request = Request {
        flags: c.u16()?,
        command: Command::from_u16(c.u16()?),
        cookie: c.u64()?,
        offset: c.u64()?,
        length: c.u32()?,
    };
    c.finish()?;
    Ok(request)
}

// Simple reply (16 bytes), followed by the data of a successful READ:
//
//   offset size field
//        0    4 SIMPLE_REPLY_MAGIC
//        4    4 error (0 on success)
//        8    8 cookie
pub fn encode_simple_reply(cookie: u64, error: u32) -> [u8; SIMPLE_REPLY_BYTES] {
    let mut out = [0u8; SIMPLE_REPLY_BYTES];
    out[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&error.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out
}

/// A simple reply header as (error, cookie), for clients and tests.
pub fn decode_simple_reply(buf: &[u8]) -> Result<(u32, u64), CodecError> {
    let mut c = Cursor::new("simple reply", buf);
    let magic = c.u32()?;
    if magic != SIMPLE_REPLY_MAGIC {
        return Err(CodecError::BadMagic {
            what: "simple reply",
            found: u64::from(magic),
        });
    }
    let reply = (c.u32()?, c.u64()?);
    c.finish()?;
    Ok(reply)
}

/// The fixed part of a structured reply chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    pub flags: u16,
    pub reply_type: u16,
    pub cookie: u64,
    pub length: u32,
}

// Structured reply chunk (20 bytes + payload):
//
//   offset size field
//        0    4 STRUCTURED_REPLY_MAGIC
//        4    2 flags (NBD_REPLY_FLAG_DONE on the last chunk)
//        6    2 type (NBD_REPLY_TYPE_*)
//        8    8 cookie
//       16    4 payload length
//       20    n payload
pub fn encode_chunk_header(header: ChunkHeader) -> [u8; STRUCTURED_REPLY_HEADER_BYTES] {
    let mut out = [0u8; STRUCTURED_REPLY_HEADER_BYTES];
    out[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&header.flags.to_be_bytes());
    out[6..8].copy_from_slice(&header.reply_type.to_be_bytes());
    out[8..16].copy_from_slice(&header.cookie.to_be_bytes());
    out[16..20].copy_from_slice(&header.length.to_be_bytes());
    out
}

pub fn decode_chunk_header(buf: &[u8]) -> Result<ChunkHeader, CodecError> {
    let mut c = Cursor::new("structured reply chunk", buf);
    let magic = c.u32()?;
    if magic != STRUCTURED_REPLY_MAGIC {
        return Err(CodecError::BadMagic {
            what: "structured reply chunk",
            found: u64::from(magic),
        });
    }
    let header = ChunkHeader {
        flags: c.u16()?,
        reply_type: c.u16()?,
        cookie: c.u64()?,
        length: c.u32()?,
    };
    c.finish()?;
    Ok(header)
}

/// Bytes that precede the data of a successful READ reply: a simple reply
/// header, or a structured chunk header plus the OFFSET_DATA offset.
pub fn read_reply_prefix_bytes(structured: bool) -> usize {
    if structured {
        STRUCTURED_REPLY_HEADER_BYTES + OFFSET_DATA_PREFIX_BYTES
    } else {
        SIMPLE_REPLY_BYTES
    }
}

// Successful READ reply, written in front of data already in `buf`:
//
//   simple:     simple reply header with error 0, then the data
//   structured: one NBD_REPLY_TYPE_OFFSET_DATA chunk with NBD_REPLY_FLAG_DONE
//
//   offset size field (structured)
//        0   20 chunk header, payload length 8 + n
//       20    8 offset of the data in the export
//       28    n data
//
// The whole read is one chunk, so a client's NBD_CMD_FLAG_DF is always
// honoured. The data is read before the header is sent, so no error can be
// found after a chunk marked DONE has started.
pub fn encode_read_reply_prefix(buf: &mut [u8], structured: bool, cookie: u64, offset: u64) {
    let prefix = read_reply_prefix_bytes(structured);
    assert!(buf.len() > prefix, "a read reply carries at least one byte");
    if structured {
        let data_bytes = buf.len() - prefix;
        let length = u32::try_from(OFFSET_DATA_PREFIX_BYTES + data_bytes)
            .expect("read replies are capped far below 4 GiB");
        buf[..STRUCTURED_REPLY_HEADER_BYTES].copy_from_slice(&encode_chunk_header(ChunkHeader {
            flags: REPLY_FLAG_DONE,
            reply_type: REPLY_TYPE_OFFSET_DATA,
            cookie,
            length,
        }));
        buf[STRUCTURED_REPLY_HEADER_BYTES..prefix].copy_from_slice(&offset.to_be_bytes());
    } else {
        buf[..prefix].copy_from_slice(&encode_simple_reply(cookie, 0));
    }
}

/// Longest message this server puts in an error chunk. The protocol allows
/// 4096 bytes; a line of context is all a person needs.
pub const ERROR_MESSAGE_MAX_BYTES: usize = 1024;

// NBD_REPLY_TYPE_ERROR chunk, always the last (flag DONE):
//
//   offset size field
//        0   20 chunk header, payload length 6 + m
//       20    4 error (nonzero)
//       24    2 message length m
//       26    m message for humans
pub fn encode_error_chunk(cookie: u64, error: u32, message: &str) -> Vec<u8> {
    assert_ne!(error, 0, "an error chunk carries a nonzero error");
    let message = truncate_message(message, ERROR_MESSAGE_MAX_BYTES);
    let length = 6 + message.len();
    let mut out = Vec::with_capacity(STRUCTURED_REPLY_HEADER_BYTES + length);
    out.extend_from_slice(&encode_chunk_header(ChunkHeader {
        flags: REPLY_FLAG_DONE,
        reply_type: REPLY_TYPE_ERROR,
        cookie,
        length: length as u32,
    }));
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&(message.len() as u16).to_be_bytes());
    out.extend_from_slice(message.as_bytes());
    out
}

/// Decodes an NBD_REPLY_TYPE_ERROR payload as (error, message).
pub fn decode_error_payload(payload: &[u8]) -> Result<(u32, String), CodecError> {
    let mut c = Cursor::new("error chunk", payload);
    let error = c.u32()?;
    let len = c.u16()?;
    let message = String::from_utf8_lossy(c.take(usize::from(len))?).into_owned();
    Ok((error, message))
}

/// One extent of a block status reply: its length and its status flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Descriptor {
    pub length: u32,
    pub flags: u32,
}

// NBD_REPLY_TYPE_BLOCK_STATUS chunk:
//
//   offset size field
//        0   20 chunk header, payload length 4 + 8*k
//       20    4 metadata context id
//       24  8*k k descriptors: 4-byte extent length (nonzero), 4-byte flags
pub fn encode_block_status_chunk(
    cookie: u64,
    done: bool,
    context_id: u32,
    descriptors: &[Descriptor],
) -> Vec<u8> {
    assert!(
        !descriptors.is_empty(),
        "a block status chunk has at least one descriptor"
    );
    let length = 4 + descriptors.len() * BLOCK_STATUS_DESCRIPTOR_BYTES;
    let mut out = Vec::with_capacity(STRUCTURED_REPLY_HEADER_BYTES + length);
    out.extend_from_slice(&encode_chunk_header(ChunkHeader {
        flags: if done { REPLY_FLAG_DONE } else { 0 },
        reply_type: REPLY_TYPE_BLOCK_STATUS,
        cookie,
        length: u32::try_from(length).expect("descriptor count is capped"),
    }));
    out.extend_from_slice(&context_id.to_be_bytes());
    for d in descriptors {
        assert_ne!(d.length, 0, "extents are never empty");
        out.extend_from_slice(&d.length.to_be_bytes());
        out.extend_from_slice(&d.flags.to_be_bytes());
    }
    out
}

/// Decodes an NBD_REPLY_TYPE_BLOCK_STATUS payload as (context id, descriptors).
pub fn decode_block_status_payload(payload: &[u8]) -> Result<(u32, Vec<Descriptor>), CodecError> {
    let mut c = Cursor::new("block status chunk", payload);
    let context_id = c.u32()?;
    let mut descriptors = Vec::with_capacity(c.remaining() / BLOCK_STATUS_DESCRIPTOR_BYTES);
    while c.remaining() > 0 {
        descriptors.push(Descriptor {
            length: c.u32()?,
            flags: c.u32()?,
        });
    }
    Ok((context_id, descriptors))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trip() {
        let request = Request {
            flags: CMD_FLAG_FUA,
            command: Command::Write,
            cookie: 0x0102_0304_0506_0708,
            offset: 1 << 40,
            length: 4096,
        };
        let bytes = encode_request(&request);
        assert_eq!(&bytes[0..4], &[0x25, 0x60, 0x95, 0x13]);
        assert_eq!(decode_request(&bytes), Ok(request));
        assert_eq!(request.payload_bytes(), 4096);
    }

    #[test]
    fn request_decoder_rejects_bad_magic_and_short_input() {
        let mut bytes = encode_request(&Request {
            flags: 0,
            command: Command::Read,
            cookie: 1,
            offset: 0,
            length: 512,
        });
        assert!(matches!(
            decode_request(&bytes[..27]),
            Err(CodecError::Short { .. })
        ));
        bytes[0] ^= 1;
        assert!(matches!(
            decode_request(&bytes),
            Err(CodecError::BadMagic { .. })
        ));
        assert!(decode_request(&[]).is_err());
    }

    #[test]
    fn unknown_commands_survive_decoding() {
        for value in [5u16, 8, 99, u16::MAX] {
            assert_eq!(Command::from_u16(value).to_u16(), value);
        }
        assert_eq!(Command::from_u16(42), Command::Unknown(42));
    }

    #[test]
    fn info_request_round_trip_and_lies() {
        let request = InfoRequest {
            name: "disk".into(),
            info_types: vec![INFO_BLOCK_SIZE, INFO_NAME],
        };
        let bytes = encode_info_request(&request);
        assert_eq!(decode_info_request(&bytes), Ok(request));
        // A name length past the data.
        let mut lying = bytes.clone();
        lying[3] = 200;
        assert!(decode_info_request(&lying).is_err());
        // A count of requests that the data does not hold.
        let mut lying = bytes.clone();
        let count_at = 4 + 4;
        lying[count_at + 1] = 9;
        assert!(decode_info_request(&lying).is_err());
        // Trailing garbage.
        let mut long = bytes;
        long.push(0);
        assert!(decode_info_request(&long).is_err());
        // A name over the protocol's string limit.
        let mut huge = (5000u32).to_be_bytes().to_vec();
        huge.extend(std::iter::repeat_n(b'a', 5000));
        huge.extend_from_slice(&[0, 0]);
        assert!(matches!(
            decode_info_request(&huge),
            Err(CodecError::TooLong { .. })
        ));
    }

    #[test]
    fn meta_context_round_trip_and_lies() {
        let request = MetaContextRequest {
            name: "disk".into(),
            queries: vec!["base:allocation".into(), "qemu:dirty-bitmap:x".into()],
        };
        let bytes = encode_meta_context_request(&request);
        assert_eq!(decode_meta_context_request(&bytes), Ok(request));
        // A huge query count with no data behind it is refused before any
        // allocation.
        let mut lying = encode_meta_context_request(&MetaContextRequest {
            name: String::new(),
            queries: vec![],
        });
        lying[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(decode_meta_context_request(&lying).is_err());
        assert!(decode_meta_context_request(&[0, 0]).is_err());
    }

    #[test]
    fn strings_with_nul_or_bad_utf8_are_refused() {
        assert!(decode_string("name", b"a\0b").is_err());
        assert!(decode_string("name", &[0xff, 0xfe]).is_err());
        assert_eq!(decode_string("name", b"disk").unwrap(), "disk");
    }

    #[test]
    fn read_reply_prefixes() {
        let mut simple = vec![0u8; SIMPLE_REPLY_BYTES + 3];
        encode_read_reply_prefix(&mut simple, false, 7, 0);
        assert_eq!(
            decode_simple_reply(&simple[..SIMPLE_REPLY_BYTES]),
            Ok((0, 7))
        );

        let prefix = read_reply_prefix_bytes(true);
        let mut structured = vec![0u8; prefix + 3];
        encode_read_reply_prefix(&mut structured, true, 9, 4096);
        let header = decode_chunk_header(&structured[..STRUCTURED_REPLY_HEADER_BYTES]).unwrap();
        assert_eq!(
            header,
            ChunkHeader {
                flags: REPLY_FLAG_DONE,
                reply_type: REPLY_TYPE_OFFSET_DATA,
                cookie: 9,
                length: 11
            }
        );
        assert_eq!(&structured[20..28], &4096u64.to_be_bytes());
    }

    #[test]
    fn error_chunk_truncates_long_messages_on_char_boundaries() {
        let message = "é".repeat(ERROR_MESSAGE_MAX_BYTES);
        let chunk = encode_error_chunk(3, NBD_EIO, &message);
        let header = decode_chunk_header(&chunk[..20]).unwrap();
        assert_eq!(header.reply_type, REPLY_TYPE_ERROR);
        let (error, text) = decode_error_payload(&chunk[20..]).unwrap();
        assert_eq!(error, NBD_EIO);
        assert!(text.len() <= ERROR_MESSAGE_MAX_BYTES);
        assert!(text.chars().all(|c| c == 'é'));
        assert_eq!(header.length as usize, chunk.len() - 20);
    }

    #[test]
    fn block_status_round_trip() {
        let descriptors = [
            Descriptor {
                length: 4096,
                flags: 0,
            },
            Descriptor {
                length: 8192,
                flags: STATE_HOLE | STATE_ZERO,
            },
        ];
        let chunk = encode_block_status_chunk(5, true, 1, &descriptors);
        let header = decode_chunk_header(&chunk[..20]).unwrap();
        assert_eq!(header.length, 4 + 16);
        assert_eq!(
            decode_block_status_payload(&chunk[20..]),
            Ok((1, descriptors.to_vec()))
        );
    }

    #[test]
    fn option_reply_and_greeting_round_trip() {
        let reply = encode_option_reply(OPT_GO, REP_ERR_UNKNOWN, b"no such export");
        let header = decode_option_reply_header(&reply[..OPTION_REPLY_HEADER_BYTES]).unwrap();
        assert!(is_option_error(header.reply_type));
        assert_eq!(header.length, 14);
        let greeting = encode_greeting(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
        assert_eq!(&greeting[..8], b"NBDMAGIC");
        assert_eq!(&greeting[8..16], b"IHAVEOPT");
        assert_eq!(decode_greeting(&greeting), Ok(3));
        assert_eq!(encode_export_name_reply(1, 1, false).len(), 134);
        assert_eq!(encode_export_name_reply(1, 1, true).len(), 10);
    }
}
