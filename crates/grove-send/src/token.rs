//! Resume tokens. A receiver that was interrupted prints a token; `grove
//! send --resume TOKEN` on the sending pool sends what is missing. The
//! token names the snapshots by GUID and where the receiver stands, and
//! carries a tag that only the sending pool can make: BLAKE3 keyed with
//! the pool's secret (`POOL/grove.send-key`, made on first use, readable
//! by its owner only) over the snapshots the stream was for. A token
//! edited to name other snapshots fails the tag, so it cannot be turned
//! into a request for data the stream was never meant to carry.
//!
//! Token bytes (then a CRC-32C of them, so a typo reads as a typo), as
//! `grove1-` and lowercase hex:
//!   0   1   version (1)
//!   1   1   flags: bit 0 = range stream
//!   2   16  final target GUID (the last snapshot of the stream)
//!   18  16  section base GUID (zero for a full section)
//!   34  16  section target GUID (the snapshot being received)
//!   50  8   bytes of the section's target the receiver holds
//!   58  16  resume tag

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::digest::unhex;

const TOKEN_PREFIX: &str = "grove1-";
const TOKEN_VERSION: u8 = 1;
const TOKEN_BYTES: usize = 74;
/// The sending pool's secret key file, in the pool directory.
pub const SEND_KEY_FILE: &str = "grove.send-key";
const KEY_BYTES: usize = 32;

/// What a receiver needs to ask for the rest of a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResumeToken {
    pub range: bool,
    pub final_target: [u8; 16],
    pub section_base: Option<[u8; 16]>,
    pub section_target: [u8; 16],
    pub progress_bytes: u64,
    pub tag: [u8; 16],
}

impl ResumeToken {
    pub fn encode(&self) -> String {
        let mut bytes = Vec::with_capacity(TOKEN_BYTES + 4);
        bytes.push(TOKEN_VERSION);
        bytes.push(u8::from(self.range));
        bytes.extend_from_slice(&self.final_target);
        bytes.extend_from_slice(&self.section_base.unwrap_or([0; 16]));
        bytes.extend_from_slice(&self.section_target);
        bytes.extend_from_slice(&self.progress_bytes.to_le_bytes());
        bytes.extend_from_slice(&self.tag);
        debug_assert_eq!(bytes.len(), TOKEN_BYTES);
        let crc = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        format!("{TOKEN_PREFIX}{}", hex::encode(bytes))
    }

    pub fn decode(text: &str) -> Result<ResumeToken> {
        let text = text.trim();
        let Some(digits) = text.strip_prefix(TOKEN_PREFIX) else {
            bail!("invalid resume token: it does not start with {TOKEN_PREFIX:?}");
        };
        let bytes = unhex(digits).context("invalid resume token")?;
        if bytes.len() != TOKEN_BYTES + 4 {
            bail!("invalid resume token: it is cut or too long (copy it whole)");
        }
        let (body, crc) = bytes.split_at(TOKEN_BYTES);
        if crc32c::crc32c(body).to_le_bytes() != crc {
            bail!("invalid resume token: its checksum does not match (copy it whole)");
        }
        if body[0] != TOKEN_VERSION {
            bail!(
                "resume token version {} is not one this grove reads",
                body[0]
            );
        }
        if body[1] & !1 != 0 {
            bail!("invalid resume token: unknown flags {:#x}", body[1]);
        }
        let guid = |at: usize| -> [u8; 16] { body[at..at + 16].try_into().expect("16") };
        Ok(ResumeToken {
            range: body[1] & 1 != 0,
            final_target: guid(2),
            section_base: Some(guid(18)).filter(|g| g != &[0; 16]),
            section_target: guid(34),
            progress_bytes: u64::from_le_bytes(body[50..58].try_into().expect("8")),
            tag: guid(58),
        })
    }
}

/// The sending pool's secret, made on first use.
pub struct SendKey([u8; KEY_BYTES]);

