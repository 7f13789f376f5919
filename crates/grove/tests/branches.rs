//! Pools over several branch directories, through the real binary: init at
//! every redundant level, data read back byte-exact, `grove info --json`,
//! foreign and stale branches refused in one line, degraded opens, rebuild
//! (and its refusal of a healthy branch), scrub finding and repairing a
//! flipped byte, `grove branch fail`; a served pool whose branch directory
//! is removed while fio writes through NBD, then rebuilt online, every byte
//! verified; and growth: `grove branch add` and `grove branch restripe`
//! under qemu-io writes, a restripe killed part way and resumed.

mod support;
use support::GroveOnPool;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use support::{assert_qemu_io_ok, have, Reaped, GROVE};

/// The layouts the tests run over: level and branch count.
const LAYOUTS: [(&str, usize); 5] = [
    ("raif1", 3),
    ("raif5", 3),
    ("raif5", 4),
    ("raif6", 4),
    ("raif10", 4),
];
const IMAGE_BYTES: usize = 3 << 20;

struct Setup {
    dir: tempfile::TempDir,
}

impl GroveOnPool for Setup {
    fn pool_path(&self) -> PathBuf {
        self.pool()
    }
}

impl Setup {
    /// A pool in DIR/pool over DIR/b0 .. DIR/b{n-1}.
    fn init(level: &str, branches: usize) -> Setup {
        let setup = Setup {
            dir: tempfile::tempdir().unwrap(),
        };
        let mut args = vec!["init".to_string(), "--capacity".into(), "64M".into()];
        for i in 0..branches {
            args.push("--branch".into());
            args.push(setup.branch(i).display().to_string());
        }
        args.extend(["--level".into(), level.into()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = setup.ok(&args);
        assert!(
            out.contains(&format!("{level} over {branches} branches")),
            "{out}"
        );
        setup
    }

    fn pool(&self) -> PathBuf {
        self.dir.path().join("pool")
    }

    fn branch(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("b{i}"))
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Runs a command that must fail with one error line; returns it.
    fn fails(&self, args: &[&str]) -> String {
        let output = self.run(args);
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(output.status.code(), Some(1), "grove {args:?}: {stderr}");
        let errors: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("grove: error: "))
            .collect();
        assert_eq!(errors.len(), 1, "grove {args:?}: {stderr}");
        errors[0].to_string()
    }

    /// Imports an image of patterned data with holes as volume `name`;
    /// returns its bytes.
    fn import(&self, name: &str, seed: u64) -> Vec<u8> {
        self.import_with(&[], name, seed)
    }

    fn import_with(&self, flags: &[&str], name: &str, seed: u64) -> Vec<u8> {
        let image = pattern(IMAGE_BYTES, seed);
        let file = self.path(&format!("{name}.img"));
        std::fs::write(&file, &image).unwrap();
        let mut args = flags.to_vec();
        args.extend(["import", name, file.to_str().unwrap()]);
        self.ok(&args);
        image
    }

    /// Exports `name` (with these extra global flags) and compares it.
    fn assert_volume(&self, flags: &[&str], name: &str, expected: &[u8], context: &str) {
        let out = self.path("export.img");
        let _ = std::fs::remove_file(&out);
        let mut args = flags.to_vec();
        args.extend(["export", name, out.to_str().unwrap()]);
        self.ok(&args);
        let back = std::fs::read(&out).unwrap();
        assert_eq!(back.len(), expected.len(), "{context}: length");
        let first_bad = back.iter().zip(expected).position(|(a, b)| a != b);
        assert!(
            first_bad.is_none(),
            "{context}: differs at byte {first_bad:?}"
        );
    }

    fn info(&self, flags: &[&str]) -> serde_json::Value {
        let mut args = flags.to_vec();
        args.extend(["info", "--json"]);
        serde_json::from_str(&self.ok(&args)).unwrap()
    }

    fn health(&self, flags: &[&str]) -> Vec<String> {
        self.info(flags)["branches"]["branches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["health"].as_str().unwrap().to_string())
            .collect()
    }
}

/// Patterned bytes with runs of zeros (holes once imported).
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    let mut out = vec![0u8; len];
    for (chunk_index, chunk) in out.chunks_mut(64 * 1024).enumerate() {
        if chunk_index % 5 == 3 {
            continue;
        }
        for byte in chunk.iter_mut() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *byte = state as u8;
        }
    }
    out
}

#[test]
fn every_level_reads_back_what_was_written_degraded_and_after_rebuild() {
    for (level, n) in LAYOUTS {
        let context = format!("{level} over {n}");
        let setup = Setup::init(level, n);
        let image = setup.import("disk", 7 + n as u64);
        setup.assert_volume(&[], "disk", &image, &context);

        let info = setup.info(&[]);
        let branches = &info["branches"];
        assert_eq!(branches["level"], level, "{info}");
        assert_eq!(branches["degraded"], false, "{info}");
        assert_eq!(branches["stripe_unit_bytes"], 4096, "{info}");
        let listed = branches["branches"].as_array().unwrap();
        assert_eq!(listed.len(), n, "{info}");
        for (i, branch) in listed.iter().enumerate() {
            assert_eq!(branch["label"], format!("b{i}"));
            assert_eq!(branch["dir"], setup.branch(i).display().to_string());
            assert_eq!(branch["health"], "ok");
        }
        let text = setup.ok(&["info"]);
        assert!(text.contains(&format!("{level} over {n}")), "{text}");

        // A branch directory gone: refused without --degraded, in one line
        // that says how; with it, every byte is there.
        std::fs::remove_dir_all(setup.branch(1)).unwrap();
        let refused = setup.fails(&["info"]);
        assert!(
            refused.contains("branch b1") && refused.contains("--degraded"),
            "{refused}"
        );
        setup.assert_volume(
            &["--degraded"],
            "disk",
            &image,
            &format!("{context} degraded"),
        );
        let info = setup.info(&["--degraded"]);
        assert_eq!(info["branches"]["degraded"], true, "{info}");
        assert_eq!(setup.health(&["--degraded"])[1], "failed");
        let text = setup.ok(&["--degraded", "info"]);
        assert!(text.contains("DEGRADED"), "{text}");

        // Rebuilt into a new directory; then another branch lost, and the
        // data still whole: the rebuilt branch carries its share.
        let new_dir = setup.path("b1-new");
        let out = setup.ok(&[
            "--degraded",
            "rebuild",
            "--branch",
            "b1",
            "--to",
            new_dir.to_str().unwrap(),
        ]);
        assert!(out.contains("rebuilt branch b1"), "{out}");
        let info = setup.info(&[]);
        assert_eq!(info["branches"]["degraded"], false, "{info}");
        assert_eq!(
            info["branches"]["branches"][1]["dir"],
            new_dir.display().to_string()
        );
        let other = if n > 2 { 2 } else { 0 };
        std::fs::remove_dir_all(setup.branch(other)).unwrap();
        setup.assert_volume(
            &["--degraded"],
            "disk",
            &image,
            &format!("{context} rebuilt, then b{other} lost"),
        );
    }
}

