//! Usage errors: a command line grove cannot take as written.
//!
//! They end as every other error does, in one line `grove: error: …`, but
//! with exit code 2 (as clap and most Unix tools use for usage) and a
//! pointer to the command's `--help`. clap's own errors are several lines
//! (the message, a tip, the usage, "For more information…"); they are
//! folded here into that one line. A value grove parses itself, such as a
//! size, is a usage error too when its text cannot be read at all.

use std::fmt;

/// Exit code of a command line that cannot be taken as written.
pub const EXIT_USAGE: u8 = 2;

/// A value on the command line that could not be read, such as a size.
#[derive(Debug)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Whether an error, or any of its causes, is a usage error.
pub fn is_usage_error(error: &anyhow::Error) -> bool {
    error
        .chain()
        .any(|cause| cause.downcast_ref::<UsageError>().is_some())
}

/// The pointer a usage error found past parsing ends with: the `--help`
/// of the command this process was given (`grove policy set`), as
/// `command` (grove's whole command line, from main) parses it.
pub fn help_pointer_for_this_command_line(command: clap::Command) -> String {
    let mut path = vec!["grove".to_string()];
    if let Ok(matches) = command.try_get_matches_from(std::env::args_os()) {
        let mut current = &matches;
        while let Some((name, sub)) = current.subcommand() {
            path.push(name.to_string());
            current = sub;
        }
    }
    format!("(see '{} --help')", path.join(" "))
}

/// clap's error as one line: its message, then which `--help` to read.
pub fn clap_error_line(error: &clap::Error) -> String {
    let rendered = error.render().to_string();
    let message = rendered
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty())
        .unwrap_or("the command line could not be read");
    let message = message.strip_prefix("error: ").unwrap_or(message);
    format!("{message} (see '{} --help')", command_path(&rendered))
}

/// The command a usage error is about ("grove create"), read from the
/// "Usage:" line clap prints: its words up to the first option or argument.
fn command_path(rendered: &str) -> String {
    let usage = rendered
        .lines()
        .find_map(|line| line.trim().strip_prefix("Usage: "));
    let words: Vec<&str> = usage
        .unwrap_or("grove")
        .split_whitespace()
        .take_while(|word| !word.starts_with(['[', '<', '-']))
        .collect();
    if words.is_empty() {
        "grove".to_string()
    } else {
        words.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn line_for(args: &[&str]) -> String {
        let error = crate::cli::Cli::try_parse_from(args).unwrap_err();
        clap_error_line(&error)
    }

    #[test]
    fn clap_errors_become_one_line_naming_the_command_s_help() {
        let line = line_for(&["grove", "create", "disk", "--bogus"]);
        assert!(line.contains("'--bogus'"), "{line}");
        assert!(line.ends_with("(see 'grove create --help')"), "{line}");
        assert!(!line.contains('\n'), "{line}");
        let line = line_for(&["grove", "frobnicate"]);
        assert!(line.contains("'frobnicate'"), "{line}");
        assert!(line.ends_with("(see 'grove --help')"), "{line}");
    }

    #[test]
    fn usage_errors_are_found_under_context() {
        let error = anyhow::Error::new(UsageError("invalid size \"x\"".into()));
        assert!(is_usage_error(&error.context("cannot create disk")));
        assert!(!is_usage_error(&anyhow::anyhow!("the pool is full")));
    }
}