impl SendKey {
    pub fn load_or_create(pool_dir: &Path) -> Result<SendKey> {
        let path = pool_dir.join(SEND_KEY_FILE);
        match fs::read(&path) {
            Ok(bytes) if bytes.len() == KEY_BYTES => {
                return Ok(SendKey(bytes.try_into().expect("32")))
            }
            Ok(_) => bail!(
                "{} is damaged (not {KEY_BYTES} bytes); remove it to make a new one (resume tokens issued before stop working)",
                path.display()
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        }
        let mut key = [0u8; KEY_BYTES];
        fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut key))
            .context("cannot read random bytes for the send key")?;
        let temporary = path.with_extension("new");
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temporary)
            .with_context(|| format!("cannot create {}", temporary.display()))?;
        file.write_all(&key)?;
        file.sync_all()?;
        // Another sender may have made one meanwhile: the first one stays.
        match fs::hard_link(&temporary, &path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let _ = fs::remove_file(&temporary);
                return SendKey::load_or_create(pool_dir);
            }
            Err(e) => return Err(e).with_context(|| format!("cannot create {}", path.display())),
        }
        let _ = fs::remove_file(&temporary);
        Ok(SendKey(key))
    }

    /// The tag of one section of a stream.
    pub fn tag(
        &self,
        range: bool,
        final_target: &[u8; 16],
        section_base: Option<&[u8; 16]>,
        section_target: &[u8; 16],
    ) -> [u8; 16] {
        let mut hasher = blake3::Hasher::new_keyed(&self.0);
        hasher.update(b"grove resume tag v1");
        hasher.update(&[u8::from(range)]);
        hasher.update(final_target);
        hasher.update(section_base.unwrap_or(&[0; 16]));
        hasher.update(section_target);
        hasher.finalize().as_bytes()[..16]
            .try_into()
            .expect("16 bytes")
    }

    /// Checks that `token` was issued for a stream of this pool.
    pub fn verify(&self, token: &ResumeToken) -> Result<()> {
        let expected = self.tag(
            token.range,
            &token.final_target,
            token.section_base.as_ref(),
            &token.section_target,
        );
        // Not secret-dependent timing worth guarding: a mismatch only ends
        // the request.
        if expected != token.tag {
            bail!(
                "the resume token was not issued for a stream of this pool (its tag does not match): it was altered, or comes from another pool"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ResumeToken {
        ResumeToken {
            range: true,
            final_target: [1; 16],
            section_base: Some([2; 16]),
            section_target: [3; 16],
            progress_bytes: 123 << 20,
            tag: [4; 16],
        }
    }

    #[test]
    fn tokens_round_trip_and_typos_are_caught() {
        let token = sample();
        let text = token.encode();
        assert_eq!(ResumeToken::decode(&text).unwrap(), token);
        let mut typo = text.clone().into_bytes();
        let at = typo.len() - 20;
        typo[at] = if typo[at] == b'0' { b'1' } else { b'0' };
        let error = ResumeToken::decode(std::str::from_utf8(&typo).unwrap()).unwrap_err();
        assert!(error.to_string().contains("checksum"), "{error}");
        assert!(ResumeToken::decode(&text[..text.len() - 2]).is_err());
        assert!(ResumeToken::decode("hello").is_err());
    }

    proptest::proptest! {
        #[test]
        fn any_text_decodes_without_a_panic(text in ".{0,200}", hex in "grove1-[0-9a-f]{0,160}") {
            let _ = ResumeToken::decode(&text);
            let _ = ResumeToken::decode(&hex);
        }
    }

    #[test]
    fn only_the_issuing_pool_accepts_a_token_and_edits_fail() {
        let dir = tempfile::tempdir().unwrap();
        let key = SendKey::load_or_create(dir.path()).unwrap();
        let mut token = sample();
        token.tag = key.tag(true, &[1; 16], Some(&[2; 16]), &[3; 16]);
        key.verify(&token).unwrap();
        // The same key again from the file.
        SendKey::load_or_create(dir.path())
            .unwrap()
            .verify(&token)
            .unwrap();
        // Edited to name another snapshot: refused.
        let mut edited = token.clone();
        edited.section_target = [9; 16];
        assert!(key.verify(&edited).is_err());
        let mut edited = token.clone();
        edited.range = false;
        assert!(key.verify(&edited).is_err());
        // Another pool's key: refused.
        let other = tempfile::tempdir().unwrap();
        assert!(SendKey::load_or_create(other.path())
            .unwrap()
            .verify(&token)
            .is_err());
        let mode = fs::metadata(dir.path().join(SEND_KEY_FILE)).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o600
        );
    }
}
