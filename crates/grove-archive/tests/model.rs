//! The archive against an oracle: a volume written at random for simulated
//! days, a snapshot a day ranked as the scheduler ranks them, each pushed
//! and the policy's expiry run; the archive must keep exactly what the
//! calendar oracle keeps, restore each kept snapshot byte for byte from the
//! archive alone, check clean, and hold no pack nothing references.

use grove_archive::{check, claim, expire, list, push, restore, Archive, PushRequest};
use grove_retention::oracle::kept_by_calendar;
use grove_retention::{due_level, Level, Policy, SnapshotFacts};
use grove_store::{Pool, PoolOptions};
use std::collections::BTreeMap;

const BLOCK: u64 = 4096;
const VOLUME_BLOCKS: u64 = 256;
const DAY: u64 = 86_400;
/// 2026-01-01T00:00:00Z plus an hour.
const START: u64 = 1_767_225_600 + 3600;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn policy() -> Policy {
    // frequent, hourly, daily, weekly, monthly, yearly
    Policy {
        keep: [0, 0, 4, 3, 2, 1],
        frequent_secs: 900,
        minimum: 0,
    }
}

fn read_all(pool: &Pool, name: &str) -> Vec<u8> {
    let volume = pool.volume(name).unwrap();
    let mut buf = vec![0u8; volume.size_bytes().unwrap() as usize];
    volume.read_at(&mut buf, 0).unwrap();
    buf
}

fn scribble(pool: &Pool, rng: &mut Rng, day: u64) {
    let volume = pool.volume("vm").unwrap();
    let writes = if day.is_multiple_of(7) { 24 } else { 6 };
    for _ in 0..writes {
        let block = rng.below(VOLUME_BLOCKS);
        let mut data = vec![0u8; BLOCK as usize];
        if rng.below(10) != 0 {
            for b in data.iter_mut() {
                *b = rng.next() as u8;
            }
        }
        volume.write_at(&data, block * BLOCK).unwrap();
    }
}

struct World {
    _dirs: (tempfile::TempDir, tempfile::TempDir),
    pool: Pool,
    archive: Archive,
    taken: Vec<SnapshotFacts>,
    /// Every snapshot's bytes, by name.
    contents: BTreeMap<String, Vec<u8>>,
}

fn world(pack_bytes_note: &str) -> World {
    // Small index segments: a 256-block volume has eight, so pushes share
    // the pages of segments they did not change and write the others.
    grove_archive::hooks::set_segment_blocks(32);
    let pool_dir = tempfile::tempdir().unwrap();
    let store_dir = tempfile::tempdir().unwrap();
    let pool = Pool::create(pool_dir.path(), &PoolOptions::default()).unwrap();
    pool.create_volume("vm", VOLUME_BLOCKS * BLOCK).unwrap();
    let url = format!("file://{}", store_dir.path().display());
    let archive = Archive::open(&url, "vm").unwrap();
    let _ = pack_bytes_note;
    World {
        _dirs: (pool_dir, store_dir),
        pool,
        archive,
        taken: Vec::new(),
        contents: BTreeMap::new(),
    }
}

impl World {
    /// Takes the day's snapshot as the scheduler would rank it; returns its name.
    fn take_only(&mut self, day: u64) -> String {
        let now = START + day * DAY;
        let level = due_level(&policy(), &self.taken, now).expect("a level is due each day");
        self.take_at(day, level)
    }

    /// Takes the day's snapshot ranked `level`; returns its name.
    fn take_at(&mut self, day: u64, level: Level) -> String {
        let now = START + day * DAY;
        let name = format!("vm@day{day:03}");
        self.pool
            .snapshot_ranked("vm", &name, level.rank(), now)
            .unwrap();
        self.taken.push(SnapshotFacts {
            name: name.clone(),
            created_unix_secs: now,
            rank: Some(level),
            holds: Vec::new(),
        });
        self.contents
            .insert(name.clone(), read_all(&self.pool, &name));
        name
    }

