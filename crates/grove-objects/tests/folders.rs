//! Folders listed in pages, on both backends: a local directory (file://,
//! always) and a real S3 gateway (radosgw from scripts/ceph.sh, when
//! $GROVE_TEST_S3_BUCKET and the AWS_* variables are set). Without a
//! gateway the S3 test prints SKIP, except under scripts/test.sh
//! ($GROVE_REQUIRE_TOOLS), where it fails.

mod common;

use common::s3_url;
use grove_objects::{Error, ErrorKind, FolderStore, ObjectEntry};
use std::collections::HashMap;

const FOLDER: &str = "packs";

/// A caller's own error, as a visitor returns it.
#[derive(Debug)]
enum Stop {
    Here(usize),
    // Read only through Debug, when a test fails.
    #[allow(dead_code)]
    Store(Error),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Stop {
        Stop::Store(e)
    }
}

fn name(i: usize) -> String {
    format!("o{i:06}")
}

/// Object `i`'s size: a few bytes, so that sizes are checked too.
fn size(i: usize) -> usize {
    i % 5
}

/// Lists the folder in pages of at most `limit` and checks that every
/// object of `expected` (name → size) is seen exactly once, with its size,
/// and nothing else; returns the number of pages.
fn check_paged(store: &FolderStore, limit: usize, expected: &HashMap<String, u64>) -> usize {
    let mut seen: HashMap<String, u64> = HashMap::new();
    let mut pages = 0;
    store
        .list_pages(FOLDER, limit, &mut |page: &[ObjectEntry]| {
            assert!(
                !page.is_empty() && page.len() <= limit,
                "a page of {} entries, limit {limit}",
                page.len()
            );
            pages += 1;
            for entry in page {
                let again = seen.insert(entry.name.clone(), entry.size_bytes);
                assert!(again.is_none(), "{} listed twice", entry.name);
            }
            Ok::<(), Error>(())
        })
        .unwrap();
    assert_eq!(seen.len(), expected.len(), "objects listed");
    assert_eq!(&seen, expected, "names and sizes listed");
    assert_eq!(pages, expected.len().div_ceil(limit), "pages");
    pages
}

/// What every backend must do with the folder holding `expected`: pages
/// of several limits, `list` whole, a refused limit of 0, and a visitor's
/// error ending the listing.
fn check_listing(store: &FolderStore, expected: &HashMap<String, u64>) {
    for limit in [1000, 333, expected.len() + 1] {
        check_paged(store, limit, expected);
    }
    let whole: HashMap<String, u64> = store
        .list(FOLDER)
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.size_bytes))
        .collect();
    assert_eq!(&whole, expected, "list");
    let err = store
        .list_pages(FOLDER, 0, &mut |_| Ok::<(), Error>(()))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    // The visitor's own error ends the listing and comes back as it was.
    let mut visits = 0;
    let stop = store
        .list_pages(FOLDER, 100, &mut |_| {
            visits += 1;
            Err(Stop::Here(visits))
        })
        .unwrap_err();
    assert!(matches!(stop, Stop::Here(1)), "{stop:?}");
    assert_eq!(visits, 1);
    let mut none = 0;
    store
        .list_pages("empty", 10, &mut |_| {
            none += 1;
            Ok::<(), Error>(())
        })
        .unwrap();
    assert_eq!(none, 0, "a folder with no object has no page");
}

#[test]
fn file_folder_is_listed_in_pages() {
    const COUNT: usize = 5000;
    let dir = tempfile::tempdir().unwrap();
    let store = FolderStore::open(&format!("file://{}/store", dir.path().display())).unwrap();
    // Two objects through the API (the folder is made and synced as a put
    // makes it), the rest written straight into the folder's directory
    // (the backend's layout: one file per object), which is much faster
    // than a put's fsyncs.
    let mut expected = HashMap::new();
    for i in 0..COUNT {
        if i < 2 {
            store.create(FOLDER, &name(i), &vec![7; size(i)]).unwrap();
        } else {
            let path = dir.path().join("store").join(FOLDER).join(name(i));
            std::fs::write(path, vec![7; size(i)]).unwrap();
        }
        expected.insert(name(i), size(i) as u64);
    }
    // A writer's temporary file and a directory are no objects.
    let folder = dir.path().join("store").join(FOLDER);
    std::fs::write(folder.join(".put-1-2-3"), b"half").unwrap();
    std::fs::create_dir(folder.join("sub")).unwrap();
    check_listing(&store, &expected);
}

#[test]
fn s3_folder_is_listed_in_pages() {
    const COUNT: usize = 2500;
    const WRITERS: usize = 16;
    let Some(url) = s3_url("folder-pages") else {
        return;
    };
    let store = FolderStore::open(&url).unwrap();
    // Many small puts at once: the gateway answers each in milliseconds.
    std::thread::scope(|scope| {
        for writer in 0..WRITERS {
            let store = store.clone();
            scope.spawn(move || {
                for i in (writer..COUNT).step_by(WRITERS) {
                    store.put(FOLDER, &name(i), &vec![7; size(i)]).unwrap();
                }
            });
        }
    });
    let expected: HashMap<String, u64> = (0..COUNT).map(|i| (name(i), size(i) as u64)).collect();
    check_listing(&store, &expected);
    // The visitor runs outside the store's runtime: it may read the store.
    let mut read = 0;
    store
        .list_pages(FOLDER, 700, &mut |page| {
            let first = &page[0];
            let bytes = store.get(FOLDER, &first.name)?;
            assert_eq!(bytes.len() as u64, first.size_bytes, "{}", first.name);
            read += 1;
            Ok::<(), Error>(())
        })
        .unwrap();
    assert_eq!(read, COUNT.div_ceil(700));
    let names: Vec<String> = (0..COUNT).map(name).collect();
    store.delete(FOLDER, &names).unwrap();
    assert!(store.list(FOLDER).unwrap().is_empty(), "deleted");
}
