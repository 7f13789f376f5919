//! Which RADOS object set a device is, and how to reach its cluster: a
//! `rados://CEPHPOOL/NAME` location, with the cluster and credentials taken
//! from the usual client configuration, as the `rados` tool takes them.

use std::io;
use std::path::PathBuf;

/// Where a device's objects live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RadosTarget {
    /// The Ceph configuration file: `$CEPH_CONF`, else /etc/ceph/ceph.conf.
    pub conf: PathBuf,
    /// The client id without `client.` (`admin` unless `$CEPH_ID` or
    /// `--id`/`--name` in `$CEPH_ARGS` says otherwise).
    pub client_id: String,
    /// The RADOS pool.
    pub pool: String,
    /// The device's name: every object's name starts with it.
    pub name: String,
}

/// The scheme of a RADOS location.
pub const SCHEME: &str = "rados://";

impl RadosTarget {
    /// A target in `pool` named `name`, reached as the environment says.
    pub fn from_env(pool: &str, name: &str) -> io::Result<RadosTarget> {
        for (what, value) in [("pool", pool), ("name", name)] {
            if value.is_empty()
                || value.contains(['/', '\0'])
                || value.chars().any(char::is_whitespace)
            {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("RADOS {what} {value:?} must be non-empty, without '/', NUL or spaces"),
                ));
            }
        }
        Ok(RadosTarget {
            conf: std::env::var_os("CEPH_CONF")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("/etc/ceph/ceph.conf")),
            client_id: client_id_from_env(),
            pool: pool.to_string(),
            name: name.to_string(),
        })
    }

    /// Parses `rados://CEPHPOOL/NAME`.
    pub fn parse(location: &str) -> io::Result<RadosTarget> {
        let bad = || {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{location:?} is not a RADOS location: expected {SCHEME}CEPHPOOL/NAME"),
            )
        };
        let rest = location.strip_prefix(SCHEME).ok_or_else(bad)?;
        let (pool, name) = rest.split_once('/').ok_or_else(bad)?;
        RadosTarget::from_env(pool, name)
    }

    /// As the user wrote it: `rados://pool/name`.
    pub fn location(&self) -> String {
        format!("{SCHEME}{}/{}", self.pool, self.name)
    }
}

/// The client id the `rados` tool would use: `--id X` or `--name client.X`
/// in `$CEPH_ARGS`, else `$CEPH_ID`, else `admin`.
fn client_id_from_env() -> String {
    let args = std::env::var("CEPH_ARGS").unwrap_or_default();
    let mut words = args.split_whitespace();
    while let Some(word) = words.next() {
        let (key, value) = match word.split_once('=') {
            Some((k, v)) => (k, Some(v.to_string())),
            None => (word, None),
        };
        let value = || {
            value
                .clone()
                .or_else(|| words.clone().next().map(str::to_string))
        };
        match key {
            "--id" | "-i" => {
                if let Some(v) = value() {
                    return v;
                }
            }
            "--name" | "-n" => {
                if let Some(v) = value() {
                    return v.strip_prefix("client.").unwrap_or(&v).to_string();
                }
            }
            _ => {}
        }
    }
    std::env::var("CEPH_ID").unwrap_or_else(|_| "admin".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse_and_bad_ones_are_refused() {
        let t = RadosTarget::parse("rados://rbd/vm1").unwrap();
        assert_eq!((t.pool.as_str(), t.name.as_str()), ("rbd", "vm1"));
        assert_eq!(t.location(), "rados://rbd/vm1");
        for bad in [
            "rbd/vm1",
            "rados://rbd",
            "rados:///vm1",
            "rados://rbd/",
            "rados://rbd/a/b",
        ] {
            assert!(RadosTarget::parse(bad).is_err(), "{bad}");
        }
    }
}