#[test]
fn writes_while_degraded_survive_the_rebuild() {
    let setup = Setup::init("raif5", 3);
    let first = setup.import("disk", 3);
    std::fs::remove_dir_all(setup.branch(0)).unwrap();
    let second = setup.import_with(&["--degraded"], "more", 4);
    setup.ok(&[
        "--degraded",
        "rebuild",
        "--branch",
        "b0",
        "--to",
        setup.path("b0-new").to_str().unwrap(),
    ]);
    std::fs::remove_dir_all(setup.branch(1)).unwrap();
    setup.assert_volume(&["--degraded"], "disk", &first, "disk");
    setup.assert_volume(&["--degraded"], "more", &second, "more");
}

#[test]
fn a_branch_of_another_pool_is_refused_in_one_line() {
    let a = Setup::init("raif5", 3);
    let b = Setup::init("raif5", 3);
    let identity = "grove-branch.toml";
    std::fs::copy(b.branch(1).join(identity), a.branch(1).join(identity)).unwrap();
    for flags in [&[][..], &["--degraded"][..]] {
        let mut args = flags.to_vec();
        args.push("info");
        let refused = a.fails(&args);
        assert!(
            refused.contains("branch b1") && refused.contains("belongs to another pool"),
            "{refused}"
        );
    }
}

#[test]
fn an_old_copy_of_a_branch_is_refused() {
    let setup = Setup::init("raif5", 3);
    let first = setup.import("disk", 11);
    let old = setup.path("b1-old");
    copy_dir(&setup.branch(1), &old);
    let second = setup.import("more", 12);
    std::fs::remove_dir_all(setup.branch(1)).unwrap();
    std::fs::rename(&old, setup.branch(1)).unwrap();
    let refused = setup.fails(&["list"]);
    assert!(
        refused.contains("branch b1") && refused.contains("old copy"),
        "{refused}"
    );
    // Run without it, the pool holds what was written after the copy.
    setup.assert_volume(&["--degraded"], "disk", &first, "disk");
    setup.assert_volume(&["--degraded"], "more", &second, "more");
    assert_eq!(setup.health(&["--degraded"])[1], "failed");
}