    /// Takes the day's snapshot as the scheduler would rank it, and pushes it.
    fn take_and_push(&mut self, day: u64, pack_bytes: u64) -> grove_archive::PushReport {
        let name = self.take_only(day);
        self.push_taken(day, name, pack_bytes)
    }

    /// Pushes the day's snapshot `name`.
    fn push_taken(&self, day: u64, name: String, pack_bytes: u64) -> grove_archive::PushReport {
        let now = START + day * DAY;
        let claim = claim(&self.archive, false).unwrap();
        let request = PushRequest {
            snapshot: name,
            hash: format!("day{day}"),
            pack_bytes,
            now_unix_secs: now,
            stall_after_packs: None,
        };
        let report = push(&self.archive, &claim, &self.pool, &request, &mut |_, _| {}).unwrap();
        claim.release().unwrap();
        report
    }

    fn restore_and_compare(&self, name: &str, as_name: &str) {
        restore(&self.archive, &self.pool, name, as_name, &mut |_, _| {}).unwrap();
        assert!(
            read_all(&self.pool, as_name) == self.contents[name],
            "{name} restored differs"
        );
        self.pool.remove_volume(as_name).unwrap();
    }
}

#[test]
fn a_simulated_season_keeps_what_the_calendar_keeps_and_restores_it_byte_for_byte() {
    let mut w = world("small packs");
    let mut rng = Rng(0x9e3779b97f4a7c15);
    w.pool
        .volume("vm")
        .unwrap()
        .write_at(&vec![7u8; (VOLUME_BLOCKS * BLOCK) as usize], 0)
        .unwrap();
    for day in 0..120 {
        scribble(&w.pool, &mut rng, day);
        let report = w.take_and_push(day, 64 * 1024);
        assert!(report.stored_bytes <= report.changed_bytes, "{report:?}");
        let now = START + day * DAY;
        let claim = claim(&w.archive, false).unwrap();
        expire(&w.archive, Some(&claim), &policy(), now, false).unwrap();
        claim.release().unwrap();
        let listing = list(&w.archive, Some(&policy()), now).unwrap();
        let kept: Vec<u64> = listing
            .snapshots
            .iter()
            .map(|s| s.created_unix_secs)
            .collect();
        let taken: Vec<u64> = w.taken.iter().map(|s| s.created_unix_secs).collect();
        let expected: Vec<u64> = kept_by_calendar(&policy(), &taken).into_iter().collect();
        assert_eq!(kept, expected, "day {day}");
        // Old pool snapshots go: the archive must stand alone.
        if day >= 2 {
            let old = format!("vm@day{:03}", day - 2);
            w.pool.remove_volume(&old).unwrap();
        }
        if day % 10 == 9 {
            let pick = &listing.snapshots[rng.below(listing.snapshots.len() as u64) as usize].name;
            w.restore_and_compare(pick, "restored");
            let report = check(&w.archive, true).unwrap();
            assert!(report.is_clean(), "day {day}: {report:?}");
            assert!(report.unreferenced_objects.is_empty(), "{report:?}");
        }
    }
    let listing = list(&w.archive, Some(&policy()), START + 120 * DAY).unwrap();
    for s in &listing.snapshots {
        w.restore_and_compare(&s.name, "restored");
    }
    // Expiry deleted what nothing needs: what is stored is what the kept
    // snapshots need, plus each slot's checksum, block number and address
    // (24 bytes per 4 KiB) and the pack headers.
    assert!(listing.needed_bytes > 0);
    let overhead = listing.needed_bytes * 24 / BLOCK + listing.packs as u64 * 64;
    assert!(
        listing.stored_bytes <= listing.needed_bytes + overhead,
        "stored {} need {}",
        listing.stored_bytes,
        listing.needed_bytes
    );
}

/// The bench's archive counts (bench/harness/workloads/archive.py): daily
/// 7, weekly 4, monthly 12, yearly 3.
fn bench_policy() -> Policy {
    Policy {
        keep: [0, 0, 7, 4, 12, 3],
        frequent_secs: 900,
        minimum: 0,
    }
}

