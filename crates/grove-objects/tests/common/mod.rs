//! Helpers shared by grove-objects' integration tests.

// Each test binary compiles this module and uses only some of it.
#![allow(dead_code)]

use std::time::{SystemTime, UNIX_EPOCH};

/// Whether a missing tool or gateway fails the test (scripts/test.sh).
pub fn tools_required() -> bool {
    std::env::var_os("GROVE_REQUIRE_TOOLS").is_some_and(|v| v != "0")
}

/// `tag` made unique to this process and moment.
pub fn unique(tag: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{tag}-{}-{nanos}", std::process::id())
}

/// An S3 store under a fresh prefix of the test bucket, or None (after a
/// visible SKIP) when no gateway is configured.
pub fn s3_url(test: &str) -> Option<String> {
    match std::env::var("GROVE_TEST_S3_BUCKET") {
        Ok(bucket) if !bucket.is_empty() => Some(format!("s3://{bucket}/{}", unique(test))),
        _ => {
            let why = "no S3 gateway: GROVE_TEST_S3_BUCKET is not set (scripts/ceph.sh start, then . the env file it prints)";
            if tools_required() {
                panic!(
                    "{why}, and GROVE_REQUIRE_TOOLS is set (scripts/test.sh starts the gateway)"
                );
            }
            eprintln!("SKIP: {why}; skipping this test");
            None
        }
    }
}

/// `len` bytes of a seeded pseudo-random pattern.
pub fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
