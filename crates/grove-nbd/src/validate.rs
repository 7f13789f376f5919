//! What the protocol allows a request to be, decided from the request header
//! and what was negotiated, before any data moves. Pure, like the codec, so
//! that a fuzz target can drive decoding and checking together.

use crate::codec::*;

/// Largest READ or WRITE payload the server takes, advertised in
/// NBD_INFO_BLOCK_SIZE. The protocol asks servers to accept 2^25 bytes.
pub const PAYLOAD_MAX_BYTES: u32 = 32 * 1024 * 1024;

/// What the client and server agreed on for one connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Negotiated {
    /// Export size as advertised when transmission began.
    pub size_bytes: u64,
    /// Transmission flags as advertised.
    pub transmission_flags: u16,
    pub structured_replies: bool,
    /// Whether a metadata context (`base:allocation`, `grove:changed:BASE`)
    /// was selected for this export: BLOCK_STATUS needs one.
    pub meta_context: bool,
    pub payload_max_bytes: u32,
}

impl Negotiated {
    pub fn read_only(&self) -> bool {
        self.transmission_flags & FLAG_READ_ONLY != 0
    }

    fn advertises(&self, flag: u16) -> bool {
        self.transmission_flags & flag != 0
    }

    /// Command flags a client may set on `command` given what was advertised.
    pub fn allowed_flags(&self, command: Command) -> u16 {
        // FUA is valid on every command once advertised (clients are known to
        // set it on reads); the others belong to one command each.
        let fua = if self.advertises(FLAG_SEND_FUA) {
            CMD_FLAG_FUA
        } else {
            0
        };
        match command {
            Command::Read if self.advertises(FLAG_SEND_DF) => fua | CMD_FLAG_DF,
            Command::WriteZeroes => {
                let fast = if self.advertises(FLAG_SEND_FAST_ZERO) {
                    CMD_FLAG_FAST_ZERO
                } else {
                    0
                };
                fua | CMD_FLAG_NO_HOLE | fast
            }
            Command::BlockStatus => fua | CMD_FLAG_REQ_ONE,
            _ => fua,
        }
    }
}

/// A request refused before it runs: the NBD error and a message for humans.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub error: u32,
    pub message: String,
}

fn reject(error: u32, message: String) -> Result<(), Rejection> {
    Err(Rejection { error, message })
}

/// Checks a request against the protocol and the export. DISC is not
/// checked: it has no reply, and the server ends the connection either way.
pub fn validate_request(request: &Request, negotiated: &Negotiated) -> Result<(), Rejection> {
    let command = request.command;
    match command {
        Command::Read
        | Command::Write
        | Command::Flush
        | Command::Trim
        | Command::WriteZeroes
        | Command::BlockStatus
        | Command::Cache => {}
        Command::Disc => return Ok(()),
        Command::Unknown(_) => {
            return reject(NBD_EINVAL, format!("{command} is not supported"));
        }
    }
    // Read-only first: EPERM says more than a complaint about a flag that
    // was only left out because the export is read-only.
    let writes = matches!(
        command,
        Command::Write | Command::Trim | Command::WriteZeroes
    );
    if writes && negotiated.read_only() {
        return reject(NBD_EPERM, format!("{command} on a read-only export"));
    }
    let unknown_flags = request.flags & !negotiated.allowed_flags(command);
    if unknown_flags != 0 {
        return reject(
            NBD_EINVAL,
            format!("flags {unknown_flags:#x} are not valid on {command}"),
        );
    }
    if command == Command::Flush {
        if request.offset != 0 || request.length != 0 {
            return reject(
                NBD_EINVAL,
                "FLUSH must have offset and length 0".to_string(),
            );
        }
        return Ok(());
    }
    if command == Command::BlockStatus && !negotiated.meta_context {
        return reject(
            NBD_EINVAL,
            "BLOCK_STATUS needs a metadata context (base:allocation or grove:changed:BASE) selected with NBD_OPT_SET_META_CONTEXT for this export"
                .to_string(),
        );
    }
    check_extent(request, negotiated)
}