/// 36 days of the bench's year on a volume written whole on day 0: each
/// day scribbled, ranked from what the ranker sees (`sees_archive`: every
/// snapshot taken, as it does with the pool's archive configured; else
/// only the pool's last two, as it did when the bench pushed elsewhere and
/// pruned ignoring the archive), pushed and expired. Returns each day's
/// bytes copied by expiry, and on which day (if any) the packs of the
/// first push, the whole volume, stopped being the first snapshot's.
fn bench_days(sees_archive: bool) -> (Vec<u64>, Option<u64>) {
    let mut w = world("bench policy");
    let mut rng = Rng(0x51ed_2701_3f4e_9a8b);
    let whole: Vec<u8> = (0..VOLUME_BLOCKS * BLOCK)
        .map(|_| rng.next() as u8 | 1)
        .collect();
    w.pool.volume("vm").unwrap().write_at(&whole, 0).unwrap();
    let (mut copied, mut first_packs_gone) = (Vec::new(), None);
    let mut first_packs = Vec::new();
    for day in 0..36 {
        let now = START + day * DAY;
        if day > 0 {
            scribble(&w.pool, &mut rng, day);
        }
        let seen = w
            .taken
            .len()
            .saturating_sub(if sees_archive { usize::MAX } else { 2 });
        let level = due_level(&bench_policy(), &w.taken[seen..], now).expect("a level is due");
        let name = w.take_at(day, level);
        let pushed = w.push_taken(day, name, 64 * 1024);
        let claim = claim(&w.archive, false).unwrap();
        copied.push(
            expire(&w.archive, Some(&claim), &bench_policy(), now, false)
                .unwrap()
                .bytes_copied,
        );
        claim.release().unwrap();
        let catalog = w.archive.load().unwrap().unwrap();
        let owned_by_first: Vec<u64> = catalog
            .packs
            .iter()
            .filter(|p| p.owner_seq == catalog.snapshots.first().map_or(0, |s| s.seq))
            .map(|p| p.id)
            .collect();
        if day == 0 {
            assert_eq!(pushed.stored_bytes, VOLUME_BLOCKS * BLOCK);
            first_packs = owned_by_first;
        } else if first_packs_gone.is_none()
            && !first_packs.iter().all(|id| owned_by_first.contains(id))
        {
            first_packs_gone = Some(day);
        }
    }
    (copied, first_packs_gone)
}

#[test]
fn with_calendar_ranks_the_first_push_stays_in_place_and_expiry_copies_only_dailies_and_weeklies() {
    // The bench's day 33: ranked from the pool's last two snapshots, every
    // third day is "yearly", day 0 leaves the 12 newest of rank monthly or
    // higher on day 33, and its whole push's survivors are copied out.
    let (forgetful, gone) = bench_days(false);
    assert_eq!(gone, Some(33), "{forgetful:?}");
    let day33 = forgetful[33];
    assert!(forgetful.iter().all(|&c| c <= day33), "{forgetful:?}");
    // Ranked as the calendar says, day 0 is the year's yearly: its packs
    // stay, and each day copies at most what the expired dailies and
    // weeklies wrote (a few days' scribbles), a fraction of that day 33.
    let (ranked, gone) = bench_days(true);
    assert_eq!(gone, None, "{ranked:?}");
    let worst = *ranked.iter().max().unwrap();
    assert!(
        worst > 0 && worst * 2 < day33,
        "worst {worst}, day 33 before {day33}: {ranked:?}"
    );
    assert!(ranked.iter().sum::<u64>() < forgetful.iter().sum::<u64>() - day33 / 2);
}

/// The kept snapshots' names, as the policy judges the facts (ranks as
/// they are now, lazy ones included) at `now`.
fn kept_by_plan(facts: &[SnapshotFacts], now: u64, released: &[String]) -> Vec<String> {
    let mut facts = facts.to_vec();
    facts.retain(|f| !released.contains(&f.name));
    grove_retention::plan(&policy(), &facts, now)
        .into_iter()
        .filter(|v| v.keep)
        .map(|v| v.name)
        .collect()
}

