//! `grove raif`: the RAIF file system over branch directories. `mount`
//! backgrounds itself as `grove mount` does (it starts itself again with
//! --foreground and waits for the ready line); `status` and `explain` ask
//! the running mount through its virtual extended attributes.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;

use anyhow::{anyhow, bail, Context, Result};
use grove_raif::config::Config;
use grove_raif::Level;
use signal_hook::consts::{SIGINT, SIGTERM};

use crate::cli::raif::RaifCommand;
use crate::daemon::{serve_until_unmounted, MountEvent, WhenBusy};

/// Set for the foreground copy a backgrounding mount starts.
const DAEMON_ENV: &str = "GROVE_RAIF_DAEMON";
/// What the foreground copy prints once mounted.
const READY_LINE: &str = "grove-raif-ready";
const ERROR_PREFIX: &str = "grove: error: ";
/// Largest status or explain answer read from the mount.
const XATTR_MAX_BYTES: usize = 1024 * 1024;
/// How often a rebuild or scrub asks the mount how far it got.
const JOB_POLL_MS: u64 = 100;

pub fn run(command: RaifCommand) -> Result<()> {
    match command {
        RaifCommand::Mount {
            config,
            level,
            stripe_unit,
            foreground,
            log,
            degraded,
            allow_other,
            paths,
        } => {
            let args = background_args(config.as_deref(), &level, &stripe_unit, &paths);
            let (config, mountpoint) = load_config(config.as_deref(), level, stripe_unit, paths)?;
            let how = How {
                foreground,
                log: log.as_deref(),
                degraded,
                allow_other,
                args,
            };
            mount(config, &mountpoint, &how)
        }
        RaifCommand::Status { mountpoint, json } => status(&mountpoint, json),
        RaifCommand::Rebuild {
            branch,
            force,
            to,
            mountpoint,
        } => rebuild(&mountpoint, branch, &to, force),
        RaifCommand::Scrub { repair, mountpoint } => scrub(&mountpoint, repair),
        RaifCommand::Explain { path, json } => explain(&path, json),
    }
}

fn load_config(
    file: Option<&Path>,
    level: Option<String>,
    stripe_unit: Option<String>,
    mut paths: Vec<PathBuf>,
) -> Result<(Config, PathBuf)> {
    let mountpoint = paths.pop().ok_or_else(|| anyhow!("no mount point given"))?;
    if let Some(file) = file {
        if !paths.is_empty() {
            bail!("with --config the branches come from the file: give only the mount point");
        }
        return Ok((Config::load(file)?, mountpoint));
    }
    let level: Level = level
        .ok_or_else(|| anyhow!("give --config FILE, or --level and the branch directories"))?
        .parse()
        .map_err(|e: String| anyhow!(e))?;
    let unit = match stripe_unit {
        Some(text) => crate::size::parse_size(&text, "stripe unit")?,
        None => grove_raif::layout::STRIPE_UNIT_DEFAULT_BYTES,
    };
    let paths: Vec<PathBuf> = paths
        .iter()
        .map(|p| std::path::absolute(p).unwrap_or_else(|_| p.clone()))
        .collect();
    Ok((Config::simple(level, unit, &paths)?, mountpoint))
}

/// How `grove raif mount` runs: its flags besides the layout.
struct How<'a> {
    foreground: bool,
    log: Option<&'a Path>,
    degraded: bool,
    allow_other: bool,
    /// The layout arguments again, for the background copy.
    args: Vec<std::ffi::OsString>,
}

/// The layout arguments of `grove raif mount` as the background copy gets
/// them: the same values, with paths made absolute (it works from /) and
/// nothing else touched.
fn background_args(
    config: Option<&Path>,
    level: &Option<String>,
    stripe_unit: &Option<String>,
    paths: &[PathBuf],
) -> Vec<std::ffi::OsString> {
    let absolute = |p: &Path| {
        std::path::absolute(p)
            .unwrap_or_else(|_| p.to_path_buf())
            .into_os_string()
    };
    let mut args: Vec<std::ffi::OsString> = Vec::new();
    if let Some(config) = config {
        args.extend(["--config".into(), absolute(config)]);
    }
    if let Some(level) = level {
        args.extend(["--level".into(), level.into()]);
    }
    if let Some(unit) = stripe_unit {
        args.push(format!("--stripe-unit={unit}").into());
    }
    // After `--`: a path named like a flag stays a path.
    args.push("--".into());
    args.extend(paths.iter().map(|p| absolute(p)));
    args
}

