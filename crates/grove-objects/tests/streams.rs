//! Streams stored as objects, on both backends: a local directory
//! (file://, always) and a real S3 gateway (radosgw from scripts/ceph.sh,
//! when $GROVE_TEST_S3_BUCKET and the AWS_* variables are set). Without a
//! gateway the S3 tests print SKIP, except under scripts/test.sh
//! ($GROVE_REQUIRE_TOOLS), where they fail.
//!
//! Some tests run a copy of this test binary as a child process (a test
//! named child_* that does nothing unless its variables are set): one is
//! killed with SIGKILL in the middle of a multipart upload, others open a
//! store with a changed environment.

mod common;

use common::{s3_url, tools_required};
use grove_objects::{ErrorKind, PartInfo, StreamStore, MULTIPART_CHUNK_BYTES};
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

const MIB: usize = 1 << 20;
/// Small enough for quick tests, big enough that a full part is a
/// multipart upload of three chunks (8 + 8 + 4 MiB).
const TEST_PART_BYTES: usize = 20 * MIB;

fn file_url(dir: &tempfile::TempDir) -> String {
    format!("file://{}/store", dir.path().display())
}

/// Deterministic bytes that do not compress (xorshift).
fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The parts of the round trip: a full (multipart) part, a single-PUT one,
/// an empty one, a part just over one chunk, a small last one.
fn sample_parts() -> Vec<(Vec<u8>, Vec<u8>)> {
    [TEST_PART_BYTES, 5 * MIB, 0, MULTIPART_CHUNK_BYTES + 1, 1000]
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            (
                data(len, i as u64 + 1),
                format!("cursor {i}: offset {}", i * 4096).into_bytes(),
            )
        })
        .collect()
}

fn round_trip(url: &str) {
    let store = StreamStore::open(url)
        .unwrap()
        .with_part_size(TEST_PART_BYTES as u64);
    let name = "vol@snap:1+x=y";
    let parts = sample_parts();

    let mut upload = store.upload(name).unwrap();
    assert!(upload.stored_parts().is_empty());
    assert!(!upload.is_complete());
    // Two parts, then an interruption (the upload dropped), then the rest.
    for (bytes, cursor) in &parts[..2] {
        upload.put_part(bytes, cursor).unwrap();
    }
    drop(upload);
    assert!(!store.parts(name).unwrap().complete);
    let mut upload = store.upload(name).unwrap();
    assert_eq!(
        upload.stored_parts().len(),
        2,
        "resume keeps the stored parts"
    );
    for (bytes, cursor) in &parts[2..] {
        upload.put_part(bytes, cursor).unwrap();
    }
    let too_big = vec![0; TEST_PART_BYTES + 1];
    assert_eq!(
        upload.put_part(&too_big, b"").unwrap_err().kind(),
        ErrorKind::InvalidInput
    );
    assert_eq!(
        upload.put_part(b"x", &[0; 129]).unwrap_err().kind(),
        ErrorKind::InvalidInput
    );
    upload.finish().unwrap();

    let listing = store.parts(name).unwrap();
    assert!(listing.complete);
    let expected: Vec<PartInfo> = parts
        .iter()
        .enumerate()
        .map(|(i, (b, c))| PartInfo {
            index: i as u64,
            size_bytes: b.len() as u64,
            cursor: c.clone(),
        })
        .collect();
    assert_eq!(listing.parts, expected);

    for (i, (bytes, _)) in parts.iter().enumerate() {
        assert!(
            store.read_part(name, i as u64).unwrap() == *bytes,
            "part {i}"
        );
    }
    assert_eq!(
        store.read_part(name, 5).unwrap_err().kind(),
        ErrorKind::NotFound
    );

    for first in [0, 2, 4, 5] {
        let mut read = Vec::new();
        store
            .reader(name, first)
            .unwrap()
            .read_to_end(&mut read)
            .unwrap();
        let expected: Vec<u8> = parts[first as usize..]
            .iter()
            .flat_map(|(b, _)| b.iter().copied())
            .collect();
        assert!(
            read == expected,
            "reader from part {first}: {} bytes, expected {}",
            read.len(),
            expected.len()
        );
    }
    assert_eq!(
        store.reader(name, 6).err().unwrap().kind(),
        ErrorKind::NotFound
    );
    // A reader dropped half way stops its thread without trouble.
    let mut reader = store.reader(name, 0).unwrap();
    let mut some = vec![0; 1000];
    reader.read_exact(&mut some).unwrap();
    drop(reader);

    // Complete: reopening says so, and refuses more parts; finish is a no-op.
    let mut again = store.upload(name).unwrap();
    assert!(again.is_complete());
    assert_eq!(again.stored_parts(), &expected[..]);
    assert_eq!(
        again.put_part(b"more", b"").unwrap_err().kind(),
        ErrorKind::InvalidInput
    );
    again.finish().unwrap();

    // A second stream, then removal of the first.
    let mut other = store.upload("other").unwrap();
    other.put_part(b"tiny", b"").unwrap();
    assert_eq!(
        store.list_streams().unwrap(),
        vec!["other".to_string(), name.to_string()]
    );
    store.remove(name).unwrap();
    assert_eq!(store.parts(name).unwrap(), Default::default());
    assert_eq!(store.list_streams().unwrap(), vec!["other".to_string()]);
    store.remove(name).unwrap();
    store.remove("other").unwrap();
    assert!(store.list_streams().unwrap().is_empty());

    assert_eq!(
        store.upload("a/b").unwrap_err().kind(),
        ErrorKind::InvalidInput
    );
    assert_eq!(
        store.parts(".hidden").unwrap_err().kind(),
        ErrorKind::InvalidInput
    );
}