#[test]
fn lazy_ranks_and_snapshots_pushed_by_hand_are_kept_as_asked_and_stay_whole() {
    let mut w = world("lazy ranks");
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut released = Vec::new();
    let mut copied = 0;
    for day in 0..70 {
        scribble(&w.pool, &mut rng, day);
        w.take_and_push(day, 64 * 1024);
        let now = START + day * DAY;
        if day == 20 {
            // By hand: unranked, kept until released.
            w.pool
                .snapshot_ranked("vm", "vm@hand", 0, now + 60)
                .unwrap();
            w.contents
                .insert("vm@hand".into(), read_all(&w.pool, "vm@hand"));
            w.taken.push(SnapshotFacts {
                name: "vm@hand".into(),
                created_unix_secs: now + 60,
                rank: None,
                holds: Vec::new(),
            });
            let claim = claim(&w.archive, false).unwrap();
            let request = PushRequest {
                snapshot: "vm@hand".into(),
                hash: "h".into(),
                pack_bytes: 64 * 1024,
                now_unix_secs: now,
                stall_after_packs: None,
            };
            push(&w.archive, &claim, &w.pool, &request, &mut |_, _| {}).unwrap();
            claim.release().unwrap();
        }
        if day == 30 {
            // A lazy rank: the newest daily becomes the year's.
            let name = format!("vm@day{day:03}");
            let claim = claim(&w.archive, false).unwrap();
            grove_archive::set_rank(
                &w.archive,
                &claim,
                &name,
                grove_retention::Level::Yearly.rank(),
            )
            .unwrap();
            assert!(
                grove_archive::release(&w.archive, &claim, &name).is_err(),
                "a ranked snapshot is the policy's"
            );
            claim.release().unwrap();
            w.taken.iter_mut().find(|f| f.name == name).unwrap().rank =
                Some(grove_retention::Level::Yearly);
        }
        if day == 50 {
            let claim = claim(&w.archive, false).unwrap();
            grove_archive::release(&w.archive, &claim, "vm@hand").unwrap();
            claim.release().unwrap();
            released.push("vm@hand".to_string());
        }
        let claim = claim(&w.archive, false).unwrap();
        copied += expire(&w.archive, Some(&claim), &policy(), now, false)
            .unwrap()
            .bytes_copied;
        claim.release().unwrap();
        let listing = list(&w.archive, Some(&policy()), now).unwrap();
        let kept: Vec<String> = listing.snapshots.iter().map(|s| s.name.clone()).collect();
        let mut expected = kept_by_plan(&w.taken, now, &released);
        expected.sort_by_key(|n| w.taken.iter().position(|f| &f.name == n));
        assert_eq!(kept, expected, "day {day}");
        assert_eq!(
            kept.contains(&"vm@hand".to_string()),
            (20..50).contains(&day),
            "day {day}"
        );
        if day >= 2 {
            let _ = w.pool.remove_volume(&format!("vm@day{:03}", day - 2));
        }
    }
    assert!(
        copied > 0,
        "versions that outlived their packs' owners were copied"
    );
    let listing = list(&w.archive, Some(&policy()), START + 70 * DAY).unwrap();
    assert!(listing
        .snapshots
        .iter()
        .any(|s| s.name == "vm@day030" && s.rank == "yearly"));
    for s in &listing.snapshots {
        w.restore_and_compare(&s.name, "restored");
    }
    assert!(check(&w.archive, true).unwrap().is_clean());
}