fn mount(config: Config, mountpoint: &Path, how: &How) -> Result<()> {
    grove_fuse::check_mount_possible(mountpoint)?;
    let missing = grove_fuse::raif::check_branches(&config, how.degraded)?;
    let warning = degraded_warning(&config, &missing, mountpoint);
    // Absolute before the background copy leaves the working directory.
    let log = how
        .log
        .map(|p| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()));
    if let Some(log) = &log {
        crate::daemon::open_log(log)?;
    }
    let log = log.as_deref();
    let daemon = std::env::var_os(DAEMON_ENV).is_some();
    if !how.foreground && !daemon {
        start_in_background(how, log, mountpoint)?;
        if let Some(warning) = &warning {
            eprintln!("grove: warning: {warning}");
        }
        return Ok(());
    }
    if daemon {
        let _ = rustix::process::setsid();
        let _ = std::env::set_current_dir("/");
    }
    crate::daemon::init_logging();
    let signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .context("cannot install signal handlers")?;
    let (events, received) = mpsc::channel();
    let ended = events.clone();
    let mount = grove_fuse::raif::mount_raif(
        config,
        mountpoint,
        how.allow_other,
        how.degraded,
        move || {
            let _ = ended.send(MountEvent::Unmounted);
        },
    )
    .with_context(|| format!("cannot mount RAIF on {}", mountpoint.display()))?;
    announce(mountpoint, daemon, log)?;
    if let Some(warning) = &warning {
        // Again after the announcement: a background mount's log starts there.
        tracing::warn!("{warning}");
    }
    let detached = serve_until_unmounted(
        &mount,
        mountpoint,
        signals,
        events,
        &received,
        WhenBusy::Detach,
    )?;
    if !detached {
        mount.join()?;
        tracing::info!("unmounted");
    }
    Ok(())
}

/// What a degraded mount says about its missing branches, if any.
fn degraded_warning(config: &Config, missing: &[usize], mountpoint: &Path) -> Option<String> {
    let labels: Vec<&str> = missing
        .iter()
        .map(|&i| config.branches[i].label.as_str())
        .collect();
    (!labels.is_empty()).then(|| {
        format!(
            "mounted degraded: branch {} missing, failed until `grove raif rebuild --branch LABEL --to NEWDIR {}` refills it",
            labels.join(", "),
            mountpoint.display()
        )
    })
}

fn announce(mountpoint: &Path, daemon: bool, log: Option<&Path>) -> Result<()> {
    if daemon {
        return crate::daemon::announce_and_detach(READY_LINE, log);
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "mounted RAIF on {}; unmount with `fusermount3 -u {0}` or Ctrl-C",
        mountpoint.display()
    )?;
    Ok(())
}

/// Runs this same command again with --foreground, detached, and waits
/// until it is mounted or has failed; its error is reported as it said it.
fn start_in_background(how: &How, log: Option<&Path>, mountpoint: &Path) -> Result<()> {
    let exe = std::env::current_exe().context("cannot find the grove executable")?;
    let mut command = Command::new(exe);
    command.args(["raif", "mount", "--foreground"]);
    if let Some(log) = log {
        command.arg("--log").arg(log);
    }
    if how.degraded {
        command.arg("--degraded");
    }
    if how.allow_other {
        command.arg("--allow-other");
    }
    let mut child = command
        .args(&how.args)
        .env(DAEMON_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start the background grove raif mount")?;
    let stdout = child.stdout.take().context("no stdout")?;
    let ready = BufReader::new(stdout)
        .lines()
        .map_while(|l| l.ok())
        .any(|l| l == READY_LINE);
    if ready {
        println!(
            "mounted RAIF on {} (grove raif mount, pid {}); unmount with `fusermount3 -u {0}`",
            mountpoint.display(),
            child.id()
        );
        return Ok(());
    }
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    let status = child.wait()?;
    bail!("{}", background_error(&stderr, &status.to_string()))
}

/// The error a background mount that failed printed: its `grove: error:`
/// line, else its first line of any kind (a usage error), else its status.
fn background_error(stderr: &str, status: &str) -> String {
    let said = stderr
        .lines()
        .find_map(|l| l.strip_prefix(ERROR_PREFIX))
        .or_else(|| stderr.lines().map(str::trim).find(|l| !l.is_empty()));
    match said {
        Some(message) => message.to_string(),
        None => format!("the background grove raif mount exited with {status} before mounting"),
    }
}

/// A virtual extended attribute of the mount.
fn xattr(path: &Path, name: &str) -> Result<String> {
    let mut buf = vec![0u8; XATTR_MAX_BYTES];
    let len = rustix::fs::getxattr(path, name, &mut buf).map_err(|e| {
        anyhow!(
            "{} is not in a grove raif mount, or the mount does not answer: {e}",
            path.display()
        )
    })?;
    buf.truncate(len);
    Ok(String::from_utf8(buf)?)
}

fn explain(path: &Path, json: bool) -> Result<()> {
    let text = xattr(path, grove_fuse::raif::XATTR_EXPLAIN)?;
    let value: serde_json::Value = serde_json::from_str(&text)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print!("{}", explain_text(&value));
    }
    Ok(())
}