/// Checks a request's length and range: not empty, within the payload
/// limit for data commands, and inside the export.
fn check_extent(request: &Request, negotiated: &Negotiated) -> Result<(), Rejection> {
    let command = request.command;
    if request.length == 0 {
        // The protocol leaves length 0 unspecified; an error tells a buggy
        // client more than a silent success would.
        return reject(NBD_EINVAL, format!("{command} of length 0"));
    }
    if matches!(command, Command::Read | Command::Write)
        && request.length > negotiated.payload_max_bytes
    {
        // With structured replies a too-large read may be refused with
        // EOVERFLOW, which tells the client to retry smaller.
        let error = if command == Command::Read && negotiated.structured_replies {
            NBD_EOVERFLOW
        } else {
            NBD_EINVAL
        };
        return reject(
            error,
            format!(
                "{command} of {} bytes is over the maximum payload of {} bytes",
                request.length, negotiated.payload_max_bytes
            ),
        );
    }
    let fits = request
        .offset
        .checked_add(u64::from(request.length))
        .is_some_and(|end| end <= negotiated.size_bytes);
    if !fits {
        // proto.md: ENOSPC for writes past the end, EINVAL for the rest.
        let error = match command {
            Command::Write | Command::WriteZeroes => NBD_ENOSPC,
            _ => NBD_EINVAL,
        };
        return reject(
            error,
            format!(
                "{command} of {} bytes at offset {} runs past the end of the export ({} bytes)",
                request.length, request.offset, negotiated.size_bytes
            ),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const WRITABLE: Negotiated = Negotiated {
        size_bytes: 1 << 20,
        transmission_flags: FLAG_HAS_FLAGS
            | FLAG_SEND_FLUSH
            | FLAG_SEND_FUA
            | FLAG_SEND_TRIM
            | FLAG_SEND_WRITE_ZEROES
            | FLAG_SEND_FAST_ZERO
            | FLAG_CAN_MULTI_CONN
            | FLAG_SEND_DF,
        structured_replies: true,
        meta_context: true,
        payload_max_bytes: PAYLOAD_MAX_BYTES,
    };

    fn request(command: Command, flags: u16, offset: u64, length: u32) -> Request {
        Request {
            flags,
            command,
            cookie: 1,
            offset,
            length,
        }
    }

    fn error_of(r: Request, n: &Negotiated) -> Option<u32> {
        validate_request(&r, n).err().map(|e| e.error)
    }

    #[test]
    fn good_requests_pass() {
        for command in [
            Command::Read,
            Command::Write,
            Command::Trim,
            Command::WriteZeroes,
            Command::BlockStatus,
        ] {
            assert_eq!(error_of(request(command, 0, 0, 512), &WRITABLE), None);
            assert_eq!(
                error_of(request(command, CMD_FLAG_FUA, (1 << 20) - 1, 1), &WRITABLE),
                None
            );
        }
        assert_eq!(error_of(request(Command::Flush, 0, 0, 0), &WRITABLE), None);
        let zero = CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO;
        assert_eq!(
            error_of(request(Command::WriteZeroes, zero, 0, 512), &WRITABLE),
            None
        );
    }

    #[test]
    fn errors_the_protocol_asks_for() {
        let n = &WRITABLE;
        let end = 1 << 20;
        assert_eq!(
            error_of(request(Command::Unknown(99), 0, 0, 1), n),
            Some(NBD_EINVAL)
        );
        assert_eq!(error_of(request(Command::Cache, 0, 0, 1), n), None);
        assert_eq!(
            error_of(request(Command::Cache, 0, end - 1, 2), n),
            Some(NBD_EINVAL)
        );
        assert_eq!(
            error_of(request(Command::Cache, CMD_FLAG_DF, 0, 1), n),
            Some(NBD_EINVAL)
        );
        assert_eq!(
            error_of(request(Command::Read, 1 << 9, 0, 1), n),
            Some(NBD_EINVAL)
        );
        assert_eq!(
            error_of(request(Command::Write, CMD_FLAG_DF, 0, 1), n),
            Some(NBD_EINVAL)
        );
        assert_eq!(
            error_of(request(Command::Read, 0, 0, 0), n),
            Some(NBD_EINVAL)
        );
        assert_eq!(
            error_of(request(Command::Read, 0, end, 1), n),
            Some(NBD_EINVAL)
        );
        assert_eq!(
            error_of(request(Command::Trim, 0, end - 1, 2), n),
            Some(NBD_EINVAL)
        );
        assert_eq!(
            error_of(request(Command::Write, 0, end, 1), n),
            Some(NBD_ENOSPC)
        );
        assert_eq!(
            error_of(request(Command::WriteZeroes, 0, end, 1), n),
            Some(NBD_ENOSPC)
        );
        assert_eq!(
            error_of(request(Command::BlockStatus, 0, end, 1), n),
            Some(NBD_EINVAL)
        );
        assert_eq!(
            error_of(request(Command::Read, 0, u64::MAX, 1), n),
            Some(NBD_EINVAL)
        );
        assert_eq!(
            error_of(request(Command::Flush, 0, 1, 0), n),
            Some(NBD_EINVAL)
        );
        let too_long = PAYLOAD_MAX_BYTES + 1;
        assert_eq!(
            error_of(request(Command::Read, 0, 0, too_long), n),
            Some(NBD_EOVERFLOW)
        );
        assert_eq!(
            error_of(request(Command::Write, 0, 0, too_long), n),
            Some(NBD_EINVAL)
        );
        let simple = Negotiated {
            structured_replies: false,
            meta_context: false,
            transmission_flags: n.transmission_flags & !FLAG_SEND_DF,
            ..*n
        };
        assert_eq!(
            error_of(request(Command::Read, 0, 0, too_long), &simple),
            Some(NBD_EINVAL)
        );
        assert_eq!(
            error_of(request(Command::BlockStatus, 0, 0, 1), &simple),
            Some(NBD_EINVAL)
        );
        assert_eq!(
            error_of(request(Command::Read, CMD_FLAG_DF, 0, 1), &simple),
            Some(NBD_EINVAL)
        );
    }

    #[test]
    fn read_only_exports_refuse_writes_with_eperm() {
        let n = Negotiated {
            transmission_flags: FLAG_HAS_FLAGS | FLAG_READ_ONLY | FLAG_SEND_FLUSH,
            ..WRITABLE
        };
        for command in [Command::Write, Command::Trim, Command::WriteZeroes] {
            assert_eq!(error_of(request(command, 0, 0, 512), &n), Some(NBD_EPERM));
        }
        assert_eq!(error_of(request(Command::Read, 0, 0, 512), &n), None);
        assert_eq!(error_of(request(Command::Flush, 0, 0, 0), &n), None);
        // FUA was not advertised, so it is an unknown flag here.
        assert_eq!(
            error_of(request(Command::Read, CMD_FLAG_FUA, 0, 512), &n),
            Some(NBD_EINVAL)
        );
    }
}