#[test]
fn archived_snapshots_read_in_place_match_the_pool_byte_for_byte_within_the_cache() {
    let mut w = world("reads");
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for day in 0..12 {
        scribble(&w.pool, &mut rng, day);
        w.take_and_push(day, 64 * 1024);
    }
    let url = format!("file://{}", w._dirs.1.path().display());
    let cache_bytes = 16 * BLOCK;
    for (volume, name) in grove_archive::archived_snapshots(&url).unwrap() {
        assert_eq!(volume, "vm");
        let view = grove_archive::ArchivedVolume::open(&url, "vm", &name, cache_bytes).unwrap();
        let expected = &w.contents[&name];
        assert_eq!(view.size_bytes(), expected.len() as u64);
        for _ in 0..200 {
            let offset = rng.below(expected.len() as u64);
            let len = (1 + rng.below(3 * BLOCK)).min(expected.len() as u64 - offset) as usize;
            let mut buf = vec![0xAAu8; len];
            view.read_at(&mut buf, offset).unwrap();
            assert!(
                buf[..] == expected[offset as usize..offset as usize + len],
                "{name} at {offset}+{len}"
            );
            assert!(view.cached_bytes() <= cache_bytes);
        }
        // Holes read as zeros, and what is mapped is where the data is.
        let mapped = view.mapped_extents_in(0, view.size_bytes()).unwrap();
        let mut covered = vec![false; expected.len()];
        for (off, len) in &mapped {
            covered[*off as usize..(off + len) as usize]
                .iter_mut()
                .for_each(|c| *c = true);
        }
        assert!(
            expected.iter().zip(&covered).all(|(b, c)| *c || *b == 0),
            "{name}: data outside the mapped extents"
        );
        let mut past = [0u8; 1];
        assert!(view.read_at(&mut past, view.size_bytes()).is_err());
    }
}

/// Commands that failed on a lost connection and were run again.
static LOST_CONNECTIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Runs `command` with the object store's connection lost after a random
/// number of requests (one time in three); if it failed so, the archive
/// must check consistent, and the command is run again in full. Returns
/// the command's result.
fn with_a_lost_connection<T>(
    rng: &mut Rng,
    archive: &Archive,
    mut command: impl FnMut(&Archive) -> grove_archive::Result<T>,
) -> T {
    if rng.below(3) == 0 {
        grove_archive::hooks::fail_after_requests(Some(rng.below(14)));
        let first = command(archive);
        grove_archive::hooks::fail_after_requests(None);
        // A claim the lost connection left is taken over, as an operator
        // would with --take-over.
        claim(archive, true).unwrap().release().unwrap();
        match first {
            Ok(out) => return out,
            Err(e) => assert!(e.to_string().contains("test hook"), "{e}"),
        }
        LOST_CONNECTIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let report = check(archive, false).unwrap();
        assert!(report.is_clean(), "after a lost connection: {report:?}");
    }
    command(archive).unwrap()
}

#[test]
fn random_commands_with_lost_connections_and_reopens_match_the_oracle() {
    let mut w = world("a random walk");
    let mut rng = Rng(0x5851_f42d_4c95_7f2d);
    let url = format!("file://{}", w._dirs.1.path().display());
    let mut day = 0;
    let mut archived: Vec<String> = Vec::new();
    for _ in 0..90 {
        let now = START + day * DAY;
        match rng.below(10) {
            0..=4 => {
                day += 1;
                scribble(&w.pool, &mut rng, day);
                let name = w.take_only(day);
                let hash = format!("day{day}");
                with_a_lost_connection(&mut rng, &w.archive, |archive| {
                    let claim = claim(archive, false)?;
                    let request = PushRequest {
                        snapshot: name.clone(),
                        hash: hash.clone(),
                        pack_bytes: 16 * 1024,
                        now_unix_secs: now,
                        stall_after_packs: None,
                    };
                    push(archive, &claim, &w.pool, &request, &mut |_, _| {})
                });
                archived.push(name);
            }
            5 | 6 => {
                with_a_lost_connection(&mut rng, &w.archive, |archive| {
                    let claim = claim(archive, false)?;
                    expire(archive, Some(&claim), &policy(), now, false)
                });
                let listing = list(&w.archive, Some(&policy()), now).unwrap();
                let kept: Vec<String> = listing.snapshots.iter().map(|s| s.name.clone()).collect();
                // The policy judges what the archive holds (a snapshot
                // gone stays gone, whatever a later rank would say).
                let present: Vec<SnapshotFacts> = w
                    .taken
                    .iter()
                    .filter(|f| archived.contains(&f.name))
                    .cloned()
                    .collect();
                let mut expected = kept_by_plan(&present, now, &[]);
                expected.sort_by_key(|n| w.taken.iter().position(|f| &f.name == n));
                assert_eq!(kept, expected, "day {day}");
                archived = kept;
            }
            7 if !archived.is_empty() => {
                let name = archived[rng.below(archived.len() as u64) as usize].clone();
                let level = grove_retention::Level::ALL[rng.below(6) as usize];
                with_a_lost_connection(&mut rng, &w.archive, |archive| {
                    let claim = claim(archive, false)?;
                    grove_archive::set_rank(archive, &claim, &name, level.rank())
                });
                w.taken.iter_mut().find(|f| f.name == name).unwrap().rank = Some(level);
            }
            8 if !archived.is_empty() => {
                let name = archived[rng.below(archived.len() as u64) as usize].clone();
                with_a_lost_connection(&mut rng, &w.archive, |archive| {
                    restore(archive, &w.pool, &name, "restored", &mut |_, _| {})
                });
                assert!(
                    read_all(&w.pool, "restored") == w.contents[&name],
                    "{name} restored differs"
                );
                w.pool.remove_volume("restored").unwrap();
            }
            _ => w.archive = Archive::open(&url, "vm").unwrap(),
        }
        // The pool keeps only the newest snapshot: the archive stands alone.
        for f in &w.taken[..w.taken.len().saturating_sub(1)] {
            let _ = w.pool.remove_volume(&f.name);
        }
    }
    let report = check(&w.archive, true).unwrap();
    assert!(
        report.is_clean() && report.unreferenced_objects.is_empty(),
        "{report:?}"
    );
    let lost = LOST_CONNECTIONS.load(std::sync::atomic::Ordering::Relaxed);
    let totals = list(&w.archive, None, START + day * DAY).unwrap().totals;
    eprintln!("{lost} commands lost their connection and ran again; {totals:?}");
    assert!(lost >= 5, "the walk lost connections ({lost})");
    assert!(
        totals.copied_bytes > 0,
        "expiry copied versions (forward tables in use)"
    );
    for name in &archived {
        w.restore_and_compare(name, "restored");
    }
}

