//! Streamed puts (FolderStore::put_streamed) on both backends: a local
//! directory (always) and a real S3 gateway (radosgw from scripts/ceph.sh,
//! when $GROVE_TEST_S3_BUCKET and the AWS_* variables are set; required
//! under scripts/test.sh). An object appears whole or not at all; one
//! dropped unfinished leaves nothing; one whose process dies (a writer
//! forgotten, as a kill leaves it) is no object and is cleaned.

mod common;

use common::{data, s3_url};
use grove_objects::{ErrorKind, FolderStore};

const FOLDER: &str = "packs";
const MIB: usize = 1 << 20;

/// Writes `bytes` as object `name` in uneven pieces; the writer is
/// returned unfinished.
fn written<'a>(
    store: &'a FolderStore,
    name: &str,
    bytes: &[u8],
) -> grove_objects::ObjectWriter<'a> {
    let mut writer = store.put_streamed(FOLDER, name).unwrap();
    let mut rest = bytes;
    let mut piece = 1;
    while !rest.is_empty() {
        let take = piece.min(rest.len());
        writer.write(&rest[..take]).unwrap();
        rest = &rest[take..];
        piece = (piece * 7 + 4100) % (3 * MIB);
    }
    writer
}

fn names(store: &FolderStore) -> Vec<String> {
    let mut names: Vec<String> = store
        .list(FOLDER)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    names.sort();
    names
}

/// What both backends must do.
fn streamed_puts(store: &FolderStore) {
    // Empty, small, exactly one S3 part, just over, several parts.
    for (i, len) in [0, 100, 5 * MIB, 5 * MIB + 1, 12 * MIB + 3]
        .into_iter()
        .enumerate()
    {
        let bytes = data(len, i as u64);
        let name = format!("o{i}");
        let writer = written(store, &name, &bytes);
        assert!(
            !names(store).contains(&name),
            "{name} is seen before it is finished"
        );
        writer.finish().unwrap();
        assert!(store.get(FOLDER, &name).unwrap() == bytes, "{name}");
    }
    // Dropped unfinished: nothing of it, nothing left to clean.
    for len in [100, 11 * MIB] {
        drop(written(store, "dropped", &data(len, 9)));
        assert!(!names(store).contains(&"dropped".to_string()));
        assert_eq!(store.clean_interrupted(FOLDER).unwrap(), 0, "{len}");
    }
    // A writer whose process died (forgotten: no drop runs) is no object,
    // and is cleaned once.
    for len in [100, 11 * MIB] {
        std::mem::forget(written(store, "killed", &data(len, 10)));
        assert!(!names(store).contains(&"killed".to_string()));
        assert!(store.clean_interrupted(FOLDER).unwrap() <= 1, "{len}");
        assert_eq!(store.clean_interrupted(FOLDER).unwrap(), 0, "{len}");
    }
    let expected: Vec<String> = (0..5).map(|i| format!("o{i}")).collect();
    assert_eq!(names(store), expected);
    assert!(store.folders().unwrap() == vec![FOLDER.to_string()]);
}

#[test]
fn file_streamed_puts_are_whole_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = FolderStore::open(&format!("file://{}/store", dir.path().display())).unwrap();
    streamed_puts(&store);
    // A forgotten writer leaves its temporary file until cleaned.
    std::mem::forget(written(&store, "killed", &data(1000, 3)));
    let folder = dir.path().join("store").join(FOLDER);
    let temps = || {
        std::fs::read_dir(&folder)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with('.')
            })
            .count()
    };
    assert_eq!(temps(), 1);
    assert_eq!(store.clean_interrupted(FOLDER).unwrap(), 1);
    assert_eq!(temps(), 0);
    // Never replaces an object.
    let err = written(&store, "o1", b"other").finish().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExists, "{err}");
    assert!(store.get(FOLDER, "o1").unwrap() == data(100, 1));
    assert_eq!(temps(), 0, "a refused put leaves nothing");
}

#[test]
fn s3_streamed_puts_are_whole_or_nothing() {
    let Some(url) = s3_url("streamed") else {
        return;
    };
    let store = FolderStore::open(&url).unwrap();
    streamed_puts(&store);
    // A multipart put forgotten mid-way is recorded and aborted once.
    std::mem::forget(written(&store, "killed", &data(6 * MIB, 4)));
    assert_eq!(store.clean_interrupted(FOLDER).unwrap(), 1);
    assert_eq!(store.clean_interrupted(FOLDER).unwrap(), 0);
    // One part: create-only, as a PUT is.
    let err = written(&store, "o1", b"other").finish().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExists, "{err}");
    let names: Vec<String> = (0..5).map(|i| format!("o{i}")).collect();
    store.delete(FOLDER, &names).unwrap();
    assert!(
        store.folders().unwrap().is_empty(),
        "no marker folder is listed"
    );
}
