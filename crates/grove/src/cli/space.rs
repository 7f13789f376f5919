//! The space settings' flags (`grove init`, `grove space set`) and
//! `grove space`'s subcommands.

use clap::{Args, Subcommand};

/// The space settings as flags; an absent flag leaves the setting as it
/// is (for `init`: the default).
#[derive(Debug, Default, Args)]
pub struct SpaceArgs {
    /// Largest the capacity may grow to by auto-extension ("none": the host's free space less the reserve)
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    pub max_capacity: Option<String>,
    /// Grow the capacity by steps when use passes --extend-at: on or off [default: on]
    #[arg(long, value_name = "on|off")]
    pub auto_extend: Option<String>,
    /// Use, as a percentage of the capacity, at which it grows by a step [default: 80%]
    #[arg(long, value_name = "PERCENT")]
    pub extend_at: Option<String>,
    /// How much each step adds: a percentage of the capacity (at least 64M), or a size [default: 20%]
    #[arg(long, value_name = "PERCENT|SIZE")]
    pub extend_step: Option<String>,
    /// Host free space the capacity never grows into: a size or a percentage of the host file system [default: 1G]
    #[arg(long, value_name = "SIZE|PERCENT")]
    pub host_reserve: Option<String>,
    /// Use, as a percentage of the ceiling, past which a warning is logged and the hook runs [default: 80%]
    #[arg(long, value_name = "PERCENT")]
    pub warn: Option<String>,
    /// Use, as a percentage of the ceiling, past which snapshots are pruned [default: 90%]
    #[arg(long, value_name = "PERCENT")]
    pub prune: Option<String>,
    /// Command run by `sh -c` when the level changes, with GROVE_SPACE_* in its environment ("" for none)
    #[arg(long, value_name = "COMMAND", allow_hyphen_values = true)]
    pub hook: Option<String>,
    /// Seconds the hook may run before it is killed [default: 10]
    #[arg(long, value_name = "SECONDS")]
    pub hook_timeout: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum SpaceCommand {
    /// Change the pool's space settings (and raise its capacity)
    #[command(
        after_help = "Examples:\n  grove space set --max-capacity 200G --warn 75% --prune 90%\n  \
                            grove space set --capacity 50G\n  \
                            grove space set --hook '/usr/local/bin/page-me' --hook-timeout 5\n  \
                            grove space set --auto-extend off"
    )]
    Set {
        /// Raise the capacity now to SIZE (it never shrinks)
        #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
        capacity: Option<String>,
        #[command(flatten)]
        settings: Box<SpaceArgs>,
    },
    /// Show the space settings, the levels and where the pool stands
    Show {
        /// Print them as a JSON object
        #[arg(long)]
        json: bool,
    },
}
