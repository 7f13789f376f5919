//! `grove raif`'s subcommands: a RAIF file system over branch directories.

use std::path::PathBuf;

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum RaifCommand {
    /// Mount a RAIF file system: each file striped, mirrored or parity-protected
    /// over branch directories by the first rule that matches it
    #[command(
        after_help = "Examples:\n  grove raif mount --config raif.toml /mnt/raif\n  \
                            grove raif mount --level raif5 --stripe-unit 64K /srv/b1 /srv/b2 /srv/b3 /mnt/raif\n  \
                            fusermount3 -u /mnt/raif"
    )]
    Mount {
        /// A TOML file with branches and rules (see docs/DEVELOPMENT.md)
        #[arg(long, value_name = "FILE", conflicts_with_all = ["level", "stripe_unit"])]
        config: Option<PathBuf>,
        /// Without --config: the level of the one default rule
        #[arg(long)]
        level: Option<String>,
        /// Without --config: the stripe unit (a power of two, 512 to 64M)
        #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
        stripe_unit: Option<String>,
        /// Stay attached to the terminal and log to stderr until unmounted
        #[arg(long)]
        foreground: bool,
        /// Where the background mount appends its log (by default it is
        /// discarded); GROVE_LOG sets the level, e.g. GROVE_LOG=debug
        #[arg(long, value_name = "FILE")]
        log: Option<PathBuf>,
        /// Mount even with branch directories missing, if every rule's level
        /// survives their loss: they start failed until `grove raif rebuild`
        /// refills them
        #[arg(long)]
        degraded: bool,
        /// Let other users than the one mounting use the mount (root, or
        /// user_allow_other in /etc/fuse.conf); the kernel checks modes and
        /// owners as on any file system (default_permissions)
        #[arg(long)]
        allow_other: bool,
        /// Without --config: BRANCH_DIR... then the mount point; with it, the mount point
        #[arg(required = true, num_args = 1..)]
        paths: Vec<PathBuf>,
    },
    /// The mount's branches: health, read latency and reads; exit 1 if degraded
    Status {
        mountpoint: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Which rule laid a file out, and where its metadata and units live
    Explain {
        path: PathBuf,
        /// The whole answer as JSON, every stripe's units included
        #[arg(long)]
        json: bool,
    },
    /// Restore redundancy: refill an empty directory that replaces a failed
    /// branch from the other branches, on a mounted RAIF
    #[command(
        after_help = "The mount goes on serving reads meanwhile; requests that change \
                      something wait until the rebuild ends. The branch shows as \
                      rebuilding until every file on it is whole; a rebuild that fails \
                      leaves the mount as it was.\n\nExample (labels as `grove raif status` \
                      shows them; with --level they count from b0 in the order the \
                      directories were given):\n  \
                      grove raif status /mnt/raif\n  \
                      grove raif rebuild --branch b1 --to /srv/new /mnt/raif"
    )]
    Rebuild {
        /// Label of the branch to replace (see `grove raif status`)
        #[arg(long, value_name = "LABEL")]
        branch: String,
        /// Replace a branch that is not failed (its redundancy is lost
        /// until the rebuild ends)
        #[arg(long)]
        force: bool,
        /// The empty replacement directory
        #[arg(long, value_name = "NEWDIR")]
        to: PathBuf,
        mountpoint: PathBuf,
    },
    /// Check that mirrors and parity agree with the data over every file, and
    /// find what a crash left half done (a hard link's record no name points
    /// at, a wrong link count, a component with no sidecar); one line per
    /// problem, exit 1 if any
    Scrub {
        /// Rewrite disagreeing mirrors (from the first copy) and parity (from
        /// the data); remove or correct what a crash left half done
        #[arg(long)]
        repair: bool,
        mountpoint: PathBuf,
    },
}