/// `raif explain` for people: one "field  value" line each, then the first
/// stripes' units by branch label.
fn explain_text(v: &serde_json::Value) -> String {
    let field = |key: &str| match &v[key] {
        serde_json::Value::String(text) => text.clone(),
        serde_json::Value::Null => "-".to_string(),
        serde_json::Value::Array(items) => items
            .iter()
            .map(|i| i.as_str().map_or_else(|| i.to_string(), str::to_string))
            .collect::<Vec<_>>()
            .join(", "),
        other => other.to_string(),
    };
    if v["kind"].is_string() {
        return format!(
            "path        {}\nkind        {} (kept on every branch)\n",
            field("path"),
            field("kind")
        );
    }
    let mut out = String::new();
    for (label, key) in [
        ("path", "path"),
        ("level", "level"),
        ("rule", "rule"),
        ("rule now", "rule_now"),
        ("stripe unit", "stripe_unit_bytes"),
        ("size", "size_bytes"),
        ("branches", "branches"),
        ("metadata on", "metadata_on"),
        ("name on", "name_on"),
        ("names", "names"),
    ] {
        out.push_str(&format!(
            "{label:<12}{}
",
            field(key)
        ));
    }
    for stripe in v["stripes"].as_array().into_iter().flatten() {
        let units = |key: &str| serde_json::to_string(&stripe[key]).unwrap_or_default();
        out.push_str(&format!(
            "stripe {} at {}: data {} parity {}\n",
            stripe["stripe"],
            stripe["offset"],
            units("data"),
            units("parity")
        ));
    }
    out
}

/// The mount's state and branches; exit 1 if degraded, with the failed
/// branches and how to refill them said on stdout (a degraded mount is a
/// state to report, not an error of the command).
fn status(mountpoint: &Path, json: bool) -> Result<()> {
    let text = xattr(mountpoint, grove_fuse::raif::XATTR_STATUS)?;
    let value: serde_json::Value = serde_json::from_str(&text)?;
    if json {
        println!("{text}");
    } else {
        println!("state: {}", value["state"].as_str().unwrap_or("?"));
        print_branches(&value);
    }
    if value["state"] != "degraded" {
        return Ok(());
    }
    if !json {
        let failed: Vec<&str> = value["branches"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|b| b["state"] == "failed")
            .filter_map(|b| b["label"].as_str())
            .collect();
        for label in &failed {
            println!(
                "branch {label} failed: `grove raif rebuild --branch {label} --to NEWDIR {}` refills it",
                mountpoint.display()
            );
        }
    }
    std::process::exit(EXIT_DEGRADED);
}

/// `raif status`'s exit code for a degraded mount, as `grove check` exits 1
/// when it finds something wrong.
const EXIT_DEGRADED: i32 = 1;

/// One line per branch: its label (what `rebuild --branch` takes) beside
/// its directory, then its health; a replacement also names the directory
/// of the configuration it stands in for.
fn print_branches(value: &serde_json::Value) {
    println!(
        "{:<8} {:<40} {:<10} {:>10} {:>10}",
        "label", "directory", "state", "latency_us", "reads"
    );
    for b in value["branches"].as_array().into_iter().flatten() {
        let path = b["path"].as_str().unwrap_or("");
        let configured = b["configured_path"].as_str().unwrap_or(path);
        let directory = match configured == path {
            true => path.to_string(),
            false => format!("{path} (replaces {configured})"),
        };
        println!(
            "{:<8} {:<40} {:<10} {:>10} {:>10}",
            b["label"].as_str().unwrap_or(""),
            directory,
            b["state"].as_str().unwrap_or(""),
            b["latency_us"].as_u64().unwrap_or(0),
            b["reads"].as_u64().unwrap_or(0)
        );
    }
}

