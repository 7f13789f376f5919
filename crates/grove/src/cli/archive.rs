//! `grove archive`'s subcommands.

use clap::{Args, Subcommand};

/// Where the archive is: every subcommand takes it.
#[derive(Debug, Args)]
pub struct ArchivePlace {
    /// The archive: file:///DIR, or s3://BUCKET/PREFIX with AWS_* in the environment
    /// [default: grove.toml's archive.location, else file://POOL.archive beside the pool]
    #[arg(long, value_name = "URL")]
    pub to: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum ArchiveCommand {
    /// Copy the snapshots due into the archive, each as the change against the newest archived
    #[command(
        after_help = "A volume's snapshots are due when its policy's archive counts keep them, e.g. in grove.toml:\n  \
        [retention.volumes]\n  vm = { template = \"production\", archive = { daily = 30, weekly = 52, monthly = 24, yearly = 10 } }\n\n\
        Examples:\n  grove archive push                      every volume with archive counts\n  \
        grove archive push vm --snapshot vm@keep  one snapshot taken by hand: kept until released\n  \
        grove archive push --to s3://backups/grove"
    )]
    Push {
        /// The volume [default: every volume whose policy has archive counts]
        volume: Option<String>,
        /// Push this snapshot (taken by hand, or any newer than the newest archived)
        #[arg(long, value_name = "NAME", requires = "volume")]
        snapshot: Option<String>,
        #[command(flatten)]
        place: ArchivePlace,
        /// Largest pack object [default: 16M]
        #[arg(long, value_name = "SIZE")]
        pack_size: Option<String>,
        /// Take over the claim of a writer that is gone
        #[arg(long)]
        take_over: bool,
        /// Print the reports as a JSON array
        #[arg(long)]
        json: bool,
    },
    /// Show each archived snapshot: rank, when it expires, the bytes it alone holds
    List {
        /// The volume [default: every volume archived there]
        volume: Option<String>,
        #[command(flatten)]
        place: ArchivePlace,
        /// Print a JSON array of archives
        #[arg(long)]
        json: bool,
    },
    /// Drop the archived snapshots the policy no longer keeps; delete the packs nothing needs
    #[command(
        after_help = "Examples:\n  grove archive expire --dry-run\n  grove archive expire vm --now 2027-06-01"
    )]
    Expire {
        /// The volume [default: every volume archived there]
        volume: Option<String>,
        #[command(flatten)]
        place: ArchivePlace,
        /// Say what would go, change nothing
        #[arg(long)]
        dry_run: bool,
        /// Judge as of this time (YYYY-MM-DD[THH:MM[:SS]] UTC, or @UNIXSECONDS) [default: now]
        #[arg(long, value_name = "TIME")]
        now: Option<String>,
        /// Take over the claim of a writer that is gone
        #[arg(long)]
        take_over: bool,
        /// Print the reports as a JSON array
        #[arg(long)]
        json: bool,
    },
    /// Make an archived snapshot a snapshot in the pool again, from the archive alone
    #[command(after_help = "Example:\n  grove archive restore vm@2026-11-01 vm-november")]
    Restore {
        /// The archived snapshot
        snapshot: String,
        /// The new snapshot's name in the pool
        name: String,
        /// The volume it was archived from [default: found by the snapshot's name]
        #[arg(long, value_name = "VOLUME")]
        volume: Option<String>,
        #[command(flatten)]
        place: ArchivePlace,
    },
    /// Let the next expiry drop a snapshot pushed by hand (kept until released)
    Release {
        /// The archived snapshot
        snapshot: String,
        /// The volume it was archived from [default: found by the snapshot's name]
        #[arg(long, value_name = "VOLUME")]
        volume: Option<String>,
        #[command(flatten)]
        place: ArchivePlace,
        /// Take over the claim of a writer that is gone
        #[arg(long)]
        take_over: bool,
    },
    /// Check that every archived snapshot can be read; exit 1 naming the ones damage affects
    Check {
        /// The volume [default: every volume archived there]
        volume: Option<String>,
        #[command(flatten)]
        place: ArchivePlace,
        /// Read every block and check its checksum too
        #[arg(long)]
        deep: bool,
        /// Print the reports as a JSON array
        #[arg(long)]
        json: bool,
    },
}