#[test]
fn one_cache_serves_every_open_snapshot_within_its_bound_and_outlives_them() {
    let mut w = world("a shared cache");
    let mut rng = Rng(0x0000_ddb1_a5e5);
    for day in 0..3 {
        scribble(&w.pool, &mut rng, day);
        w.take_and_push(day, 64 * 1024);
    }
    let url = format!("file://{}", w._dirs.1.path().display());
    let names = ["vm@day000", "vm@day001", "vm@day002"];
    // Small: the three snapshots together do not fit.
    let small = grove_archive::BlockCache::new(40 * BLOCK);
    let mut buf = vec![0u8; (VOLUME_BLOCKS * BLOCK) as usize];
    for name in names {
        let view =
            grove_archive::ArchivedVolume::open_shared(&url, "vm", name, small.clone()).unwrap();
        view.read_at(&mut buf, 0).unwrap();
        assert!(buf == w.contents[name], "{name}");
        assert!(
            small.held_bytes() <= 40 * BLOCK,
            "the bound holds over every snapshot"
        );
    }
    // Big enough for one: a snapshot opened again reads what the cache
    // kept, even with its packs gone (proof that nothing was fetched).
    let big = grove_archive::BlockCache::new(2 * VOLUME_BLOCKS * BLOCK);
    let view =
        grove_archive::ArchivedVolume::open_shared(&url, "vm", names[2], big.clone()).unwrap();
    view.read_at(&mut buf, 0).unwrap();
    drop(view);
    let folder = w._dirs.1.path().join("archive=vm");
    for entry in std::fs::read_dir(&folder).unwrap() {
        let path = entry.unwrap().path();
        if path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("pack-")
        {
            std::fs::remove_file(path).unwrap();
        }
    }
    let again = grove_archive::ArchivedVolume::open_shared(&url, "vm", names[2], big).unwrap();
    let mut second = vec![0u8; buf.len()];
    again.read_at(&mut second, 0).unwrap();
    assert!(second == w.contents[names[2]]);
    let fresh = grove_archive::ArchivedVolume::open(&url, "vm", names[2], 1 << 20).unwrap();
    assert!(
        fresh.read_at(&mut second, 0).is_err(),
        "a cold cache must fetch, and the packs are gone"
    );
}
