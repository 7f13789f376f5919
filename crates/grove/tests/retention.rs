//! Retention end to end with the real binary: policies set, explained and
//! refused when wrong; `grove snapshot --auto` and `grove prune` driven
//! through days of `--now`, keeping what the policy says; holds with and
//! without leases against rm and prune; a replication cursor holding its
//! snapshot; and `grove serve`'s scheduler taking and pruning snapshots on
//! a clock the test drives, while the pool is served.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

mod support;
use support::{GroveOnPool, Reaped, TempPool as Pool};

const HOUR: u64 = 3600;
/// 2026-11-23 00:00:00 UTC, a Monday.
const MONDAY: u64 = 1_795_392_000;
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
const SCHEDULER_TIMEOUT: Duration = Duration::from_secs(20);

impl Pool {
    /// A pool with a 16 MiB volume "vm".
    fn with_vm() -> Pool {
        let pool = Pool::init(&[]);
        pool.ok(&["create", "vm", "--size", "16M"]);
        pool
    }

    /// The one-line error of a command that must fail.
    fn fails(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert!(!output.status.success(), "grove {args:?} succeeded");
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(stderr.starts_with("grove: error: "), "{stderr}");
        stderr
    }

    fn snapshots(&self) -> BTreeSet<String> {
        self.list()
            .iter()
            .filter(|v| v["kind"] == "snapshot")
            .map(|v| v["name"].as_str().unwrap().to_string())
            .collect()
    }
}

fn at(t: u64) -> String {
    format!("@{t}")
}

#[test]
fn policies_are_set_explained_and_refused_when_wrong() {
    let pool = Pool::with_vm();
    let out = pool.ok(&[
        "policy",
        "set",
        "vm",
        "--template",
        "production",
        "--hourly",
        "4",
    ]);
    assert_eq!(out.trim(), "vm: hourly 4, daily 30, monthly 3");
    let toml = std::fs::read_to_string(pool.path.join("grove.toml")).unwrap();
    assert!(toml.contains("[retention.volumes.vm]"), "{toml}");
    let templates = pool.ok(&["policy", "templates"]);
    assert!(
        templates.contains("production: hourly 36, daily 30, monthly 3"),
        "{templates}"
    );

    let e = pool.fails(&["policy", "set", "vm", "--template", "prod"]);
    assert!(e.contains("no template named \"prod\""), "{e}");
    let e = pool.fails(&["policy", "set", "nope", "--daily", "3"]);
    assert!(e.contains("no volume named \"nope\""), "{e}");
    pool.ok(&["snapshot", "vm", "vm@x"]);
    let e = pool.fails(&["policy", "set", "vm@x", "--daily", "3"]);
    assert!(e.contains("is a snapshot"), "{e}");
    let e = pool.fails(&[
        "policy",
        "set",
        "vm",
        "--frequent",
        "2",
        "--frequent-period",
        "5s",
    ]);
    assert!(e.contains("at least 1m"), "{e}");
    let e = pool.fails(&["rank", "vm@x", "daly"]);
    assert!(e.contains("unknown level \"daly\""), "{e}");
    let e = pool.fails(&["rank", "vm", "daily"]);
    assert!(e.contains("only read-only snapshots are ranked"), "{e}");
    // --auto names the snapshot itself: a name with it is a usage error.
    let usage = pool.run(&["snapshot", "--auto", "vm", "vm@y"]);
    assert_eq!(usage.status.code(), Some(2));
    pool.ok(&["create", "scratch", "--size", "1M"]);
    let e = pool.fails(&["snapshot", "--auto", "scratch"]);
    assert!(
        e.contains("volume \"scratch\" has no retention policy"),
        "{e}"
    );
    let e = pool.fails(&["prune", "vm@x"]);
    assert!(e.contains("is a snapshot"), "{e}");
    let e = pool.fails(&["prune", "--now", "tomorrow"]);
    assert!(e.contains("bad time \"tomorrow\""), "{e}");
    // The refusals changed nothing.
    assert_eq!(
        toml,
        std::fs::read_to_string(pool.path.join("grove.toml")).unwrap()
    );

    // A hand-edited mistake is named by key.
    std::fs::write(
        pool.path.join("grove.toml"),
        toml.replace("hourly = 4", "hourlyy = 4"),
    )
    .unwrap();
    let e = pool.fails(&["policy", "show"]);
    assert!(e.contains("unknown key \"hourlyy\""), "{e}");
    std::fs::write(pool.path.join("grove.toml"), &toml).unwrap();
    pool.ok(&["policy", "unset", "vm"]);
    let out = pool.ok(&["policy", "show"]);
    assert!(out.contains("no volume has a retention policy"), "{out}");
}

