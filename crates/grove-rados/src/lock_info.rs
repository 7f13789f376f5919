//! Who holds a lock on an object, read through the OSD's `lock` class
//! (`get_info`), because the binding does not wrap `rados_list_lockers`.
//! This file speaks Ceph's wire encoding of that call: little-endian
//! integers, strings as a u32 length and bytes, and structs framed by a
//! version, a compat version and a u32 length (ENCODE_START), so each struct
//! is skipped by its length whatever fields a newer OSD adds.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};

/// One holder of a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Locker {
    /// Its entity name, as `client.4123`.
    pub(crate) client: String,
    pub(crate) cookie: String,
    /// Its address as the OSD saw it, `IP:PORT/NONCE`: what a blocklist
    /// entry names.
    pub(crate) addr: String,
    pub(crate) description: String,
}

/// The request: `cls_lock_get_info_op { name }`.
pub(crate) fn encode_request(lock_name: &str) -> Vec<u8> {
    let mut body = Vec::new();
    put_string(&mut body, lock_name);
    let mut out = vec![1, 1];
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// The reply: `cls_lock_get_info_reply { map<locker_id_t, locker_info_t>,
/// lock type, tag }`; only the lockers are kept.
pub(crate) fn decode_reply(bytes: &[u8]) -> io::Result<Vec<Locker>> {
    let mut r = Reader { bytes, at: 0 };
    let reply_end = r.struct_start()?;
    let count = r.u32()?;
    // Each locker takes dozens of bytes: a count past that is damage.
    if count as usize > bytes.len() {
        return Err(bad("locker count larger than the reply"));
    }
    let mut lockers = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let id_end = r.struct_start()?;
        let client = r.entity_name()?;
        let cookie = r.string()?;
        r.seek(id_end)?;
        let info_end = r.struct_start()?;
        r.skip(8)?; // expiration: utime_t
        let addr = r.entity_addr()?;
        let description = r.string()?;
        r.seek(info_end)?;
        lockers.push(Locker {
            client,
            cookie,
            addr,
            description,
        });
    }
    r.seek(reply_end)?;
    Ok(lockers)
}