#[test]
fn file_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let url = file_url(&dir);
    round_trip(&url);
    // Nothing is left behind: no temporary file, no stream directory.
    let left: Vec<_> = std::fs::read_dir(dir.path().join("store"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn s3_round_trip() {
    let Some(url) = s3_url("round-trip") else {
        return;
    };
    round_trip(&url);
}

#[test]
fn two_writers_finish_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = StreamStore::open(&file_url(&dir)).unwrap();
    let a = store.upload("s").unwrap();
    let b = store.upload("s").unwrap();
    a.finish().unwrap();
    assert_eq!(b.finish().unwrap_err().kind(), ErrorKind::AlreadyExists);
}

#[test]
fn s3_two_writers_finish_once() {
    let Some(url) = s3_url("finish-once") else {
        return;
    };
    let store = StreamStore::open(&url).unwrap();
    let a = store.upload("s").unwrap();
    let b = store.upload("s").unwrap();
    a.finish().unwrap();
    assert_eq!(b.finish().unwrap_err().kind(), ErrorKind::AlreadyExists);
    store.remove("s").unwrap();
}

#[test]
fn damaged_streams_are_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let store = StreamStore::open(&file_url(&dir)).unwrap();
    let mut upload = store.upload("s").unwrap();
    for i in 0..3u8 {
        upload.put_part(&[i; 10], &[i]).unwrap();
    }
    upload.finish().unwrap();
    let stream_dir = dir.path().join("store/s");
    // A middle part gone: a gap.
    std::fs::remove_file(stream_dir.join("part-00000001-01")).unwrap();
    let e = store.reader("s", 0).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    assert!(e.to_string().contains("part 1 is missing"), "{e}");
    // The last parts gone: the complete marker disagrees.
    std::fs::remove_file(stream_dir.join("part-00000001-01")).ok();
    std::fs::remove_file(stream_dir.join("part-00000002-02")).unwrap();
    let e = store.parts("s").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    assert!(e.to_string().contains("the complete marker says"), "{e}");
    // Removal still works on a damaged stream.
    store.remove("s").unwrap();
    assert!(!stream_dir.exists());
}

/// The child of the kill tests: stores a small part, then stalls for good
/// in the middle of a multipart upload of the second part (after 1 of its
/// 3 chunks), where the parent kills it.
#[test]
fn child_stalled_upload() {
    let Ok(url) = std::env::var("GROVE_OBJECTS_CHILD_URL") else {
        return;
    };
    let mut store = StreamStore::open(&url)
        .unwrap()
        .with_part_size(TEST_PART_BYTES as u64);
    store.stall_multipart_after_chunks(1);
    let mut upload = store.upload("s").unwrap();
    upload.put_part(b"first part", b"c0").unwrap();
    upload.put_part(&data(TEST_PART_BYTES, 7), b"c1").unwrap();
    unreachable!("the stall hook never returns");
}