/// Three days of hourly `snapshot --auto` and `prune`, as cron would run
/// them: at the end the pool holds the 3 newest hourly snapshots, the
/// midnights of the last 2 days, the hand-taken one and the held one, and
/// `policy show --json` says which rule keeps each.
#[test]
fn cron_style_auto_snapshots_and_prunes_keep_what_the_policy_says() {
    let pool = Pool::with_vm();
    pool.ok(&["policy", "set", "vm", "--hourly", "3", "--daily", "2"]);
    for hour in 0..72 {
        let now = MONDAY + hour * HOUR;
        let out = pool.ok(&["snapshot", "--auto", "vm", "--now", &at(now)]);
        assert!(out.starts_with("created snapshot"), "hour {hour}: {out}");
        if hour == 5 {
            pool.ok(&["snapshot", "vm", "vm@by-hand"]);
            let held = newest_auto(&pool);
            pool.ok(&["hold", &held, "legal"]);
        }
        // A second run in the same hour has nothing due.
        let again = pool.ok(&["snapshot", "--auto", "vm", "--now", &at(now + 60)]);
        assert!(again.contains("no snapshot is due"), "{again}");
        pool.ok(&["prune", "--now", &at(now + 60)]);
    }
    let end = MONDAY + 71 * HOUR + 60;
    let shown: Value =
        serde_json::from_str(&pool.ok(&["policy", "show", "--json", "--now", &at(end)])).unwrap();
    let snapshots = shown[0]["snapshots"].as_array().unwrap();
    let kept_by = |rule: &str| -> Vec<u64> {
        snapshots
            .iter()
            .filter(|s| s["kept_by"] == rule)
            .map(|s| s["created_unix_secs"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(
        kept_by("hourly"),
        [MONDAY + 71 * HOUR, MONDAY + 70 * HOUR, MONDAY + 69 * HOUR]
    );
    assert_eq!(kept_by("daily"), [MONDAY + 48 * HOUR, MONDAY + 24 * HOUR]);
    let rules: Vec<&str> = snapshots
        .iter()
        .map(|s| s["rule"].as_str().unwrap())
        .collect();
    assert!(
        rules.iter().any(|r| r.starts_with("held by legal")),
        "{rules:?}"
    );
    assert!(
        rules.iter().any(|r| r.starts_with("not ranked")),
        "{rules:?}"
    );
    assert!(snapshots.iter().all(|s| s["keep"] == true));
    assert_eq!(pool.snapshots().len(), 3 + 2 + 2, "{:?}", pool.snapshots());
    assert!(pool.snapshots().contains("vm@by-hand"));
    // Nothing left to prune, and a dry run says so.
    let dry = pool.ok(&["prune", "--dry-run", "--now", &at(end)]);
    assert!(dry.contains("nothing to prune"), "{dry}");
}

fn newest_auto(pool: &Pool) -> String {
    pool.snapshots()
        .into_iter()
        .filter(|n| n.starts_with("vm@auto-"))
        .max()
        .unwrap()
}

#[test]
fn holds_stop_rm_and_prune_until_released_or_their_lease_ends() {
    let pool = Pool::with_vm();
    pool.ok(&["policy", "set", "vm", "--hourly", "1"]);
    pool.ok(&["snapshot", "--auto", "vm", "--now", &at(MONDAY)]);
    let first = newest_auto(&pool);
    pool.ok(&["hold", &first, "audit", "--for", "2h", "--now", &at(MONDAY)]);
    pool.ok(&["hold", &first, "legal"]);
    let holds: Value = serde_json::from_str(&pool.ok(&["holds", "--json"])).unwrap();
    assert_eq!(holds.as_array().unwrap().len(), 2, "{holds}");
    assert_eq!(holds[0]["tag"], "audit");
    assert_eq!(holds[0]["until_unix_secs"], MONDAY + 2 * HOUR);
    let e = pool.fails(&["rm", &first]);
    assert!(e.contains("is held (audit, legal)"), "{e}");
    // The way out names the real tags, not a placeholder.
    assert!(
        e.contains(&format!(
            "`grove release {first} audit` and `grove release {first} legal`"
        )) && !e.contains("TAG"),
        "{e}"
    );
    let e = pool.fails(&["release", &first, "nope"]);
    assert!(
        e.contains("has no hold \"nope\"; its holds are audit, legal"),
        "{e}"
    );
    let e = pool.fails(&["hold", "vm", "x"]);
    assert!(e.contains("only read-only snapshots are held"), "{e}");

    // Newer snapshots push it out of the policy, but the holds keep it.
    pool.ok(&["snapshot", "--auto", "vm", "--now", &at(MONDAY + HOUR)]);
    pool.ok(&["prune", "--now", &at(MONDAY + HOUR)]);
    assert!(pool.snapshots().contains(&first));
    pool.ok(&["release", &first, "legal"]);
    // The lease still holds it an hour later...
    pool.ok(&["prune", "--now", &at(MONDAY + HOUR + 60)]);
    assert!(pool.snapshots().contains(&first));
    // ...and once it ends, prune releases it and the policy lets it go.
    let out = pool.ok(&["prune", "--now", &at(MONDAY + 2 * HOUR)]);
    assert!(
        out.contains(&format!("released hold {first} audit")),
        "{out}"
    );
    assert!(out.contains(&format!("removed {first}")), "{out}");
    assert!(!pool.snapshots().contains(&first));
    assert!(pool.ok(&["holds"]).contains("no holds"));

    // --force removes a held snapshot, and its holds with it.
    pool.ok(&["snapshot", "vm", "vm@kept"]);
    pool.ok(&["hold", "vm@kept", "t"]);
    pool.ok(&["rm", "--force", "vm@kept"]);
    assert!(pool.ok(&["holds"]).contains("no holds"));
}

/// The snapshot a replication cursor marks is the next incremental's base:
/// prune keeps it while the cursor is there.
#[test]
fn a_replication_cursor_holds_its_snapshot() {
    let pool = Pool::with_vm();
    pool.ok(&["policy", "set", "vm", "--hourly", "1"]);
    pool.ok(&["snapshot", "--auto", "vm", "--now", &at(MONDAY)]);
    let sent = newest_auto(&pool);
    let stream = pool.dir.path().join("s");
    pool.ok(&[
        "send",
        &sent,
        "--cursor",
        "offsite",
        "-o",
        stream.to_str().unwrap(),
    ]);
    pool.ok(&["snapshot", "--auto", "vm", "--now", &at(MONDAY + HOUR)]);
    let shown = pool.ok(&["policy", "show", "--now", &at(MONDAY + HOUR)]);
    assert!(shown.contains("held by cursor:offsite"), "{shown}");
    pool.ok(&["prune", "--now", &at(MONDAY + HOUR)]);
    assert!(pool.snapshots().contains(&sent));
}

/// `grove serve` runs the schedule: with its clock driven through a file,
/// a snapshot appears each hour of a day and a half, ranked and pruned as
/// the policy says, while the pool is served.
#[test]
fn the_served_pool_s_scheduler_takes_and_prunes_on_its_clock() {
    let pool = Pool::with_vm();
    pool.ok(&["policy", "set", "vm", "--hourly", "2", "--daily", "1"]);
    let clock = pool.dir.path().join("clock");
    std::fs::write(&clock, MONDAY.to_string()).unwrap();
    let server = serve(&pool, &clock);
    for hour in 0..36 {
        let now = MONDAY + hour * HOUR;
        std::fs::write(&clock, now.to_string()).unwrap();
        wait_until(&pool, || {
            let shown: Value =
                serde_json::from_str(&pool.ok(&["policy", "show", "--json", "--now", &at(now)]))
                    .unwrap();
            let snapshots = shown[0]["snapshots"].as_array().unwrap().clone();
            let newest = snapshots[0]["created_unix_secs"].as_u64() == Some(now);
            newest && snapshots.iter().all(|s| s["keep"] == true)
        });
    }
    let shown: Value = serde_json::from_str(&pool.ok(&[
        "policy",
        "show",
        "--json",
        "--now",
        &at(MONDAY + 35 * HOUR),
    ]))
    .unwrap();
    let kept: Vec<(u64, String)> = shown[0]["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["created_unix_secs"].as_u64().unwrap(),
                s["kept_by"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        kept,
        [
            (MONDAY + 35 * HOUR, "hourly".to_string()),
            (MONDAY + 34 * HOUR, "hourly".to_string()),
            (MONDAY + 24 * HOUR, "daily".to_string()),
        ]
    );
    drop(server);
}

/// The scheduler snapshots a volume an NBD client (qemu-io) is writing:
/// each hour's snapshot holds every write acknowledged before the clock
/// reached that hour, and none after; pruning goes on meanwhile.
#[test]
fn the_scheduler_s_snapshots_hold_every_write_acknowledged_before_them() {
    if !support::have("qemu-io") {
        return;
    }
    let pool = Pool::with_vm();
    pool.ok(&["policy", "set", "vm", "--hourly", "3"]);
    let clock = pool.dir.path().join("clock");
    std::fs::write(&clock, (MONDAY - HOUR).to_string()).unwrap();
    let _server = serve(&pool, &clock);
    let socket = pool.path.join("nbd.sock");
    let uri = |export: &str| format!("nbd+unix:///{export}?socket={}", socket.display());
    let chunk = 64 * 1024;
    let hours = 6u64;
    for hour in 0..hours {
        // Acknowledged before the clock moves on to this hour.
        let write = format!("write -P {} {} {chunk}", hour + 1, hour * chunk);
        let out = qemu_io(&uri("vm"), &[&write]);
        assert!(out.contains("wrote"), "{out}");
        let now = MONDAY + hour * HOUR;
        std::fs::write(&clock, now.to_string()).unwrap();
        wait_until(&pool, || newest_auto_created(&pool) == Some(now));
    }
    let snapshots: Vec<String> = pool
        .snapshots()
        .into_iter()
        .filter(|n| n.starts_with("vm@auto-"))
        .collect();
    assert_eq!(snapshots.len(), 3, "{snapshots:?}");
    for (i, name) in snapshots.iter().enumerate() {
        // The 3 kept are the last hours' snapshots, oldest first.
        let hour = hours - 3 + i as u64;
        let mut reads = Vec::new();
        for h in 0..hours {
            let pattern = if h <= hour { h + 1 } else { 0 };
            reads.push(format!("read -P {pattern} {} {chunk}", h * chunk));
        }
        let reads: Vec<&str> = reads.iter().map(String::as_str).collect();
        let out = qemu_io(&uri(name), &reads);
        assert!(
            !out.contains("Pattern verification failed")
                && out.matches("read ").count() == hours as usize,
            "{name} (hour {hour}): {out}"
        );
    }
}

fn newest_auto_created(pool: &Pool) -> Option<u64> {
    let out = pool.ok(&["list", "--json"]);
    serde_json::from_str::<Value>(&out)
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| {
            v["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("vm@auto-"))
        })
        .filter_map(|v| v["created_unix_secs"].as_u64())
        .max()
}

/// qemu-io's output for `commands` on `uri` (read-only unless one writes).
fn qemu_io(uri: &str, commands: &[&str]) -> String {
    let mut command = Command::new("qemu-io");
    command.args(["-f", "raw"]);
    if !commands.iter().any(|c| c.starts_with("write")) {
        command.arg("-r");
    }
    for c in commands {
        command.args(["-c", c]);
    }
    let output = command.arg(uri).output().unwrap();
    String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr)
}

/// `grove serve` on a pool with its clock read from `clock`, killed on
/// drop.
fn serve(pool: &Pool, clock: &Path) -> Reaped {
    let mut command = pool.command(&["serve"]);
    command
        .env("GROVE_CLOCK_FILE", clock)
        .env("GROVE_SCHEDULER_TICK_MS", "20");
    pool.spawn_serving(command, &["grove.control"], STARTUP_TIMEOUT)
}

fn wait_until(pool: &Pool, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < SCHEDULER_TIMEOUT,
            "the scheduler did not act in time; snapshots: {:?}",
            pool.snapshots()
        );
        std::thread::sleep(Duration::from_millis(30));
    }
}

/// A prune through the control socket of more snapshots than one control
/// request can name (600 names of 120 bytes: 72 KB, past the daemon's
/// 64 KiB request line) removes them all, in several requests.
#[test]
fn a_served_prune_of_more_names_than_one_request_holds_removes_them_all() {
    let pool = Pool::with_vm();
    let count = 600;
    let name = |i: u64| format!("vm@{i:0>117}");
    {
        let store = grove_store::Pool::open(&pool.path).unwrap();
        for i in 0..count {
            store
                .snapshot_ranked("vm", &name(i), 2, MONDAY + i * HOUR)
                .unwrap();
        }
        store.close().unwrap();
    }
    pool.ok(&["policy", "set", "vm", "--hourly", "2"]);
    // A clock file that never exists: the daemon's scheduler never acts.
    let server = serve(&pool, &pool.dir.path().join("no-clock"));
    pool.ok(&["prune", "--now", &at(MONDAY + count * HOUR)]);
    let left: BTreeSet<String> = [name(count - 1), name(count - 2)].into();
    assert_eq!(pool.snapshots(), left);
    drop(server);
}

/// The levels in rank order, as `grove rank` names them.
const LEVELS: [&str; 6] = ["frequent", "hourly", "daily", "weekly", "monthly", "yearly"];

/// What the rank tree keeps, written apart from the planner: each level
/// keeps the newest `keeps[level]` snapshots ranked at it or higher, and a
/// snapshot never ranked is the policy's to keep. `snapshots` is oldest
/// first, each with its level's index; returns, for each kept one, the
/// highest level keeping it (None: kept as unranked).
fn kept_by_rank(
    snapshots: &[(String, Option<usize>)],
    keeps: [usize; 6],
) -> std::collections::BTreeMap<String, Option<&'static str>> {
    let mut kept = std::collections::BTreeMap::new();
    for (name, rank) in snapshots {
        if rank.is_none() {
            kept.insert(name.clone(), None);
        }
    }
    for (level, &keep) in keeps.iter().enumerate() {
        let counted = snapshots
            .iter()
            .rev()
            .filter(|(_, rank)| rank.is_some_and(|r| r >= level));
        for (name, _) in counted.take(keep) {
            // Levels go up: the last to keep a snapshot is its highest.
            kept.insert(name.clone(), Some(LEVELS[level]));
        }
    }
    kept
}

