//! The space hook: a command (grove.toml's `space.hook`) run by `sh -c`
//! when the pool's space level changes, with the level and figures in its
//! environment. It runs on a thread of its own, one at a time, so it never
//! blocks I/O or the watcher; it is killed past `hook_timeout_secs`, and
//! its failure is logged. Level changes that arrive while the queue is
//! full are logged and not run.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::time::{Duration, Instant};

use grove_store::{SpaceLevel, SpaceStatus};

/// Level changes waiting for the hook; more are dropped (and logged).
const HOOK_QUEUE_MAX: usize = 4;
/// How often a running hook is checked for its end.
const HOOK_POLL_MS: u64 = 20;

/// One run of the hook.
pub struct HookRun {
    pub command: String,
    pub timeout: Duration,
    pub env: Vec<(String, String)>,
}

impl HookRun {
    /// The run for a change from `previous` to `status.level`.
    pub fn for_change(
        command: &str,
        timeout_secs: u64,
        pool_dir: &std::path::Path,
        previous: SpaceLevel,
        status: &SpaceStatus,
    ) -> HookRun {
        let bytes = |value: Option<u64>| value.map_or(String::new(), |b| b.to_string());
        let env = [
            ("GROVE_POOL", pool_dir.display().to_string()),
            ("GROVE_SPACE_LEVEL", status.level.name().to_string()),
            ("GROVE_SPACE_PREVIOUS_LEVEL", previous.name().to_string()),
            ("GROVE_SPACE_USED_BYTES", status.used_bytes.to_string()),
            ("GROVE_SPACE_CAPACITY_BYTES", bytes(status.capacity_bytes)),
            ("GROVE_SPACE_CEILING_BYTES", bytes(status.ceiling_bytes)),
            ("GROVE_SPACE_WARN_BYTES", bytes(status.warn_bytes)),
            ("GROVE_SPACE_PRUNE_BYTES", bytes(status.prune_bytes)),
        ];
        HookRun {
            command: command.to_string(),
            timeout: Duration::from_secs(timeout_secs),
            env: env.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        }
    }
}

/// The thread that runs hooks, one at a time, from a bounded queue. It
/// ends when the runner is dropped, after the hook in progress.
pub struct HookRunner {
    queue: SyncSender<HookRun>,
}

impl HookRunner {
    pub fn start() -> std::io::Result<HookRunner> {
        let (queue, runs) = sync_channel(HOOK_QUEUE_MAX);
        std::thread::Builder::new()
            .name("grove-space-hook".into())
            .spawn(move || serve(runs))?;
        Ok(HookRunner { queue })
    }

    /// Queues a run; never waits.
    pub fn submit(&self, run: HookRun) {
        match self.queue.try_send(run) {
            Ok(()) => {}
            Err(TrySendError::Full(run)) => tracing::warn!(
                "space hook {:?}: {HOOK_QUEUE_MAX} runs already wait; this level change is not reported to it",
                run.command
            ),
            Err(TrySendError::Disconnected(_)) => {
                tracing::error!("space hook: its thread has ended")
            }
        }
    }
}

fn serve(runs: Receiver<HookRun>) {
    for run in runs {
        if let Err(why) = run_one(&run) {
            tracing::warn!("space hook {:?}: {why}", run.command);
        }
    }
}

/// Runs the hook to its end or its timeout; Err says what went wrong.
pub fn run_one(run: &HookRun) -> Result<(), String> {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(&run.command)
        .envs(run.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        // A group of its own, so that a timeout kills what it started too
        // (`sleep` under `sh -c`), not only the shell.
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start it: {e}"))?;
    let deadline = Instant::now() + run.timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => return Err(format!("it failed ({status})")),
            Ok(None) if Instant::now() >= deadline => {
                kill_group(&mut child);
                return Err(format!(
                    "it ran past its {} s timeout and was killed",
                    run.timeout.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(HOOK_POLL_MS)),
            Err(e) => return Err(format!("cannot wait for it: {e}")),
        }
    }
}

/// Kills the hook's process group (its id is the hook's own), then
/// reaps the hook.
fn kill_group(child: &mut Child) {
    let group = rustix::process::Pid::from_raw(child.id() as i32);
    match group {
        Some(group) => {
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
        None => {
            let _ = child.kill();
        }
    }
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(command: &str, timeout_ms: u64) -> Result<(), String> {
        run_one(&HookRun {
            command: command.into(),
            timeout: Duration::from_millis(timeout_ms),
            env: vec![("GROVE_SPACE_LEVEL".into(), "warn".into())],
        })
    }

    #[test]
    fn hooks_see_their_environment_and_fail_or_time_out_cleanly() {
        assert_eq!(run("test \"$GROVE_SPACE_LEVEL\" = warn", 10_000), Ok(()));
        let failed = run("exit 3", 10_000).unwrap_err();
        assert!(
            failed.contains("failed") && failed.contains('3'),
            "{failed}"
        );
        let started = Instant::now();
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let hook = format!("sleep 30 & echo $! > {}; wait", pid_file.display());
        let killed = run(&hook, 500).unwrap_err();
        assert!(killed.contains("killed"), "{killed}");
        assert!(started.elapsed() < Duration::from_secs(10));
        // What the shell started went with it.
        let pid = std::fs::read_to_string(&pid_file).unwrap();
        let alive = || {
            std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()))
                .is_ok_and(|stat| stat.split(' ').nth(2) != Some("Z"))
        };
        let waited = Instant::now();
        while alive() && waited.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            !alive(),
            "a killed hook left its child {} running",
            pid.trim()
        );
    }
}