/// Runs child_stalled_upload against `url` and kills it with SIGKILL at the
/// stall; returns the id of the multipart upload it left.
fn kill_in_multipart(url: &str) -> String {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_stalled_upload",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("GROVE_OBJECTS_CHILD_URL", url)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let mut id = None;
    let mut seen = Vec::new();
    for line in stderr.lines() {
        let line = line.unwrap();
        if let Some((_, rest)) = line.split_once("grove-objects: test stall: multipart upload ") {
            id = Some(rest.split(" of ").next().unwrap().to_string());
            break;
        }
        seen.push(line);
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    id.unwrap_or_else(|| {
        panic!(
            "the child never reached the stall; it said:\n{}",
            seen.join("\n")
        )
    })
}

#[test]
fn file_upload_killed_in_multipart_is_aborted_on_resume() {
    let dir = tempfile::tempdir().unwrap();
    let url = file_url(&dir);
    let id = kill_in_multipart(&url);
    let stream_dir = dir.path().join("store/s");
    let orphan = stream_dir.join(format!(".multipart-{id}"));
    assert_eq!(
        std::fs::metadata(&orphan).unwrap().len(),
        MULTIPART_CHUNK_BYTES as u64,
        "one chunk was stored"
    );
    assert!(
        stream_dir.join("multipart-00000001").exists(),
        "the upload was recorded"
    );

    let store = StreamStore::open(&url)
        .unwrap()
        .with_part_size(TEST_PART_BYTES as u64);
    assert_eq!(
        store.parts("s").unwrap().parts.len(),
        1,
        "the killed part is not listed"
    );
    let mut upload = store.upload("s").unwrap();
    assert!(!orphan.exists(), "the orphaned upload was aborted");
    assert!(
        !stream_dir.join("multipart-00000001").exists(),
        "its marker was removed"
    );
    assert_eq!(upload.stored_parts().len(), 1);
    let second = data(TEST_PART_BYTES, 7);
    upload.put_part(&second, b"c1").unwrap();
    upload.finish().unwrap();
    assert!(store.read_part("s", 1).unwrap() == second);
    let names: Vec<_> = std::fs::read_dir(&stream_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
}

/// The bucket's incomplete multipart uploads whose id is `id`, as radosgw's
/// bucket index lists them (`radosgw-admin bucket list`), or None when
/// radosgw-admin cannot reach the cluster ($CEPH_CONF from the env file).
fn radosgw_multipart_entries(id: &str) -> Option<usize> {
    let bucket = std::env::var("GROVE_TEST_S3_BUCKET").ok()?;
    std::env::var_os("CEPH_CONF")?;
    let output = Command::new("radosgw-admin")
        .args(["bucket", "list", "--bucket", &bucket])
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let listing = String::from_utf8_lossy(&output.stdout);
    Some(
        listing
            .lines()
            .filter(|l| l.contains("\"name\"") && l.contains(id))
            .count(),
    )
}

#[test]
fn s3_upload_killed_in_multipart_is_aborted_on_resume() {
    let Some(url) = s3_url("killed") else { return };
    let id = kill_in_multipart(&url);
    let before = radosgw_multipart_entries(&id);
    if tools_required() {
        assert!(
            before.is_some(),
            "radosgw-admin cannot list the bucket (CEPH_CONF from scripts/ceph.sh's env file)"
        );
    }
    if let Some(before) = before {
        assert!(
            before > 0,
            "radosgw lists no incomplete upload {id} after the kill"
        );
    }

    let store = StreamStore::open(&url)
        .unwrap()
        .with_part_size(TEST_PART_BYTES as u64);
    let mut upload = store.upload("s").unwrap();
    if let Some(after) = radosgw_multipart_entries(&id) {
        assert_eq!(
            after, 0,
            "radosgw still lists upload {id} after the resume aborted it"
        );
    }
    assert_eq!(upload.stored_parts().len(), 1);
    let second = data(TEST_PART_BYTES, 7);
    upload.put_part(&second, b"c1").unwrap();
    upload.finish().unwrap();
    assert!(store.read_part("s", 1).unwrap() == second);
    // A second kill, then remove() aborts that upload too.
    store.remove("s").unwrap();
    let id = kill_in_multipart(&url);
    store.remove("s").unwrap();
    if let Some(after) = radosgw_multipart_entries(&id) {
        assert_eq!(after, 0, "radosgw still lists upload {id} after remove()");
    }
    assert!(store.list_streams().unwrap().is_empty());
}

/// The child of the environment tests: opens $GROVE_OBJECTS_CHILD_OPEN and
/// prints "OPEN: ok" or "OPEN: <kind>: <message>".
#[test]
fn child_open() {
    let Ok(url) = std::env::var("GROVE_OBJECTS_CHILD_OPEN") else {
        return;
    };
    match StreamStore::open(&url) {
        Ok(store) => println!("OPEN: ok {}", store.describe()),
        Err(e) => println!("OPEN: {:?}: {e}", e.kind()),
    }
}

/// Opens `url` in a child process whose environment has `set` and lacks
/// `unset`; returns what it printed after "OPEN: ".
fn open_with_env(url: &str, set: &[(&str, &str)], unset: &[&str]) -> String {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", "child_open", "--nocapture", "--test-threads=1"])
        .env("GROVE_OBJECTS_CHILD_OPEN", url);
    for (k, v) in set {
        command.env(k, v);
    }
    for k in unset {
        command.env_remove(k);
    }
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        // libtest prints "test child_open ... " before the child's line.
        .find_map(|l| l.split_once("OPEN: ").map(|(_, said)| said))
        .unwrap_or_else(|| panic!("the child printed no OPEN line: {stdout}"))
        .to_string()
}

#[test]
fn s3_configuration_from_the_environment() {
    let creds = [("AWS_ACCESS_KEY_ID", "k"), ("AWS_SECRET_ACCESS_KEY", "s")];
    let said = open_with_env("s3://bucket/p", &[], &["AWS_ACCESS_KEY_ID"]);
    assert!(
        said.starts_with("Config: s3://bucket/p: AWS_ACCESS_KEY_ID is not set"),
        "{said}"
    );
    let said = open_with_env(
        "s3://bucket/p",
        &[("AWS_ACCESS_KEY_ID", "k")],
        &["AWS_SECRET_ACCESS_KEY"],
    );
    assert!(
        said.starts_with("Config: s3://bucket/p: AWS_SECRET_ACCESS_KEY is not set"),
        "{said}"
    );
    // Plain http only to the loopback (no request is made when opening).
    let mut env = creds.to_vec();
    env.push(("AWS_ENDPOINT_URL", "http://127.0.0.1:7480"));
    let said = open_with_env("s3://bucket/p", &env, &["AWS_ALLOW_HTTP"]);
    assert_eq!(said, "ok s3://bucket/p at http://127.0.0.1:7480");
    env.pop();
    env.push(("AWS_ENDPOINT_URL", "http://192.0.2.1:7480"));
    let said = open_with_env("s3://bucket/p", &env, &["AWS_ALLOW_HTTP"]);
    assert!(
        said.starts_with(
            "Config: s3://bucket/p: AWS_ENDPOINT_URL http://192.0.2.1:7480 is plain http"
        ),
        "{said}"
    );
    env.push(("AWS_ALLOW_HTTP", "true"));
    assert_eq!(
        open_with_env("s3://bucket/p", &env, &[]),
        "ok s3://bucket/p at http://192.0.2.1:7480"
    );
    let said = open_with_env(
        "s3://bucket",
        &[("AWS_ENDPOINT_URL", "ftp://x"), creds[0], creds[1]],
        &[],
    );
    assert!(
        said.starts_with("Config: s3://bucket: AWS_ENDPOINT_URL \"ftp://x\""),
        "{said}"
    );
}

#[test]
fn bad_urls_are_refused_in_one_line() {
    for (url, kind) in [
        ("", ErrorKind::InvalidUrl),
        ("/tmp/dir", ErrorKind::InvalidUrl),
        ("s3://", ErrorKind::InvalidUrl),
        ("s3://UPPER/x", ErrorKind::InvalidUrl),
        ("s3://bucket/a//b", ErrorKind::InvalidUrl),
        ("s3://bucket/a b", ErrorKind::InvalidUrl),
        ("file://relative/dir", ErrorKind::InvalidUrl),
        ("gs://bucket/x", ErrorKind::InvalidUrl),
        ("file:///dev/null/x", ErrorKind::Io),
    ] {
        let e = StreamStore::open(url).unwrap_err();
        assert_eq!(e.kind(), kind, "{url}: {e}");
        assert!(!e.to_string().contains('\n'), "{e}");
        assert!(
            e.to_string().contains(url.split("://").last().unwrap()),
            "{url}: {e}"
        );
    }
}