/// Sets `key = value` in branch directory `dir`'s identity file.
fn set_identity(dir: &Path, key: &str, value: &str) {
    let path = dir.join("grove-branch.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut found = false;
    let text: Vec<String> = text
        .lines()
        .map(|line| match line.split_once(" = ") {
            Some((k, _)) if k == key => {
                found = true;
                format!("{key} = {value}")
            }
            _ => line.to_string(),
        })
        .collect();
    assert!(found, "no {key} in {}", path.display());
    std::fs::write(&path, text.join("\n")).unwrap();
}

fn identity_number(dir: &Path, key: &str) -> u64 {
    let text = std::fs::read_to_string(dir.join("grove-branch.toml")).unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{key} = ")))
        .unwrap_or_else(|| panic!("no {key} in {text}"))
        .parse()
        .unwrap()
}

/// An open killed while it raised the branches' sequence (b0 took the new
/// one, b1 and b2 not yet) leaves no old copy: nothing was written after.
/// (A kill of `grove branch restripe` at its start made one, at random.)
#[test]
fn an_open_cut_short_while_raising_the_sequence_leaves_no_old_copy() {
    let setup = Setup::init("raif5", 3);
    let image = setup.import("disk", 27);
    let sequence = identity_number(&setup.branch(0), "sequence");
    assert_eq!(identity_number(&setup.branch(0), "settled"), sequence);
    set_identity(&setup.branch(0), "sequence", &(sequence + 1).to_string());
    assert_eq!(setup.health(&[]), ["ok", "ok", "ok"]);
    setup.assert_volume(&[], "disk", &image, "after the cut-short open");
    // Every branch took the next record whole.
    let after = identity_number(&setup.branch(0), "sequence");
    for i in 0..3 {
        assert_eq!(identity_number(&setup.branch(i), "sequence"), after);
        assert_eq!(identity_number(&setup.branch(i), "settled"), after);
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

#[test]
fn rebuilding_a_healthy_branch_takes_force() {
    let setup = Setup::init("raif1", 3);
    let image = setup.import("disk", 5);
    let to = setup.path("b2-new");
    let args = ["rebuild", "--branch", "b2", "--to", to.to_str().unwrap()];
    let refused = setup.fails(&args);
    assert!(refused.contains("--force"), "{refused}");
    assert!(!to.exists(), "a refused rebuild touched {}", to.display());
    let mut forced = args.to_vec();
    forced.push("--force");
    setup.ok(&forced);
    assert_eq!(setup.health(&[]), ["ok", "ok", "ok"]);
    // Only the rebuilt copy is left, and holds every byte.
    std::fs::remove_dir_all(setup.branch(0)).unwrap();
    std::fs::remove_dir_all(setup.branch(1)).unwrap();
    setup.assert_volume(&["--degraded"], "disk", &image, "rebuilt copy alone");
    // Unknown labels and busy directories are refused in one line.
    let refused = setup.fails(&["--degraded", "rebuild", "--branch", "b9", "--to", "/tmp/x"]);
    assert!(refused.contains("b9"), "{refused}");
    let not_empty = setup.path("full");
    std::fs::create_dir_all(&not_empty).unwrap();
    std::fs::write(not_empty.join("file"), b"x").unwrap();
    let refused = setup.fails(&[
        "--degraded",
        "rebuild",
        "--branch",
        "b0",
        "--to",
        not_empty.to_str().unwrap(),
    ]);
    assert!(refused.contains("not empty"), "{refused}");
}

#[test]
fn scrub_finds_and_repairs_a_flipped_byte() {
    for (level, n) in [("raif1", 3), ("raif5", 3), ("raif6", 4)] {
        let setup = Setup::init(level, n);
        let image = setup.import("disk", 21);
        let clean = setup.ok(&["scrub", "--json"]);
        let report: serde_json::Value = serde_json::from_str(&clean).unwrap();
        assert_eq!(report["stripes_with_errors"], 0, "{level}: {report}");

        // Flip a byte of the image's data in b1's data file: a unit that
        // is one of the image's 4 KiB blocks (the stripe unit).
        let data_file = setup.branch(1).join("grove.branch");
        let mut bytes = std::fs::read(&data_file).unwrap();
        let blocks: std::collections::HashSet<&[u8]> = image
            .chunks(4096)
            .filter(|b| b.iter().any(|&x| x != 0))
            .collect();
        let unit = bytes
            .chunks(4096)
            .position(|u| blocks.contains(u))
            .expect("a block of the image on b1");
        let at = unit * 4096 + 100;
        bytes[at] ^= 0x5a;
        std::fs::write(&data_file, &bytes).unwrap();

        let output = setup.run(&["scrub", "--json"]);
        assert_eq!(output.status.code(), Some(1), "{level}: {output:?}");
        let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(report["stripes_with_errors"], 1, "{level}: {report}");
        assert_eq!(report["bad_units"]["b1"], 1, "{level}: {report}");

        let out = setup.ok(&["scrub", "--repair"]);
        assert!(out.contains("1 units repaired"), "{level}: {out}");
        let report: serde_json::Value =
            serde_json::from_str(&setup.ok(&["scrub", "--json"])).unwrap();
        assert_eq!(report["stripes_with_errors"], 0, "{level}: {report}");
        assert_eq!(std::fs::read(&data_file).unwrap()[at], bytes[at] ^ 0x5a);
        setup.assert_volume(&[], "disk", &image, level);
    }
}

/// The rebuild command a line of grove's names, as arguments after
/// `grove`: what is between "`grove rebuild" and the closing "`".
fn printed_rebuild(line: &str) -> Vec<String> {
    let start = line
        .find("`grove rebuild")
        .unwrap_or_else(|| panic!("no rebuild command in: {line}"));
    let rest = &line[start + "`grove ".len()..];
    let end = rest.find('`').expect("the command's closing backquote");
    rest[..end].split_whitespace().map(String::from).collect()
}

fn fuse_possible() -> bool {
    rustix::process::geteuid().is_root() && Path::new("/dev/fuse").exists()
}

/// `grove mount --foreground` on the setup's pool until unmounted: the
/// daemon's log (GROVE_LOG=info), or None without root and /dev/fuse.
fn mount_log_until_unmounted(setup: &Setup, flags: &[&str]) -> Option<String> {
    if !fuse_possible() {
        eprintln!("SKIP (mount part): needs root and /dev/fuse");
        return None;
    }
    let mountpoint = setup.path("mnt");
    std::fs::create_dir_all(&mountpoint).unwrap();
    let log = setup.path("mount.log");
    let child = Command::new(GROVE)
        .arg("--pool")
        .arg(setup.pool())
        .args(flags)
        .args(["mount", "--foreground"])
        .arg(&mountpoint)
        .env("GROVE_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut child = Reaped(child);
    let started = Instant::now();
    while !mountpoint.join("disk").exists() {
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(child.0.try_wait().unwrap().is_none(), "grove mount: {log}");
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no mount: {log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(Command::new("umount")
        .arg(&mountpoint)
        .status()
        .unwrap()
        .success());
    assert!(child.0.wait().unwrap().success());
    Some(std::fs::read_to_string(&log).unwrap())
}

/// Issue 35: a branch taken out of service with `grove branch fail` is
/// reported failed (never an old copy) by every command, `grove serve` and
/// `grove mount`, all of which run degraded without being asked; the
/// rebuild command grove prints then works as printed.
#[test]
fn a_failed_branch_is_reported_failed_everywhere_and_rebuilt_as_printed() {
    let setup = Setup::init("raif5", 3);
    let image = setup.import("disk", 9);
    let hash = setup.ok(&["hash", "disk"]);
    let out = setup.ok(&["branch", "fail", "b2"]);
    assert!(out.contains("branch b2 is out of service"), "{out}");
    let printed = printed_rebuild(&out);
    assert_eq!(
        printed,
        ["rebuild", "--branch", "b2", "--to", "DIR"],
        "{out}"
    );

    for args in [
        &["info"][..],
        &["hash", "disk"],
        &["list"],
        &["check"],
        &["export", "disk", "/dev/null"],
    ] {
        let output = setup.run(args);
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        let said = format!("{stdout}{stderr}");
        assert!(output.status.success(), "grove {args:?}: {stderr}");
        assert!(!said.contains("old copy"), "grove {args:?}: {said}");
        let failed = stderr.contains("branch b2 (") && stderr.contains(") failed")
            || stdout.lines().any(|l| {
                l.split_whitespace()
                    .eq(["b2", "failed", &setup.branch(2).display().to_string()])
            });
        assert!(failed, "grove {args:?} does not say b2 failed: {said}");
    }
    assert_eq!(setup.ok(&["hash", "disk"]), hash);
    setup.assert_volume(&[], "disk", &image, "b2 failed");
    assert_eq!(setup.health(&[]), ["ok", "ok", "failed"]);
    assert_eq!(setup.info(&[])["branches"]["degraded"], true);
    // A second failure is past what RAIF5 survives.
    let refused = setup.fails(&["branch", "fail", "b0"]);
    assert!(refused.contains("cannot do without"), "{refused}");

    let served = Served::start(&setup, &[]);
    assert_eq!(setup.health(&[]), ["ok", "ok", "failed"]);
    let log = served.stop();
    assert!(log.contains("branch b2") && log.contains("failed"), "{log}");
    assert!(!log.contains("old copy"), "{log}");
    if let Some(log) = mount_log_until_unmounted(&setup, &[]) {
        assert!(log.contains("branch b2") && log.contains("failed"), "{log}");
        assert!(!log.contains("old copy"), "{log}");
    }

    // The printed command, DIR filled in, and nothing else.
    let new_dir = setup.path("b2-new");
    let mut args: Vec<&str> = printed.iter().map(String::as_str).collect();
    args[4] = new_dir.to_str().unwrap();
    let out = setup.ok(&args);
    assert!(out.contains("rebuilt branch b2"), "{out}");
    assert_eq!(setup.health(&[]), ["ok", "ok", "ok"]);
    let output = setup.run(&["list"]);
    assert!(
        output.status.success() && output.stderr.is_empty(),
        "{output:?}"
    );
    // The rebuilt branch carries its share: lose another.
    std::fs::remove_dir_all(setup.branch(0)).unwrap();
    setup.assert_volume(&["--degraded"], "disk", &image, "rebuilt, then b0 lost");
}

/// A branch the daemon's watcher failed (its directory removed under
/// `grove serve`) is known failed at the next open: commands and a new
/// `grove serve` run degraded without `--degraded`, and the rebuild runs
/// as printed.
#[test]
fn a_branch_failed_while_served_stays_failed_after_a_restart() {
    let setup = Setup::init("raif6", 4);
    let image = setup.import("disk", 17);
    let served = Served::start(&setup, &[]);
    std::fs::remove_dir_all(setup.branch(1)).unwrap();
    wait_for_health(&setup, 1, "failed", &served);
    served.stop();

    assert_eq!(setup.health(&[]), ["ok", "failed", "ok", "ok"]);
    let output = setup.run(&["list"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("branch b1 (") && stderr.contains(") failed"),
        "{stderr}"
    );
    let printed = printed_rebuild(&stderr);
    assert_eq!(
        printed,
        ["rebuild", "--branch", "b1", "--to", "DIR"],
        "{stderr}"
    );
    Served::start(&setup, &[]).stop();
    setup.assert_volume(&[], "disk", &image, "b1 failed while served");

    let new_dir = setup.path("b1-new");
    let mut args: Vec<&str> = printed.iter().map(String::as_str).collect();
    args[4] = new_dir.to_str().unwrap();
    setup.ok(&args);
    assert_eq!(setup.health(&[]), ["ok", "ok", "ok", "ok"]);
}

/// Asserts `output` failed with exactly one line on stderr, a grove error;
/// returns it.
fn one_error_line(output: &Output, what: &str) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(1), "{what}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{what}: not one line: {stderr}");
    assert!(stderr.starts_with("grove: error: "), "{what}: {stderr}");
    stderr
}

/// The ways the open of a pool, a server or a mount can run into a branch
/// it did not record: each as (flags, command) run with GROVE_LOG=info,
/// so that a log line before the error would show.
fn opening_commands(setup: &Setup) -> Vec<Vec<String>> {
    let mut commands = vec![vec!["info".to_string()], vec!["serve".to_string()]];
    if fuse_possible() {
        let mountpoint = setup.path("mnt");
        std::fs::create_dir_all(&mountpoint).unwrap();
        let at = mountpoint.display().to_string();
        commands.push(vec!["mount".into(), at.clone()]);
        commands.push(vec!["mount".into(), "--foreground".into(), at.clone()]);
        commands.push(vec!["serve".into(), "--mount".into(), at]);
    }
    commands
}

fn grove_logged(setup: &Setup, args: &[String]) -> Output {
    Command::new(GROVE)
        .arg("--pool")
        .arg(setup.pool())
        .args(args)
        .env("GROVE_LOG", "info")
        .output()
        .unwrap()
}

/// Damages a branch directory.
type BreakBranch = fn(&Path);

/// Issue 35: a branch missing (directory, data file or identity gone)
/// refuses every open, `grove serve` and `grove mount` included, in one
/// line that names it and suggests --degraded; once run with --degraded,
/// the pool knows the branch failed.
#[test]
fn a_missing_branch_is_refused_in_one_line_that_suggests_degraded() {
    let breaks: [(&str, BreakBranch); 3] = [
        ("data file gone", |d| {
            std::fs::remove_file(d.join("grove.branch")).unwrap()
        }),
        ("directory gone", |d| std::fs::remove_dir_all(d).unwrap()),
        ("identity gone", |d| {
            std::fs::remove_file(d.join("grove-branch.toml")).unwrap()
        }),
    ];
    for (what, break_branch) in breaks {
        let setup = Setup::init("raif5", 3);
        let image = setup.import("disk", 13);
        break_branch(&setup.branch(1));
        for args in opening_commands(&setup) {
            let context = format!("{what}: grove {args:?}");
            let line = one_error_line(&grove_logged(&setup, &args), &context);
            assert!(line.contains("branch b1 ("), "{context}: {line}");
            assert!(line.contains("open with --degraded"), "{context}: {line}");
            assert_eq!(
                printed_rebuild(&line),
                ["rebuild", "--branch", "b1", "--to", "DIR"],
                "{context}: {line}"
            );
        }
        setup.assert_volume(&["--degraded"], "disk", &image, what);
        // Run degraded once, the pool recorded the branch as failed.
        assert_eq!(setup.health(&[]), ["ok", "failed", "ok"], "{what}");
        setup.assert_volume(&[], "disk", &image, what);
    }
}

/// Issue 35: past what the level survives, the open of a pool, a server
/// or a mount is refused in one line that names every branch lost and
/// does not suggest --degraded, which could not help.
#[test]
fn past_what_the_level_survives_one_line_names_every_lost_branch() {
    let setup = Setup::init("raif5", 3);
    std::fs::remove_dir_all(setup.branch(1)).unwrap();
    std::fs::remove_dir_all(setup.branch(2)).unwrap();
    for mut args in opening_commands(&setup) {
        for degraded in [false, true] {
            if degraded {
                args.insert(0, "--degraded".into());
            }
            let context = format!("two lost: grove {args:?}");
            let line = one_error_line(&grove_logged(&setup, &args), &context);
            assert!(line.contains("cannot run without 2"), "{context}: {line}");
            assert!(
                line.contains("branch b1 (") && line.contains("branch b2 ("),
                "{context}: {line}"
            );
            assert!(!line.contains("--degraded"), "{context}: {line}");
        }
    }
}

/// A rebuild cut short where it leaves the pool (grove.toml naming the
/// new directory, whose identity says rebuilding) is known to the pool:
/// commands run degraded without --degraded, and the same rebuild command
/// runs again as it was.
#[test]
fn a_rebuild_cut_short_runs_again_without_degraded() {
    let setup = Setup::init("raif5", 3);
    let image = setup.import("disk", 23);
    setup.ok(&["branch", "fail", "b2"]);
    // What `grove rebuild --branch b2 --to b2-new` has done before its
    // device work: the new directory claimed, grove.toml pointed at it.
    let new_dir = setup.path("b2-new");
    std::fs::create_dir(&new_dir).unwrap();
    let identity = std::fs::read_to_string(setup.branch(2).join("grove-branch.toml")).unwrap();
    let identity = identity
        .lines()
        .map(|line| match line.split_once(" = ") {
            Some(("state", _)) => "state = \"rebuilding\"".to_string(),
            Some(("sequence", _)) => "sequence = 0".to_string(),
            _ => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert!(identity.contains("rebuilding"), "{identity}");
    std::fs::write(new_dir.join("grove-branch.toml"), identity).unwrap();
    let config = setup.pool().join("grove.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    let old = format!("\"{}\"", setup.branch(2).display());
    assert!(text.contains(&old), "{text}");
    std::fs::write(
        &config,
        text.replace(&old, &format!("\"{}\"", new_dir.display())),
    )
    .unwrap();

    assert_eq!(setup.health(&[]), ["ok", "ok", "failed"]);
    setup.assert_volume(&[], "disk", &image, "rebuild cut short");
    let out = setup.ok(&[
        "rebuild",
        "--branch",
        "b2",
        "--to",
        new_dir.to_str().unwrap(),
    ]);
    assert!(out.contains("rebuilt branch b2"), "{out}");
    assert_eq!(setup.health(&[]), ["ok", "ok", "ok"]);
    std::fs::remove_dir_all(setup.branch(0)).unwrap();
    setup.assert_volume(&["--degraded"], "disk", &image, "rebuilt, then b0 lost");
}

/// The role a README sentence gives a branch file, by the word before it.
const FILE_ROLES: [(&str, &str); 5] = [
    ("grove-branch.toml", "identity"),
    ("grove.branch", "data"),
    ("grove.branch-journal", "journal"),
    ("grove.branch-sums", "checksum"),
    ("grove.branch-shape", "shape"),
];

/// Issue 35: the README's section on pools over several disks names the
/// files of a branch directory as they are: each one a new pool's branch
/// holds (or, suffixed .N, one growth adds), and where a sentence says
/// what a file is (the words just before its name), that is what it holds.
#[test]
fn the_readme_says_what_each_branch_file_holds() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let start = readme.find("## Pools over several disks").unwrap();
    let section = &readme[start..];
    let section = &section[..section[2..].find("\n## ").map_or(section.len(), |i| i + 2)];
    let setup = Setup::init("raif5", 3);
    let held: Vec<String> = std::fs::read_dir(setup.branch(0))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let pieces: Vec<&str> = section.split('`').collect();
    let mut named = 0;
    // Odd pieces are quoted; the plain text before each is the one before.
    for i in (1..pieces.len()).step_by(2) {
        let name = pieces[i];
        if !(name.starts_with("grove.branch") || name.starts_with("grove-branch")) {
            continue;
        }
        named += 1;
        let base = name.strip_suffix(".N").unwrap_or(name);
        if base == name {
            assert!(
                held.iter().any(|h| h == name),
                "README names {name}; a branch holds {held:?}"
            );
        }
        let (_, role) = FILE_ROLES
            .iter()
            .find(|(file, _)| *file == base)
            .unwrap_or_else(|| panic!("README names {name}, which no branch holds"));
        let before: Vec<char> = pieces[i - 1].replace('\n', " ").chars().collect();
        let before: String = before[before.len().saturating_sub(24)..].iter().collect();
        let said = FILE_ROLES
            .iter()
            .filter_map(|(_, r)| before.rfind(r).map(|at| (at, *r)))
            .max();
        if let Some((_, said)) = said {
            assert_eq!(
                said, *role,
                "README calls {name} the {said} file: ...{before}`{name}`"
            );
        }
    }
    assert!(named >= 5, "the README names {named} branch files");
}

#[test]
fn init_refuses_bad_layouts_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let grove = |args: &[&str]| {
        Command::new(GROVE)
            .arg("--pool")
            .arg(dir.path().join("pool"))
            .args(args)
            .output()
            .unwrap()
    };
    let b = |i: usize| dir.path().join(format!("b{i}")).display().to_string();
    let refusals: [(Vec<String>, &str); 4] = [
        (
            vec![
                "--branch".into(),
                b(0),
                "--branch".into(),
                b(1),
                "--level".into(),
                "raif6".into(),
            ],
            "raif6",
        ),
        (
            vec![
                "--branch".into(),
                b(0),
                "--branch".into(),
                b(1),
                "--level".into(),
                "raif9".into(),
            ],
            "raif9",
        ),
        (
            vec!["--branch".into(), b(0), "--branch".into(), b(0)],
            "twice",
        ),
        (
            vec![
                "--branch".into(),
                b(0),
                "--branch".into(),
                b(1),
                "--stripe-unit".into(),
                "5000".into(),
            ],
            "multiple of the block size",
        ),
    ];
    for (args, expected) in refusals {
        let mut full = vec!["init"];
        full.extend(args.iter().map(String::as_str));
        let output = grove(&full);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{full:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{full:?}: {stderr}");
        assert!(stderr.contains(expected), "{full:?}: {stderr}");
        assert!(!dir.path().join("pool").exists(), "{full:?} made a pool");
    }
    std::fs::create_dir_all(b(1)).unwrap();
    std::fs::write(dir.path().join("b1/stuff"), b"x").unwrap();
    let output = grove(&["init", "--branch", &b(0), "--branch", &b(1)]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("not empty"), "{stderr}");
    assert!(!dir.path().join("b0/grove.branch").exists());
    // A pool kept in one file has no branches to rebuild or scrub.
    let output = grove(&["init"]);
    assert!(output.status.success());
    let output = grove(&["scrub"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("keeps its store in one file"), "{stderr}");
    let info: serde_json::Value =
        serde_json::from_slice(&grove(&["info", "--json"]).stdout).unwrap();
    assert!(info.get("branches").is_none(), "{info}");
}

/// The NBD tests' volume: 64 KiB slots written whole by qemu-io.
const VOLUME_BYTES: u64 = 32 << 20;
const SLOT_BYTES: u64 = 64 << 10;
/// How long the watcher may take to fail a branch whose directory went.
const WATCH_TIMEOUT_MS: u64 = 15_000;

/// `grove serve` on a setup's pool, stopped cleanly by [`Served::stop`].
struct Served {
    child: Reaped,
    log: PathBuf,
}

impl Served {
    fn start(setup: &Setup, flags: &[&str]) -> Served {
        let stdout = setup.path("serve.out");
        let log = setup.path("serve.log");
        let child = Command::new(GROVE)
            .arg("--pool")
            .arg(setup.pool())
            .args(flags)
            .arg("serve")
            .env("GROVE_LOG", "info")
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut served = Served {
            child: Reaped(child),
            log,
        };
        let started = Instant::now();
        while !std::fs::read_to_string(&stdout)
            .unwrap()
            .contains("Stop with Ctrl-C")
        {
            if let Some(status) = served.child.0.try_wait().unwrap() {
                panic!("grove serve exited with {status}: {}", served.log());
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "grove serve did not start: {}",
                served.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        served
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn stop(mut self) -> String {
        let pid = self.child.0.id().to_string();
        assert!(Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success());
        let status = self.child.0.wait().unwrap();
        assert!(status.success(), "grove serve: {status}: {}", self.log());
        self.log()
    }
}

fn nbd_uri(setup: &Setup) -> String {
    format!(
        "nbd+unix:///disk?socket={}",
        setup.pool().join("nbd.sock").display()
    )
}

/// The writes of one batch: (slot, pattern byte), applied to `model`.
fn batch(round: u64, count: u64, model: &mut [u8]) -> Vec<String> {
    batch_from(0, round, count, model)
}

/// `batch` over the slots from `first_slot` on.
fn batch_from(first_slot: u64, round: u64, count: u64, model: &mut [u8]) -> Vec<String> {
    let slots = VOLUME_BYTES / SLOT_BYTES - first_slot;
    (0..count)
        .map(|i| {
            let slot = first_slot + (i * 7919 + round * 131) % slots;
            let pattern = ((round * 37 + i) % 250 + 1) as u8;
            let at = (slot * SLOT_BYTES) as usize;
            model[at..at + SLOT_BYTES as usize].fill(pattern);
            format!("write -P {pattern} {} {SLOT_BYTES}", slot * SLOT_BYTES)
        })
        .collect()
}

/// Bytes at the start of the NBD tests' volume that fio writes and
/// verifies itself; the model's batches write after them.
const FIO_BYTES: u64 = 12 << 20;

/// fio through NBD over the first FIO_BYTES of the volume: random 64 KiB
/// writes, each block once with a crc32c header, then read back and
/// verified; with `verify_only`, only read back and verified (the same
/// seed gives the same blocks). Paced, so that a branch removed 150 ms in
/// goes in the middle of the writes.
fn fio(setup: &Setup, verify_only: bool) -> Command {
    let mut command = Command::new("fio");
    command
        .args(["--name=branch-loss", "--ioengine=nbd"])
        .arg(format!("--uri={}", nbd_uri(setup)))
        .args(["--rw=randwrite", "--bs=64k", "--iodepth=8", "--randseed=27"])
        .arg("--rate=24m")
        .arg(format!("--size={FIO_BYTES}"))
        .args(["--verify=crc32c", "--verify_fatal=1", "--do_verify=1"]);
    if verify_only {
        command.arg("--verify_only");
    }
    command
}

fn assert_fio_ok(output: &Output, what: &str) {
    assert!(
        output.status.success(),
        "fio, {what}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn qemu_io(setup: &Setup, commands: &[String]) -> Command {
    let mut command = Command::new("qemu-io");
    command.args(["-f", "raw"]);
    for c in commands {
        command.args(["-c", c]);
    }
    command.arg(nbd_uri(setup));
    command
}

/// Every slot read back through NBD with the pattern the model says.
fn verify_over_nbd(setup: &Setup, model: &[u8], what: &str) {
    verify_model_over_nbd(setup, model, 0, what)
}

/// `verify_over_nbd` of the slots from `first_slot` on.
fn verify_model_over_nbd(setup: &Setup, model: &[u8], first_slot: u64, what: &str) {
    let reads: Vec<String> = model
        .chunks(SLOT_BYTES as usize)
        .enumerate()
        .skip(first_slot as usize)
        .map(|(slot, bytes)| {
            format!(
                "read -P {} {} {SLOT_BYTES}",
                bytes[0],
                slot as u64 * SLOT_BYTES
            )
        })
        .collect();
    let output = qemu_io(setup, &reads).output().unwrap();
    assert_qemu_io_ok(&output, what);
}

/// Waits until branch `index` shows `health` in the daemon's report.
fn wait_for_health(setup: &Setup, index: usize, health: &str, served: &Served) {
    let started = Instant::now();
    loop {
        if setup.health(&[])[index] == health {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_millis(WATCH_TIMEOUT_MS),
            "branch b{index} never became {health}: {}",
            served.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A served pool loses a branch directory (`rm -rf`) while fio writes
/// through NBD (and verifies what it wrote): the watcher fails it, writes
/// go on, fio's blocks verify again and the model's every other byte reads
/// back;
/// for raif5 a rebuild through the control socket while qemu-io writes,
/// then another branch lost and every byte still there.
fn branch_lost_under_nbd_writes(level: &str, branches: usize, rebuild_online: bool) {
    if !have("qemu-io") || !have("fio") {
        return;
    }
    let setup = Setup::init(level, branches);
    setup.ok(&["create", "disk", "--size", &VOLUME_BYTES.to_string()]);
    let mut model = vec![0u8; VOLUME_BYTES as usize];
    let served = Served::start(&setup, &[]);

    let fio_slots = FIO_BYTES / SLOT_BYTES;
    let mut writer = fio(&setup, false);
    let writer = std::thread::spawn(move || writer.output());
    std::thread::sleep(Duration::from_millis(150));
    std::fs::remove_dir_all(setup.branch(1)).unwrap();
    let output = writer.join().unwrap().unwrap();
    assert_fio_ok(&output, "writes while the branch went");
    wait_for_health(&setup, 1, "failed", &served);
    let info = setup.ok(&["info"]);
    assert!(info.contains("DEGRADED"), "{info}");

    let second = batch_from(fio_slots, 2, 256, &mut model);
    assert_qemu_io_ok(
        &qemu_io(&setup, &second).output().unwrap(),
        "degraded writes",
    );
    verify_model_over_nbd(&setup, &model, fio_slots, &format!("{level} degraded"));
    assert_fio_ok(&fio(&setup, true).output().unwrap(), "degraded, verified");

    if rebuild_online {
        let third = batch_from(fio_slots, 3, 512, &mut model);
        let mut writer = qemu_io(&setup, &third);
        let writer = std::thread::spawn(move || writer.output());
        let new_dir = setup.path("b1-new");
        let out = setup.ok(&[
            "rebuild",
            "--branch",
            "b1",
            "--to",
            new_dir.to_str().unwrap(),
        ]);
        assert!(out.contains("rebuilt branch b1"), "{out}");
        assert_qemu_io_ok(
            &writer.join().unwrap().unwrap(),
            "writes during the rebuild",
        );
        assert_eq!(setup.health(&[]), vec!["ok"; branches]);
        verify_model_over_nbd(
            &setup,
            &model,
            fio_slots,
            &format!("{level} rebuilt online"),
        );
        assert_fio_ok(&fio(&setup, true).output().unwrap(), "rebuilt, verified");
    }
    let log = served.stop();
    assert!(
        log.contains("branch b1") && log.contains("degraded"),
        "the daemon's log does not say the branch failed: {log}"
    );
    if rebuild_online {
        // The rebuilt branch carries its share: lose another one.
        std::fs::remove_dir_all(setup.branch(2)).unwrap();
    }
    // Offline and degraded: fio's blocks verify once more through a
    // second server, and the model's bytes are exported and compared.
    let served = Served::start(&setup, &["--degraded"]);
    assert_fio_ok(&fio(&setup, true).output().unwrap(), "reopened, verified");
    served.stop();
    let out = setup.path("final.img");
    setup.ok(&["--degraded", "export", "disk", out.to_str().unwrap()]);
    let back = std::fs::read(&out).unwrap();
    let skip = FIO_BYTES as usize;
    let first_bad = back[skip..]
        .iter()
        .zip(&model[skip..])
        .position(|(a, b)| a != b);
    assert!(
        first_bad.is_none(),
        "{level}: differs at {first_bad:?} past fio's bytes"
    );
}

#[test]
fn raif1_branch_lost_under_nbd_writes() {
    branch_lost_under_nbd_writes("raif1", 3, false);
}

#[test]
fn raif5_branch_lost_under_nbd_writes_then_rebuilt_online() {
    branch_lost_under_nbd_writes("raif5", 3, true);
}

#[test]
fn raif6_branch_lost_under_nbd_writes() {
    branch_lost_under_nbd_writes("raif6", 4, false);
}

#[test]
fn raif10_branch_lost_under_nbd_writes() {
    branch_lost_under_nbd_writes("raif10", 4, false);
}

/// `grove mount` over a pool with branches: a branch directory removed
/// while files are written is failed by the mount's watcher, writes go on,
/// and every byte reads back through the mount and after it.
#[test]
fn a_mounted_pool_loses_a_branch_and_goes_on() {
    use std::os::unix::fs::FileExt;
    if !rustix::process::geteuid().is_root() || !Path::new("/dev/fuse").exists() {
        eprintln!("SKIP: needs root and /dev/fuse");
        return;
    }
    let setup = Setup::init("raif5", 3);
    setup.ok(&["create", "disk", "--size", "8M"]);
    let mountpoint = setup.path("mnt");
    std::fs::create_dir(&mountpoint).unwrap();
    let child = Command::new(GROVE)
        .arg("--pool")
        .arg(setup.pool())
        .args(["mount", "--foreground"])
        .arg(&mountpoint)
        .env("GROVE_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(setup.path("mount.log")).unwrap())
        .spawn()
        .unwrap();
    let mut child = Reaped(child);
    let file = mountpoint.join("disk");
    let started = Instant::now();
    while !file.exists() {
        assert!(child.0.try_wait().unwrap().is_none(), "grove mount exited");
        assert!(started.elapsed() < Duration::from_secs(20), "no mount");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut model = pattern(8 << 20, 31);
    let disk = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    disk.write_all_at(&model[..4 << 20], 0).unwrap();
    std::fs::remove_dir_all(setup.branch(2)).unwrap();
    let started = Instant::now();
    while setup.health(&[])[2] != "failed" {
        assert!(
            started.elapsed() < Duration::from_millis(WATCH_TIMEOUT_MS),
            "the mount's watcher did not fail b2"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    model[5 << 20..6 << 20].fill(0x77);
    disk.write_all_at(&model[4 << 20..], 4 << 20).unwrap();
    disk.sync_all().unwrap();
    drop(disk);
    assert_eq!(
        std::fs::read(&file).unwrap(),
        model,
        "read through the mount"
    );
    let status = Command::new("umount").arg(&mountpoint).status().unwrap();
    assert!(status.success());
    assert!(child.0.wait().unwrap().success());
    let log = std::fs::read_to_string(setup.path("mount.log")).unwrap();
    assert!(
        log.contains("branch b2") && log.contains("degraded"),
        "{log}"
    );
    setup.assert_volume(&["--degraded"], "disk", &model, "after the mount");
}

/// A served RAIF5 pool over three branches grows by a fourth while
/// qemu-io writes through NBD: new space lies on the new branch, a
/// restripe through the control socket spreads the old space while
/// qemu-io writes, every byte reads back, and then the new branch can be
/// lost with every byte still there.
#[test]
fn a_served_pool_grows_by_a_branch_and_restripes_under_nbd_writes() {
    if !have("qemu-io") {
        return;
    }
    let setup = Setup::init("raif5", 3);
    setup.ok(&["create", "disk", "--size", &VOLUME_BYTES.to_string()]);
    let mut model = vec![0u8; VOLUME_BYTES as usize];
    let served = Served::start(&setup, &[]);
    let first = batch(1, 96, &mut model);
    assert_qemu_io_ok(&qemu_io(&setup, &first).output().unwrap(), "first writes");

    let second = batch(2, 256, &mut model);
    let mut writer = qemu_io(&setup, &second);
    let writer = std::thread::spawn(move || writer.output());
    let new_branch = setup.branch(3);
    let out = setup.ok(&["branch", "add", new_branch.to_str().unwrap()]);
    assert!(
        out.contains("added b3") && out.contains("4 branches"),
        "{out}"
    );
    assert!(out.contains("grove branch restripe"), "{out}");
    assert_qemu_io_ok(&writer.join().unwrap().unwrap(), "writes during the add");
    let third = batch(3, 512, &mut model);
    assert_qemu_io_ok(
        &qemu_io(&setup, &third).output().unwrap(),
        "writes after the add",
    );
    let info = setup.info(&[]);
    let segments = info["branches"]["segments"].as_array().unwrap().clone();
    assert_eq!(segments.len(), 2, "{info}");
    assert_eq!(segments[1]["branches"], 4, "{info}");
    let grown = std::fs::metadata(new_branch.join("grove.branch.1")).unwrap();
    assert!(grown.len() > 0, "the store did not grow onto b3: {info}");
    assert_eq!(
        setup.health(&[]),
        vec!["ok"; 4],
        "every branch is in service"
    );
    assert!(setup.ok(&["info"]).contains("grove branch restripe"));
    verify_over_nbd(&setup, &model, "after the add");

    let fourth = batch(4, 384, &mut model);
    let mut writer = qemu_io(&setup, &fourth);
    let writer = std::thread::spawn(move || writer.output());
    let out = setup.ok(&["branch", "restripe"]);
    assert!(out.contains("restriped 1 segment"), "{out}");
    assert_qemu_io_ok(
        &writer.join().unwrap().unwrap(),
        "writes during the restripe",
    );
    let info = setup.info(&[]);
    let segments = info["branches"]["segments"].as_array().unwrap();
    assert!(segments.iter().all(|s| s["branches"] == 4), "{info}");
    assert!(
        !setup.branch(0).join("grove.branch").exists(),
        "the narrow files went"
    );
    let out = setup.ok(&["branch", "restripe"]);
    assert!(out.contains("nothing to restripe"), "{out}");
    assert_eq!(
        setup.health(&[]),
        vec!["ok"; 4],
        "every branch is in service"
    );
    verify_over_nbd(&setup, &model, "after the restripe");
    served.stop();

    setup.ok(&["check"]);
    // The new branch carries its share of everything now.
    std::fs::remove_dir_all(setup.branch(3)).unwrap();
    let out = setup.path("grown.img");
    setup.ok(&["--degraded", "export", "disk", out.to_str().unwrap()]);
    let back = std::fs::read(&out).unwrap();
    let first_bad = back.iter().zip(&model).position(|(a, b)| a != b);
    assert!(first_bad.is_none(), "without b3: differs at {first_bad:?}");
}

#[test]
fn branch_add_refuses_in_one_line() {
    let setup = Setup::init("raif10", 4);
    let refused = setup.path("b4");
    let refused = refused.to_str().unwrap();
    let error = setup.fails(&["branch", "add", refused]);
    assert!(error.contains("raif10 over 5 branches"), "{error}");
    assert_eq!(
        setup.info(&[])["branches"]["branches"]
            .as_array()
            .unwrap()
            .len(),
        4
    );
    let toml = std::fs::read_to_string(setup.pool().join("grove.toml")).unwrap();
    assert!(
        // The path, not "b4": a random pool id may hold those two letters.
        !toml.contains(refused) && !toml.contains("label = \"b4\""),
        "grove.toml kept the refused branch: {toml}"
    );
    let busy = setup.path("busy");
    std::fs::create_dir_all(&busy).unwrap();
    std::fs::write(busy.join("stuff"), b"x").unwrap();
    let error = setup.fails(&["branch", "add", busy.to_str().unwrap()]);
    assert!(error.contains("not empty"), "{error}");
    let error = setup.fails(&["branch", "add", setup.branch(1).to_str().unwrap()]);
    assert!(error.contains("already branch b1"), "{error}");
    // A pair grows RAIF10, and the restripe spreads what was there.
    let data = setup.import("v", 5);
    let (a, b) = (setup.path("b4"), setup.path("b5"));
    let out = setup.ok(&[
        "branch",
        "add",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--restripe",
    ]);
    assert!(
        out.contains("6 branches") && out.contains("restriped 1 segment"),
        "{out}"
    );
    setup.assert_volume(&[], "v", &data, "raif10 grown by a pair");
}

/// The room a branch pool can grow into is its branches' (each one's
/// share of its file system, times a stripe's data units), not the pool
/// directory's: here all share one file system, so RAIF5 over three has
/// 2/3 of its free space and over four 3/4, and the add raises it.
#[test]
fn adding_a_branch_raises_the_room_the_pool_can_grow_into() {
    let setup = Setup::init("raif5", 3);
    let room = |setup: &Setup| {
        setup.info(&[])["space"]["host_available_bytes"]
            .as_u64()
            .unwrap() as f64
    };
    let statvfs = rustix::fs::statvfs(setup.dir.path()).unwrap();
    let free = (statvfs.f_bavail * statvfs.f_frsize) as f64;
    let before = room(&setup);
    assert!(
        (before / free - 2.0 / 3.0).abs() < 0.05,
        "raif5 over 3: {before} of {free} free"
    );
    setup.ok(&["branch", "add", setup.branch(3).to_str().unwrap()]);
    let after = room(&setup);
    assert!(after > before * 1.05, "{before} then {after}");
}

/// `grove branch restripe` killed with SIGKILL part way: `grove info`
/// says a restripe is unfinished, the pool reads every byte, and the next
/// `grove branch restripe` finishes it.
#[test]
fn a_restripe_killed_part_way_resumes_where_it_was() {
    for attempt in 0..12u64 {
        let setup = Setup::init("raif5", 3);
        let data = setup.import("v", 9);
        setup.ok(&["branch", "add", setup.branch(3).to_str().unwrap()]);
        let child = Command::new(GROVE)
            .arg("--pool")
            .arg(setup.pool())
            .args(["branch", "restripe"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut child = Reaped(child);
        std::thread::sleep(Duration::from_millis(40 + attempt * 25));
        child.0.kill().unwrap();
        child.0.wait().unwrap();
        let info = setup.info(&[]);
        let cut = info["branches"]["restripe_done_bytes"].as_u64();
        let Some(done) = cut.filter(|&done| done > 0) else {
            continue; // Killed before a batch was copied, or after the end.
        };
        assert!(setup
            .ok(&["info"])
            .contains("restripe           unfinished"));
        setup.assert_volume(&[], "v", &data, "with the restripe cut short");
        let out = setup.ok(&["branch", "restripe"]);
        assert!(out.contains("restriped 1 segment"), "{out}");
        let info = setup.info(&[]);
        assert!(info["branches"]["restripe_done_bytes"].is_null(), "{info}");
        let segments = info["branches"]["segments"].as_array().unwrap();
        assert!(segments.iter().all(|s| s["branches"] == 4), "{info}");
        setup.assert_volume(&[], "v", &data, "after the resumed restripe");
        setup.ok(&["check"]);
        eprintln!("restripe killed after {done} bytes (attempt {attempt}), resumed");
        return;
    }
    panic!("no kill landed inside a restripe in 12 attempts");
}