fn bad(why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("the OSD's lock information is malformed: {why}"),
    )
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> io::Result<&[u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| bad("it ends early"))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn skip(&mut self, n: usize) -> io::Result<()> {
        self.take(n).map(|_| ())
    }

    fn seek(&mut self, to: usize) -> io::Result<()> {
        if to < self.at || to > self.bytes.len() {
            return Err(bad("a struct overruns its length"));
        }
        self.at = to;
        Ok(())
    }

    fn u8(&mut self) -> io::Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> io::Result<u16> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> io::Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> io::Result<u64> {
        let b = self.take(8)?;
        let mut a = [0; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn string(&mut self) -> io::Result<String> {
        let len = self.u32()? as usize;
        Ok(String::from_utf8_lossy(self.take(len)?).into_owned())
    }

    /// Reads a struct's frame; returns where the struct ends.
    fn struct_start(&mut self) -> io::Result<usize> {
        self.skip(2)?; // version, compat version
        let len = self.u32()? as usize;
        let end = self
            .at
            .checked_add(len)
            .ok_or_else(|| bad("a length overflows"))?;
        if end > self.bytes.len() {
            return Err(bad("a struct is longer than the reply"));
        }
        Ok(end)
    }

    /// `entity_name_t`: a type byte and a number.
    fn entity_name(&mut self) -> io::Result<String> {
        let kind = match self.u8()? {
            0x01 => "mon",
            0x02 => "mds",
            0x04 => "osd",
            0x08 => "client",
            0x10 => "mgr",
            _ => "entity",
        };
        Ok(format!("{kind}.{}", self.u64()? as i64))
    }

    /// `entity_addr_t`, in either encoding: a marker byte 1 and a framed
    /// struct (since Nautilus), or the legacy fixed layout (marker 0).
    fn entity_addr(&mut self) -> io::Result<String> {
        match self.u8()? {
            1 => {
                let end = self.struct_start()?;
                self.skip(4)?; // address type
                let nonce = self.u32()?;
                let elen = self.u32()? as usize;
                let ip_port = if elen >= 2 {
                    let family = self.u16()?;
                    let data = self.take(elen - 2)?.to_vec();
                    sockaddr_text(family, &data)
                } else {
                    "-".to_string()
                };
                self.seek(end)?;
                Ok(format!("{ip_port}/{nonce}"))
            }
            0 => {
                self.skip(3)?; // the rest of a u32 0
                let nonce = self.u32()?;
                let storage = self.take(128)?;
                let family = u16::from_be_bytes([storage[0], storage[1]]);
                Ok(format!("{}/{nonce}", sockaddr_text(family, &storage[2..])))
            }
            other => Err(bad(&format!("address marker {other}"))),
        }
    }
}

/// `IP:PORT` from a sockaddr's family and the bytes after it (port in
/// network order, then the address).
fn sockaddr_text(family: u16, data: &[u8]) -> String {
    const AF_INET: u16 = 2;
    const AF_INET6: u16 = 10;
    let port = |d: &[u8]| u16::from_be_bytes([d[0], d[1]]);
    match family {
        AF_INET if data.len() >= 6 => {
            let ip = Ipv4Addr::new(data[2], data[3], data[4], data[5]);
            format!("{ip}:{}", port(data))
        }
        AF_INET6 if data.len() >= 22 => {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&data[6..22]);
            format!("[{}]:{}", Ipv6Addr::from(octets), port(data))
        }
        _ => "-".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(body: &[u8]) -> Vec<u8> {
        let mut out = vec![1, 1];
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(body);
        out
    }

    fn string(s: &str) -> Vec<u8> {
        let mut out = Vec::new();
        put_string(&mut out, s);
        out
    }

    /// A reply as an OSD encodes it: one locker, client.4123 at
    /// 127.0.0.1:0/3512412, then the lock type and tag.
    #[test]
    fn a_reply_with_one_locker_decodes() {
        let mut id = vec![0x08];
        id.extend_from_slice(&4123u64.to_le_bytes());
        id.extend(string("cookie-1"));
        let mut addr = Vec::new();
        addr.extend_from_slice(&3u32.to_le_bytes()); // TYPE_ANY
        addr.extend_from_slice(&3512412u32.to_le_bytes());
        addr.extend_from_slice(&16u32.to_le_bytes());
        addr.extend_from_slice(&2u16.to_le_bytes());
        addr.extend_from_slice(&[0, 0, 127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
        let mut info = vec![0; 8];
        info.push(1);
        info.extend(framed(&addr));
        info.extend(string("host=a pid=1 since=0"));
        let mut body = 1u32.to_le_bytes().to_vec();
        body.extend(framed(&id));
        body.extend(framed(&info));
        body.push(1);
        body.extend(string(""));
        let lockers = decode_reply(&framed(&body)).unwrap();
        assert_eq!(
            lockers,
            vec![Locker {
                client: "client.4123".into(),
                cookie: "cookie-1".into(),
                addr: "127.0.0.1:0/3512412".into(),
                description: "host=a pid=1 since=0".into(),
            }]
        );
    }

    #[test]
    fn truncated_or_hostile_replies_are_errors() {
        assert!(decode_reply(&[]).is_err());
        assert!(decode_reply(&[1, 1, 255, 255, 255, 255]).is_err());
        let mut huge_count = framed(&u32::MAX.to_le_bytes());
        huge_count.extend_from_slice(&[0; 4]);
        assert!(decode_reply(&huge_count).is_err());
        // No lockers at all.
        let mut empty = 0u32.to_le_bytes().to_vec();
        empty.push(0);
        empty.extend(string(""));
        assert_eq!(decode_reply(&framed(&empty)).unwrap(), vec![]);
    }
}
