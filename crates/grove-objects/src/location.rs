//! Store URLs: `s3://BUCKET[/PREFIX]` and `file:///DIR`, parsed by hand.

use crate::error::{Error, ErrorKind, Result};
use std::path::PathBuf;

/// Where streams are stored, as parsed from a URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Location {
    /// A bucket and a key prefix ("" or segments joined by '/', no slash at
    /// either end).
    S3 { bucket: String, prefix: String },
    /// A local directory (absolute).
    File { dir: PathBuf },
}

/// The longest bucket name S3 allows.
const BUCKET_NAME_MAX_BYTES: usize = 63;
/// The shortest bucket name S3 allows.
const BUCKET_NAME_MIN_BYTES: usize = 3;

pub(crate) fn parse(url: &str) -> Result<Location> {
    let bad = |why: &str| Error::new(ErrorKind::InvalidUrl, format!("{url}: {why}"));
    if let Some(rest) = url.strip_prefix("s3://") {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("no bucket (expected s3://BUCKET/PREFIX)"));
        }
        if !(BUCKET_NAME_MIN_BYTES..=BUCKET_NAME_MAX_BYTES).contains(&bucket.len())
            || !bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
        {
            return Err(bad(&format!(
                "bad bucket name {bucket:?} (3 to 63 characters: lowercase letters, digits, '.', '-')"
            )));
        }
        if url.contains(['?', '#']) {
            return Err(bad("query strings and fragments are not supported"));
        }
        let prefix = prefix.trim_end_matches('/');
        if !prefix.is_empty() {
            for segment in prefix.split('/') {
                if segment.is_empty() {
                    return Err(bad("empty segment ('//') in the prefix"));
                }
                crate::names::check_name(segment)
                    .map_err(|why| bad(&format!("prefix segment {segment:?}: {why}")))?;
            }
        }
        Ok(Location::S3 {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    } else if let Some(rest) = url.strip_prefix("file://") {
        // file:///DIR or file://localhost/DIR.
        let path = rest.strip_prefix("localhost").unwrap_or(rest);
        if !path.starts_with('/') {
            return Err(bad("expected file:///ABSOLUTE/DIR (three slashes)"));
        }
        let path = percent_decode(path).ok_or_else(|| bad("bad percent-encoding"))?;
        Ok(Location::File {
            dir: PathBuf::from(path),
        })
    } else if url.contains("://") {
        let scheme = url.split("://").next().unwrap_or("");
        Err(bad(&format!(
            "unsupported scheme {scheme:?} (s3:// or file://)"
        )))
    } else {
        Err(bad("not a URL (s3://BUCKET/PREFIX or file:///DIR)"))
    }
}

/// `%XX` decoding; None for a bad escape or a result that is not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Whether an endpoint URL's host is on the loopback (127.0.0.0/8, ::1,
/// localhost): plain http is then allowed without AWS_ALLOW_HTTP.
pub(crate) fn endpoint_is_loopback(endpoint: &str) -> bool {
    let Some((_, rest)) = endpoint.split_once("://") else {
        return false;
    };
    let authority = rest.split('/').next().unwrap_or("");
    let authority = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let host = if let Some(v6) = authority.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        authority.split(':').next().unwrap_or("")
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_s3_and_file_urls() {
        assert_eq!(
            parse("s3://bucket/a/b/").unwrap(),
            Location::S3 {
                bucket: "bucket".into(),
                prefix: "a/b".into()
            }
        );
        assert_eq!(
            parse("s3://bucket").unwrap(),
            Location::S3 {
                bucket: "bucket".into(),
                prefix: "".into()
            }
        );
        assert_eq!(
            parse("file:///tmp/x%20y").unwrap(),
            Location::File {
                dir: "/tmp/x y".into()
            }
        );
        assert_eq!(
            parse("file://localhost/tmp").unwrap(),
            Location::File { dir: "/tmp".into() }
        );
        for bad in [
            "s3://",
            "s3:///p",
            "s3://Bucket/p",
            "s3://b/p",
            "s3://bucket/a//b",
            "s3://bucket/a?x",
            "file://tmp",
            "file://host/tmp",
            "http://x/y",
            "bucket/p",
            "file:///a%zz",
            "s3://bucket/a b",
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidUrl, "{bad}");
            assert!(e.to_string().starts_with(bad), "{e}");
        }
    }

    #[test]
    fn loopback_endpoints() {
        for yes in [
            "http://127.0.0.1:7480",
            "http://localhost",
            "http://[::1]:80/x",
            "http://127.1.2.3/",
        ] {
            assert!(endpoint_is_loopback(yes), "{yes}");
        }
        for no in [
            "http://10.0.0.1:7480",
            "https://s3.example.com",
            "127.0.0.1",
            "http://[::2]",
        ] {
            assert!(!endpoint_is_loopback(no), "{no}");
        }
    }
}