/// Lazy ranking (`grove rank` after the snapshot was taken by hand): a
/// snapshot taken without a rank is kept as unranked; once ranked, `policy
/// show --json` lists it at that rank, kept by the level the rank tree
/// says, and `prune --dry-run` then `prune` drop exactly what an oracle of
/// the rank tree drops. Three rounds of new hand-taken snapshots, each
/// with some old and new ones ranked (again, or back to none) at random.
#[test]
fn snapshots_ranked_later_are_kept_and_pruned_as_their_rank_against_an_oracle() {
    let pool = Pool::with_vm();
    pool.ok(&[
        "policy", "set", "vm", "--hourly", "3", "--daily", "2", "--weekly", "1",
    ]);
    let keeps = [0, 3, 2, 1, 0, 0];
    // xorshift64: the same ranks every run.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut below = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    // Live snapshots, oldest first, with the rank given (an index of LEVELS).
    let mut live: Vec<(String, Option<usize>)> = Vec::new();
    let mut taken = 0;
    for round in 0..3 {
        for _ in 0..8 {
            // Names in the order taken: two taken in one second are ordered
            // by name, so the oracle's order is the planner's.
            let name = format!("vm@s{taken:02}");
            pool.ok(&["snapshot", "vm", &name]);
            live.push((name, None));
            taken += 1;
        }
        for s in policy_show(&pool) {
            let name = s["name"].as_str().unwrap();
            if live[live.len() - 8..].iter().any(|(n, _)| n == name) {
                assert!(
                    s["rank"].is_null() && s["keep"] == true,
                    "round {round}: taken by hand, kept unranked: {s}"
                );
            }
        }
        for snapshot in live.iter_mut() {
            if below(3) == 0 {
                continue;
            }
            // One chance in seven of `none`, which takes a rank away.
            let level = below(LEVELS.len() as u64 + 1) as usize;
            let text = LEVELS.get(level).copied().unwrap_or("none");
            let out = pool.ok(&["rank", &snapshot.0, text]);
            assert_eq!(out.trim(), format!("ranked {:?} {text}", snapshot.0));
            snapshot.1 = (level < LEVELS.len()).then_some(level);
        }
        let expected = kept_by_rank(&live, keeps);

        let shown = policy_show(&pool);
        assert_eq!(shown.len(), live.len(), "round {round}");
        for s in &shown {
            let name = s["name"].as_str().unwrap();
            let given = live.iter().find(|(n, _)| n == name).unwrap().1;
            assert_eq!(
                s["rank"].as_str(),
                given.map(|l| LEVELS[l]),
                "round {round}: {name} shown at the rank given later"
            );
            assert_eq!(
                s["keep"] == true,
                expected.contains_key(name),
                "round {round}: {s}"
            );
            assert_eq!(
                s["kept_by"].as_str(),
                expected.get(name).copied().flatten(),
                "round {round}: {s}"
            );
        }
        let pruned: BTreeSet<String> = live
            .iter()
            .map(|(n, _)| n.clone())
            .filter(|n| !expected.contains_key(n))
            .collect();
        let now = at(shown_now(&shown));
        let dry = pool.ok(&["prune", "--dry-run", "--now", &now]);
        assert_eq!(prune_lines(&dry, "would remove "), pruned, "{dry}");
        assert_eq!(
            pool.snapshots().len(),
            live.len(),
            "a dry run removes nothing"
        );
        let out = pool.ok(&["prune", "--now", &now]);
        assert_eq!(prune_lines(&out, "removed "), pruned, "{out}");
        live.retain(|(n, _)| expected.contains_key(n));
        let names: BTreeSet<String> = live.iter().map(|(n, _)| n.clone()).collect();
        assert_eq!(pool.snapshots(), names, "round {round}");
        assert!(
            !pruned.is_empty() || round > 0,
            "the ranks leave something to prune"
        );
    }
}

/// `grove policy show --json`'s snapshots of vm, newest first.
fn policy_show(pool: &Pool) -> Vec<Value> {
    let shown: Value = serde_json::from_str(&pool.ok(&["policy", "show", "--json"])).unwrap();
    shown[0]["snapshots"].as_array().unwrap().clone()
}

/// A time past every snapshot shown: where prune acts.
fn shown_now(shown: &[Value]) -> u64 {
    shown
        .iter()
        .map(|s| s["created_unix_secs"].as_u64().unwrap())
        .max()
        .unwrap()
        + HOUR
}

/// The names of `grove prune`'s lines that start with `prefix`.
fn prune_lines(out: &str, prefix: &str) -> BTreeSet<String> {
    out.lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .map(str::to_string)
        .collect()
}
