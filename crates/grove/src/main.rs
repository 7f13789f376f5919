//! `grove`: the command line over the grove-store engine.
//!
//! Every failure ends the same way: one line `grove: error: <message>` on
//! stderr, with exit code 1, or 2 for a command line that cannot be taken
//! as written (usage.rs).

mod archive_cmd;
mod archive_exports;
mod archive_location;
mod archiving;
mod background;
mod branch_pool;
mod branches;
mod cli;
mod control;
mod control_limits;
mod daemon;
mod dispatch;
mod memory;
mod mount;
mod objects;
mod open;
mod output;
mod progress;
mod rados_pool;
mod raif;
mod reclaimer;
mod replicate;
mod retention;
mod retention_cmd;
mod retention_settings;
mod scheduler;
mod serve;
mod size;
mod space_cmd;
mod space_hook;
mod space_watch;
mod stream;
mod transfer;
mod usage;
mod volumes;
mod worker;

use std::process::ExitCode;

use clap::{CommandFactory, Parser};

/// Exit code of a command that failed (clap uses 2 for usage errors).
const EXIT_FAILURE: u8 = 1;

fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return clap_exit(&error),
    };
    // A test hook: archive commands stall at this point for a test to kill
    // them there (off unless the variable is set).
    grove_archive::hooks::set_stall_point(std::env::var("GROVE_TEST_ARCHIVE_STALL_AT").ok());
    match dispatch::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) if usage::is_usage_error(&error) => {
            let pointer = usage::help_pointer_for_this_command_line(cli::Cli::command());
            eprintln!("grove: error: {} {pointer}", one_line(&error));
            ExitCode::from(usage::EXIT_USAGE)
        }
        Err(error) => {
            eprintln!("grove: error: {}", one_line(&error));
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

/// `--help` and `--version` print as clap lays them out and exit 0; any
/// other parse failure is one error line and exit 2.
fn clap_exit(error: &clap::Error) -> ExitCode {
    if !error.use_stderr() {
        // Help or version: clap prints it to stdout.
        return match error.print() {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::from(EXIT_FAILURE),
        };
    }
    eprintln!("grove: error: {}", usage::clap_error_line(error));
    ExitCode::from(usage::EXIT_USAGE)
}

/// The error and its causes joined with ": " on one line. A cause whose text
/// the message before it already ends with is left out: engine I/O errors
/// carry their io::Error both in their message and as their source.
fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if line.ends_with(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_join_without_repeats() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file");
        let engine = grove_store::Error::io("cannot open x", io);
        let error = anyhow::Error::from(engine).context("cannot import y");
        assert_eq!(
            one_line(&error),
            "cannot import y: cannot open x: No such file"
        );
    }

    #[test]
    fn newlines_become_spaces() {
        let error = anyhow::anyhow!("first\nsecond");
        assert_eq!(one_line(&error), "first second");
    }
}