/// Starts a rebuild or scrub in the mount and follows it with a progress
/// bar until it ends.
fn run_job(
    mountpoint: &Path,
    request: &grove_fuse::raif::Request,
    id: &str,
    what: &str,
) -> Result<grove_fuse::raif::Job> {
    let value = serde_json::to_vec(request)?;
    rustix::fs::setxattr(
        mountpoint,
        grove_fuse::raif::XATTR_CONTROL,
        &value,
        rustix::fs::XattrFlags::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::BUSY => anyhow!(
            "a rebuild or scrub is already running on {}",
            mountpoint.display()
        ),
        e => anyhow!(
            "{} is not a grove raif mount, or the mount does not answer: {e}",
            mountpoint.display()
        ),
    })?;
    let progress = crate::progress::Progress::bytes(what, 0);
    loop {
        std::thread::sleep(std::time::Duration::from_millis(JOB_POLL_MS));
        let status: serde_json::Value =
            serde_json::from_str(&xattr(mountpoint, grove_fuse::raif::XATTR_STATUS)?)?;
        let job = &status["job"];
        if job["id"] != id {
            bail!("the {what} was replaced by another job");
        }
        progress.set_length(job["total_bytes"].as_u64().unwrap_or(0));
        progress.set_position(job["done_bytes"].as_u64().unwrap_or(0));
        if job["finished"] == true {
            let job: grove_fuse::raif::Job = serde_json::from_value(job.clone())?;
            return Ok(job);
        }
    }
}

fn job_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{}-{nanos}", std::process::id())
}

fn print_problems(job: &grove_fuse::raif::Job) {
    for line in &job.lines {
        println!("{line}");
    }
    let more = job.problems.saturating_sub(job.lines.len() as u64);
    if more > 0 {
        println!("... and {more} more (see the mount's log)");
    }
}

fn rebuild(mountpoint: &Path, branch: String, to: &Path, force: bool) -> Result<()> {
    let to = std::path::absolute(to).with_context(|| format!("cannot resolve {}", to.display()))?;
    let id = job_id();
    let request = grove_fuse::raif::Request::Rebuild {
        id: id.clone(),
        branch: branch.clone(),
        to: to.clone(),
        force,
    };
    let job = run_job(mountpoint, &request, &id, "rebuild")?;
    if let Some(error) = job.error {
        bail!("rebuild of branch {branch}: {error}");
    }
    print_problems(&job);
    if job.problems > 0 {
        bail!("rebuild of branch {branch} onto {}: {} problems; the files named above lack redundancy", to.display(), job.problems);
    }
    println!(
        "rebuilt branch {branch} onto {}: {} files, {} bytes",
        to.display(),
        job.files,
        job.done_bytes
    );
    Ok(())
}

fn scrub(mountpoint: &Path, repair: bool) -> Result<()> {
    let id = job_id();
    let request = grove_fuse::raif::Request::Scrub {
        id: id.clone(),
        repair,
    };
    let job = run_job(mountpoint, &request, &id, "scrub")?;
    if let Some(error) = job.error {
        bail!("scrub: {error}");
    }
    print_problems(&job);
    println!(
        "scrubbed {} files, {} bytes: {} mismatches{}",
        job.files,
        job.done_bytes,
        job.problems,
        if repair && job.problems > 0 {
            ", repaired"
        } else {
            ""
        }
    );
    if job.problems > 0 {
        bail!(
            "scrub found {} mismatches on {}",
            job.problems,
            mountpoint.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A background copy that fails before it can log (a usage error from
    /// clap) is reported by its own first line, not only by exit status.
    #[test]
    fn a_background_failure_is_reported_by_what_it_said() {
        let usage =
            "error: unexpected argument '/tmp/x/raif' found\n\nUsage: grove raif mount [OPTIONS]\n";
        assert_eq!(
            background_error(usage, "exit status: 2"),
            "error: unexpected argument '/tmp/x/raif' found"
        );
        let ours = "log noise\ngrove: error: cannot mount RAIF on /m: busy\n";
        assert_eq!(
            background_error(ours, "exit status: 1"),
            "cannot mount RAIF on /m: busy"
        );
        assert!(background_error("", "exit status: 2").contains("exit status: 2"));
    }

    /// The background copy gets the values as given, paths made absolute,
    /// after `--` so that no path is read as a flag.
    #[test]
    fn background_arguments_are_the_given_values() {
        let args = background_args(
            None,
            &Some("raif5".into()),
            &Some("4K".into()),
            &[PathBuf::from("/b0"), PathBuf::from("/mnt")],
        );
        let args: Vec<&str> = args.iter().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(
            args,
            ["--level", "raif5", "--stripe-unit=4K", "--", "/b0", "/mnt"]
        );
    }
}
