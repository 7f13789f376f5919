//! The command line: every command, argument and flag, with its help text.
//!
//! Sizes and offsets are taken as text and parsed by `size::parse_size` in
//! the commands, so a bad size gets grove's one line naming the argument
//! (a usage error, exit 2, as clap's own are). Every size, offset and length
//! allows a leading '-' (`allow_hyphen_values`): clap would otherwise read
//! `--size -5G` as an unknown flag and print a multi-line usage error,
//! where parse_size refuses it in one line.

pub mod archive;
pub mod raif;
pub mod serve;
pub mod space;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// The environment variable that names the pool when --pool is not given.
pub const POOL_ENV: &str = "GROVE_POOL";
/// Where the pool is when neither --pool nor $GROVE_POOL says.
pub const POOL_DIR_DEFAULT: &str = "./grove-pool";

const EXAMPLES: &str = "\
Examples:
  grove init --block-size 4K                  create a pool in ./grove-pool
  grove create disk --size 10G                a 10 GiB thin volume
  grove import disk2 disk.img                 copy a raw image in, holes stay holes
  grove snapshot disk disk@monday             read-only snapshot, instant at any size
  grove clone disk@monday scratch             writable copy of the snapshot
  echo hello | grove write scratch --offset 1M
  grove read scratch --offset 1M --length 6
  grove --pool /srv/pool list --json";

#[derive(Debug, Parser)]
#[command(
    name = "grove",
    version,
    about = "Thin block volumes with recursive snapshots, in user space",
    long_about = "grove keeps thin block volumes in a pool directory. Any volume can have \
                  read-only snapshots and writable clones, of any depth, and any of them can \
                  be removed. Sizes take K, M, G and T suffixes (powers of 1024).",
    after_help = EXAMPLES
)]
pub struct Cli {
    /// Pool directory: holds grove.toml and the store; or rados://CEPHPOOL/NAME, a pool
    /// whose store is in RADOS objects [default: $GROVE_POOL, else ./grove-pool]
    #[arg(long, global = true, value_name = "DIR")]
    pub pool: Option<PathBuf>,

    /// Open a pool over branch directories even with branches missing,
    /// stale or half rebuilt, running without them (refused past what its
    /// level survives)
    #[arg(long, global = true)]
    pub degraded: bool,

    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The pool directory: --pool, else $GROVE_POOL, else ./grove-pool. An
    /// empty $GROVE_POOL counts as unset, as shells make clearing it easy.
    pub fn pool_dir(&self) -> PathBuf {
        self.pool
            .clone()
            .or_else(|| {
                std::env::var_os(POOL_ENV)
                    .filter(|dir| !dir.is_empty())
                    .map(PathBuf::from)
            })
            .unwrap_or_else(|| PathBuf::from(POOL_DIR_DEFAULT))
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// RAIF: a file system striped, mirrored or parity-protected over branch directories
    Raif {
        #[command(subcommand)]
        command: raif::RaifCommand,
    },
    /// Create a pool (an error if one exists)
    ///
    /// With --branch DIR (given several times) the store is laid out over
    /// one file in each branch directory, striped, mirrored or with parity
    /// (--level; by default raif1 over two branches, raif5 over more).
    ///
    /// The pool starts with a capacity (--capacity, default 1G) that
    /// auto-extension grows by steps when use passes --extend-at, up to
    /// --max-capacity or the host's free space less --host-reserve. Past
    /// --warn a warning is logged and the hook runs; past --prune snapshots
    /// are pruned; at the ceiling writes fail with ENOSPC and snapshots are
    /// refused. The settings live in grove.toml's [space] table; `grove
    /// space set` changes them later.
    #[command(
        after_help = "Examples:\n  grove --pool /srv/pool init --block-size 16K --capacity 100G\n  \
                      grove init --capacity 10G --max-capacity 200G --warn 75%\n  \
                      grove init --capacity 50G --auto-extend off\n  \
                      grove init --branch /disk1/grove --branch /disk2/grove --branch /disk3/grove --level raif5"
    )]
    Init {
        /// Block size: 1K, 2K, 4K, 8K, 16K, 32K or 64K. Larger blocks mean less
        /// metadata; smaller ones waste less on small writes after a snapshot
        #[arg(
            long,
            value_name = "SIZE",
            default_value = "4K",
            allow_hyphen_values = true
        )]
        block_size: String,
        /// Capacity to start with; auto-extension grows it [default: 1G, or --max-capacity if smaller]
        #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
        capacity: Option<String>,
        #[command(flatten)]
        space: space::SpaceArgs,
        /// A branch directory (empty or missing) to lay the store over; give
        /// one per disk. Without it the store is one file in the pool directory
        #[arg(long = "branch", value_name = "DIR")]
        branches: Vec<PathBuf>,
        /// With --branch: raif0 (striping), raif1 (mirrors), raif5 (parity),
        /// raif6 (two parities) or raif10 [default: raif0 over 1 branch,
        /// raif1 over 2, raif5 over more]
        #[arg(long, value_name = "LEVEL", requires = "branches")]
        level: Option<String>,
        /// With --branch: the bytes each branch holds of a stripe, a multiple
        /// of the block size [default: the block size]
        #[arg(
            long,
            value_name = "SIZE",
            requires = "branches",
            allow_hyphen_values = true
        )]
        stripe_unit: Option<String>,
    },

    /// Refill a branch of a pool over branch directories into a new directory
    #[command(
        long_about = "Refill branch LABEL of a pool over branch directories into DIR (empty or \
                      missing), from the other branches, reading back what it writes. grove.toml \
                      names DIR for the branch from then on. Works on a pool held by `grove \
                      serve` or `grove mount` while clients do I/O. A branch that is ok is \
                      rebuilt only with --force.",
        after_help = "Example:\n  grove rebuild --branch b1 --to /disk4/grove"
    )]
    Rebuild {
        /// The branch's label (`grove info` lists them)
        #[arg(long, value_name = "LABEL")]
        branch: String,
        /// The replacement directory: empty or missing
        #[arg(long, value_name = "DIR")]
        to: PathBuf,
        /// Rebuild even a branch that is ok
        #[arg(long)]
        force: bool,
    },

    /// Read every stripe of a pool over branch directories and check it
    #[command(
        long_about = "Read every stripe of a pool over branch directories from every branch and \
                      check mirrors and parity against each other and against each unit's \
                      checksum (the checksum decides which copy is right, not a vote). With \
                      --repair, write what is wrong again from what is right. Exits 1 if \
                      errors remain.",
        after_help = "Example:\n  grove scrub --repair"
    )]
    Scrub {
        #[arg(long)]
        repair: bool,
        #[arg(long)]
        json: bool,
    },

    /// The branches of a pool over branch directories
    Branch {
        #[command(subcommand)]
        command: BranchCommand,
    },

    /// The archive tier: snapshots kept for years in object storage, expired by deleting whole packs
    Archive {
        #[command(subcommand)]
        command: archive::ArchiveCommand,
    },

    /// Space levels and auto-extension: change them, or show where the pool stands
    Space {
        #[command(subcommand)]
        command: space::SpaceCommand,
    },

    /// Create a new empty thin volume
    #[command(after_help = "Example:\n  grove create disk --size 10G")]
    Create {
        /// Name of the new volume
        name: String,
        /// Size of the volume: a multiple of 512 bytes, such as 10G or 512M.
        /// It uses no space until written
        #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
        size: String,
    },

    /// Take a read-only snapshot of a volume or snapshot
    #[command(
        long_about = "Take a read-only snapshot of a volume or snapshot, in O(1). With --auto, \
                      take the snapshot a volume's retention policy has due now (for cron): \
                      named VOLUME@auto-YYYYMMDD-HHMMSS (UTC) and ranked at the highest level \
                      due, or none if nothing is due; without a VOLUME, every volume with a \
                      policy.",
        after_help = "Examples:\n  grove snapshot disk disk@monday\n  grove snapshot --auto disk\n  \
                      */15 * * * *  grove --pool /srv/pool snapshot --auto && grove --pool /srv/pool prune"
    )]
    Snapshot {
        /// Volume or snapshot to take it of (with --auto: the volume, or none for all)
        #[arg(required_unless_present = "auto")]
        source: Option<String>,
        /// Name of the new snapshot (not with --auto)
        #[arg(required_unless_present = "auto", conflicts_with = "auto")]
        name: Option<String>,
        /// Take what the retention policy has due, named and ranked by it
        #[arg(long)]
        auto: bool,
        /// With --auto: the time to act at, as YYYY-MM-DDTHH:MM[:SS] (UTC) or
        /// @UNIXSECONDS, instead of now (for scripts and tests)
        #[arg(long, requires = "auto", value_name = "TIME")]
        now: Option<String>,
    },

    /// Make a writable clone of a volume or snapshot
    #[command(after_help = "Example:\n  grove clone disk@monday scratch")]
    Clone {
        /// Volume or snapshot to clone
        source: String,
        /// Name of the new clone
        name: String,
    },

    /// List volumes, snapshots and clones with their space
    #[command(
        long_about = "List volumes, snapshots and clones, as ZFS users know the columns. \
                      REFERENCED is the data a volume maps; UNIQUE is the part only it \
                      reaches, exactly what removing it alone would free; WRITTEN is the \
                      data written since its last snapshot (for a snapshot, what its source \
                      wrote since the snapshot before it). All three are exact when shown."
    )]
    List {
        /// Print a JSON array of volumes instead of a table
        #[arg(long)]
        json: bool,
    },

    /// Show the family tree of volumes, snapshots and clones
    Tree,

    /// Remove a volume, snapshot or clone (its snapshots and clones stay)
    #[command(
        long_about = "Remove a volume, snapshot or clone, of any depth: its snapshots and \
                      clones keep every byte and show under its parent. Removing takes no \
                      time whatever the size; the space it alone held is given back by \
                      the reclaimer, at once here (or in the background of a running \
                      `grove serve`). A volume with an NBD client connected is refused \
                      unless --force.",
        after_help = "Examples:\n  grove rm disk@monday\n  grove rm --recursive disk"
    )]
    Rm {
        /// Volume to remove
        name: String,
        /// Also remove every snapshot and clone taken from it, at any depth
        #[arg(long, short = 'r')]
        recursive: bool,
        /// Remove it even while an NBD client or FUSE file has it open;
        /// their next request fails
        #[arg(long)]
        force: bool,
    },
    /// Reset a writable volume to a snapshot, instantly
    #[command(
        long_about = "Reset a writable volume to the contents and size of SNAPSHOT, in O(1). \
                      Named alone, SNAPSHOT must be a read-only snapshot, and the volume it \
                      was taken from is reset; if that volume was removed or is itself a \
                      snapshot, name the volume to reset. Resetting a volume to the contents \
                      of a writable volume or clone always takes both names. What the \
                      volume held since is given back like a removed volume's space; other \
                      snapshots are not touched. A volume with an NBD client connected is \
                      refused unless --force.",
        after_help = "Examples:\n  grove rollback disk@monday\n  grove rollback scratch disk    \
                      reset disk to the contents of the clone scratch"
    )]
    Rollback {
        /// Snapshot to copy (or, with VOLUME, any volume)
        snapshot: String,
        /// Writable volume to reset [default: the volume SNAPSHOT was taken from]
        volume: Option<String>,
        /// Reset it even while an NBD client or FUSE file has it open: what
        /// the client cached no longer matches the volume
        #[arg(long)]
        force: bool,
    },
    /// List the extents where volume B differs from volume A
    #[command(
        long_about = "List the byte ranges where volume B differs from volume A: data (B \
                      maps new data there) or zero (B reads zeros where A may have had \
                      data). Shared parts are skipped unread, so the cost follows what \
                      changed, not the volume size. A may also be a removed snapshot of \
                      B's line, among the newest 16 removed of its volume: grove keeps \
                      their birth generation as a bookmark.",
        after_help = "Example:\n  grove diff disk@monday disk@tuesday --json"
    )]
    Diff {
        /// The older volume or snapshot (or a removed snapshot)
        a: String,
        /// The newer volume or snapshot
        b: String,
        /// Print a JSON object with the extents instead of a table
        #[arg(long)]
        json: bool,
    },
    /// Write a snapshot, or what changed since a base, as a replication stream
    #[command(
        long_about = "Write SNAPSHOT as a replication stream: to standard output, a file \
                      (-o) or object storage (--to s3://BUCKET/PREFIX/NAME or file:///DIR/NAME). \
                      Without a base the stream is full; with --from BASE (an earlier snapshot \
                      of the same line, or a removed one kept as a bookmark) it carries only \
                      what changed, found from the trees without reading unchanged data. \
                      --from BASE.. (or -I BASE) sends every snapshot between BASE and \
                      SNAPSHOT, each its own section. Zeros and holes travel as records, never \
                      as bytes. Every record is checksummed and each snapshot ends with a \
                      digest of its whole content, which `grove receive` checks. \
                      --cursor TARGET sends from where target TARGET's cursor points (a \
                      bookmark that rm and retention keep) and moves it to SNAPSHOT once the \
                      stream is written. --resume TOKEN sends what an interrupted receive \
                      lacks.",
        after_help = "Examples:\n  grove send disk@monday | grove --pool /srv/b receive disk@monday\n  \
                      grove send disk@tuesday --from disk@monday -o tue.stream\n  \
                      grove send disk@friday -I disk@monday --cursor offsite | ssh host grove receive disk@friday\n  \
                      grove send --resume grove1-... | grove --pool /srv/b receive disk@friday"
    )]
    Send {
        /// Snapshot to send (not needed with --resume)
        #[arg(required_unless_present = "resume")]
        snapshot: Option<String>,
        /// Send only what changed since BASE (a snapshot or bookmark); BASE.. sends every snapshot between
        #[arg(long, value_name = "BASE", conflicts_with_all = ["range_from", "resume"])]
        from: Option<String>,
        /// Send every snapshot between BASE and SNAPSHOT (same as --from BASE..)
        #[arg(short = 'I', value_name = "BASE", conflicts_with = "resume")]
        range_from: Option<String>,
        /// Send from replication target TARGET's cursor (full if it has none) and move the cursor to SNAPSHOT
        #[arg(long, value_name = "TARGET", conflicts_with = "resume")]
        cursor: Option<String>,
        /// Write the stream to FILE instead of standard output
        #[arg(
            short = 'o',
            long = "output",
            value_name = "FILE",
            conflicts_with = "to"
        )]
        output: Option<PathBuf>,
        /// Store the stream as objects at URL (s3://BUCKET/PREFIX/NAME or file:///DIR/NAME); resumes an interrupted upload
        #[arg(long, value_name = "URL")]
        to: Option<String>,
        /// Send what the interrupted receive that printed TOKEN lacks
        #[arg(long, value_name = "TOKEN")]
        resume: Option<String>,
    },
    /// Make snapshot NAME from a replication stream
    #[command(
        long_about = "Read a stream made by `grove send` from FILE, standard input (- or \
                      nothing) or object storage (--from URL) and make snapshot NAME from it. \
                      An incremental stream's base is found by its GUID, whatever it is called \
                      here. Every record is checked as it arrives and the snapshot appears only \
                      once its content digest matches; a damaged stream leaves nothing \
                      visible. An interrupted receive keeps what it received (durably, with its \
                      progress) and prints a resume token for `grove send --resume`. A range \
                      stream's earlier snapshots are named after the sender's, under NAME's \
                      prefix (receiving vm@1.. as backup@5 makes backup@2, backup@3, ...). \
                      Works on a pool held by `grove serve` or `grove mount` too.",
        after_help = "Examples:\n  grove send disk@monday | grove --pool /srv/b receive disk@monday\n  \
                      grove receive disk@tuesday tue.stream\n  grove receive --status disk@tuesday\n  \
                      grove receive --abort disk@tuesday"
    )]
    Receive {
        /// Name of the snapshot to make
        name: String,
        /// Stream file; - or nothing for standard input
        #[arg(conflicts_with_all = ["from", "abort", "status"])]
        file: Option<PathBuf>,
        /// Read the stream from objects at URL (s3://BUCKET/PREFIX/NAME or file:///DIR/NAME)
        #[arg(long, value_name = "URL", conflicts_with_all = ["abort", "status"])]
        from: Option<String>,
        /// Drop the partial receive NAME and what it received
        #[arg(long, conflicts_with = "status")]
        abort: bool,
        /// Print the resume token of the partial receive NAME
        #[arg(long)]
        status: bool,
    },
    /// Print the digest of a volume's content, to compare pools without moving data
    #[command(
        long_about = "Print the content digest of a volume or snapshot: the value a stream's \
                      trailer carries, the same for the same content in any pool, whatever \
                      its block size or where it has holes. Reads what the volume maps.",
        after_help = "Example:\n  grove hash disk@monday; grove --pool /srv/b hash disk@monday"
    )]
    Hash {
        /// Volume or snapshot
        name: String,
    },
    /// Give back the space of removed volumes now
    #[command(
        long_about = "Give back the space removed volumes and rollbacks left behind. \
                      A running `grove serve` does this in the background; this command \
                      runs it now, in bounded batches that resume after a crash. With \
                      --wait it returns once everything is reclaimed (with a progress bar \
                      on a terminal).",
        after_help = "Example:\n  grove gc --wait"
    )]
    Gc {
        /// Wait until nothing is left to reclaim
        #[arg(long)]
        wait: bool,
    },

    /// Grow or shrink a writable volume
    #[command(
        after_help = "Examples:\n  grove resize disk 20G\n  grove resize disk 1G --force    shrink, dropping what lies past 1 GiB"
    )]
    Resize {
        /// Volume to resize
        name: String,
        /// New size, a multiple of 512 bytes
        #[arg(allow_hyphen_values = true)]
        size: String,
        /// Allow shrinking, which drops the data past the new end (refused
        /// without it, saying how much data that is)
        #[arg(long)]
        force: bool,
    },

    /// Give a volume a new name
    #[command(after_help = "Example:\n  grove rename scratch build-cache")]
    Rename {
        /// Volume to rename
        name: String,
        /// Its new name
        new_name: String,
    },

    /// Copy a raw image file into a new volume (zero blocks stay holes)
    #[command(
        long_about = "Copy a raw image file into a new volume sized to the file (rounded up \
                      to a multiple of 512 bytes). Blocks that are all zeros are not written, \
                      so they use no space.",
        after_help = "Example:\n  grove import disk disk.img"
    )]
    Import {
        /// Name of the new volume
        name: String,
        /// Raw image to read
        file: PathBuf,
    },

    /// Write a volume out as a raw image file (holes stay holes)
    #[command(
        long_about = "Write a volume out as a raw image file of the volume's size. FILE is \
                      created; an existing file is only replaced with --force. Only data is \
                      written, so unwritten and zero ranges become holes in a sparse file. \
                      A block device (at least the volume's size), a pipe or /dev/stdout \
                      gets every byte in order, zeros included, without --force.",
        after_help = "Examples:\n  grove export disk@monday monday.img\n  \
                      grove export disk@monday /dev/stdout | gzip > monday.img.gz"
    )]
    Export {
        /// Volume to export
        name: String,
        /// Image file to write (or a block device, pipe or /dev/stdout)
        file: PathBuf,
        /// Replace FILE if it exists
        #[arg(long)]
        force: bool,
    },

    /// Write bytes from a file or standard input into a volume
    #[command(after_help = "Examples:\n  grove write disk boot.bin\n  \
                            printf hello | grove write disk --offset 4K")]
    Write {
        /// Writable volume to write into
        name: String,
        /// Byte offset in the volume to write at (size suffixes allowed)
        #[arg(
            long,
            value_name = "BYTES",
            default_value = "0",
            allow_hyphen_values = true
        )]
        offset: String,
        /// File to read the bytes from; `-` or nothing means standard input
        #[arg(value_name = "FILE|-")]
        file: Option<PathBuf>,
    },

    /// Copy bytes of a volume to standard output
    #[command(after_help = "Example:\n  grove read disk --offset 1M --length 4K | xxd")]
    Read {
        /// Volume to read
        name: String,
        /// Byte offset to start at (size suffixes allowed)
        #[arg(
            long,
            value_name = "BYTES",
            default_value = "0",
            allow_hyphen_values = true
        )]
        offset: String,
        /// Bytes to read (default: up to the end of the volume)
        #[arg(long, value_name = "BYTES", allow_hyphen_values = true)]
        length: Option<String>,
    },

    /// Show the pool's block size, space and volume count
    Info {
        /// Print the pool's information as a JSON object
        #[arg(long)]
        json: bool,
    },

    /// Serve the pool's volumes over NBD until SIGINT or SIGTERM
    ///
    /// Every volume is an export under its own name; snapshots are
    /// read-only. Without --socket or --listen, listens on the unix socket
    /// POOL/nbd.sock. While it runs, the other grove commands (create,
    /// snapshot, clone, rm, resize, rename, list, tree, info, check) work on
    /// the pool through it: a snapshot then holds every write a client had
    /// acknowledged before it began. On SIGINT or SIGTERM the server stops
    /// accepting, finishes the requests in flight, flushes and closes the pool.
    #[command(
        after_help = "Examples:\n  grove serve\n  grove serve --listen 127.0.0.1:10809 --default-export disk\n  \
                            nbdinfo --list 'nbd+unix:///?socket=grove-pool/nbd.sock'"
    )]
    Serve {
        /// Listen on this unix socket [default: POOL/nbd.sock, unless --listen is given]
        #[arg(long, value_name = "PATH")]
        socket: Option<PathBuf>,
        /// Also (or instead) listen on TCP: PORT, or ADDR:PORT. A bare port
        /// binds 127.0.0.1; give 0.0.0.0:PORT to listen on every interface
        #[arg(long, value_name = "ADDR:PORT")]
        listen: Option<String>,
        /// Export every volume read-only
        #[arg(long)]
        read_only: bool,
        /// Export only this volume (repeat for more) [default: every volume]
        #[arg(long = "export", value_name = "NAME")]
        exports: Vec<String>,
        /// The volume a client gets when it asks for the empty export name
        #[arg(long, value_name = "NAME")]
        default_export: Option<String>,
        /// Limits, timeouts, socket permissions and TLS
        #[command(flatten)]
        limits: Box<serve::ServeArgs>,
        /// Also mount the volumes as files here with FUSE, as `grove mount` does
        #[arg(long, value_name = "MOUNTPOINT")]
        mount: Option<PathBuf>,
        /// A pool in RADOS held by another host that is gone or hung: fence
        /// that host (blocklist its Ceph client, so the OSDs refuse its
        /// writes), break its lock, and serve the pool here
        #[arg(long)]
        takeover: bool,
    },

    /// Mount the pool with FUSE: one regular file per volume and snapshot
    ///
    /// MOUNTPOINT/NAME is a file of the volume's size; snapshots are
    /// read-only (mode 0444). A loop device on a file carries ext4 or xfs
    /// (losetup --direct-io=on works). Volumes created, resized or removed
    /// while mounted appear, change and disappear, and the other grove
    /// commands work on the pool through the mount's control socket.
    /// fsync flushes. The mount goes to the background once it is ready;
    /// `umount MOUNTPOINT` or `fusermount3 -u MOUNTPOINT` (or SIGTERM to the
    /// mount process) unmounts, flushes and closes the pool.
    #[command(
        after_help = "Examples:\n  grove mount /mnt/grove\n  losetup --find --show --direct-io=on /mnt/grove/disk\n  \
                            umount /mnt/grove"
    )]
    Mount {
        /// An existing empty directory
        mountpoint: PathBuf,
        /// Stay attached to the terminal and log to stderr until unmounted
        /// or interrupted
        #[arg(long)]
        foreground: bool,
        /// Where the background mount appends its log (by default it is
        /// discarded); GROVE_LOG sets the level, e.g. GROVE_LOG=debug
        #[arg(long, value_name = "FILE")]
        log: Option<PathBuf>,
        /// Mount every volume read-only
        #[arg(long)]
        read_only: bool,
        /// Let users other than the one mounting reach the files (needs
        /// user_allow_other in /etc/fuse.conf for non-root users)
        #[arg(long)]
        allow_other: bool,
    },

    /// Verify all metadata and exit 1 if anything is wrong or space is lost
    ///
    /// Checks both superblocks, the journal, every radix node of every volume
    /// and of the volume table, that every block's share count matches the
    /// entries pointing at it, that births grow up each tree, that the
    /// allocation map agrees with what is in use, and every volume's space
    /// accounting. Errors are damage; warnings are leftovers that put no
    /// data at risk.
    ///
    /// Exit status: 0 when there are no errors and no space is lost (other
    /// warnings, such as a torn spare superblock, still exit 0); 1 on any
    /// error, and also when blocks are leaked (allocated but used by
    /// nothing) or counted with more references than they have, since
    /// that space would never come back (--repair gives it back). With
    /// --repair, the status is that of the check run after the repair.
    /// --json prints every error and warning the text shows, with
    /// leaked_blocks and over_counted_blocks.
    Check {
        /// Fix leaks, allocation-map disagreements, space accounting and
        /// damaged superblock copies, then check again. Never changes what a
        /// volume reads.
        #[arg(long)]
        repair: bool,
        /// Print the report as a JSON object
        #[arg(long)]
        json: bool,
    },

    /// Set and explain retention policies (how many snapshots of each level to keep)
    #[command(
        long_about = "Retention policies, in rank-tree terms (Thresher): a volume keeps its \
                      newest N frequent, hourly, daily, weekly, monthly and yearly snapshots. \
                      A snapshot ranked daily also counts as hourly and frequent, so a higher \
                      rank lives longer; within a rank the newest live longest. `grove serve` \
                      and `grove mount` take and prune snapshots on the policies' schedule; \
                      without them, run `grove snapshot --auto` and `grove prune` from cron. \
                      Policies live in grove.toml under [retention]."
    )]
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },

    /// Rank a snapshot at a retention level, or take its rank away (none)
    #[command(after_help = "Example:\n  grove rank disk@before-upgrade monthly")]
    Rank {
        /// The snapshot
        snapshot: String,
        /// frequent, hourly, daily, weekly, monthly, yearly or none
        level: String,
        /// For a snapshot only the archive has: take over the claim of an
        /// archive writer that is gone
        #[arg(long)]
        take_over: bool,
    },

    /// Hold a snapshot: never pruned, nor removed without --force
    #[command(
        after_help = "Examples:\n  grove hold disk@monday legal\n  grove hold disk@monday restore-test --for 2d"
    )]
    Hold {
        /// The snapshot
        snapshot: String,
        /// A name for the hold (one snapshot may have several)
        tag: String,
        /// A lease: the hold releases itself after this long (30m, 12h, 7d, 2w)
        #[arg(long = "for", value_name = "DURATION")]
        lease: Option<String>,
        /// With --for: the time the lease starts at, instead of now (for scripts and tests)
        #[arg(long, requires = "lease", value_name = "TIME")]
        now: Option<String>,
    },

    /// Release a hold on a snapshot
    Release { snapshot: String, tag: String },

    /// List holds
    Holds {
        /// Print a JSON array
        #[arg(long)]
        json: bool,
    },

    /// Remove the snapshots retention policies no longer keep
    #[command(
        long_about = "Remove every snapshot that its volume's policy no longer keeps, and \
                      release holds whose lease has ended. Held snapshots, the snapshots \
                      replication cursors mark, and snapshots never ranked (taken by hand) \
                      are kept. Removal is O(1) each; the space comes back in the background \
                      (or with `grove gc`).",
        after_help = "Examples:\n  grove prune --dry-run\n  grove prune disk"
    )]
    Prune {
        /// Only these volumes' snapshots (default: every volume with a policy)
        volumes: Vec<String>,
        /// Say what would be removed, and remove nothing
        #[arg(long)]
        dry_run: bool,
        /// The time to judge at, as YYYY-MM-DDTHH:MM[:SS] (UTC) or @UNIXSECONDS
        #[arg(long, value_name = "TIME")]
        now: Option<String>,
        /// Also remove snapshots the archive's policy wants and the archive
        /// has not got yet (by default prune keeps them for `grove archive push`)
        #[arg(long)]
        ignore_archive: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum BranchCommand {
    /// Take a branch out of service (as `mdadm --fail`): no longer read or
    /// written; the pool runs degraded until `grove rebuild` replaces it
    #[command(after_help = "Example:\n  grove branch fail b1")]
    Fail {
        /// The branch's label (`grove info` lists them)
        label: String,
    },
    /// Add branch directories to the pool, online: new space is laid over
    /// every branch, the new ones included; what is stored stays where it
    /// is until `grove branch restripe` (or `--restripe`) spreads it.
    /// RAIF10 grows by pairs
    #[command(after_help = "Examples:\n  grove branch add /mnt/disk5/grove\n  \
                            grove branch add /mnt/disk5/grove --restripe\n  \
                            grove branch add /mnt/disk5/grove /mnt/disk6/grove   (RAIF10: a pair)")]
    Add {
        /// Empty (or missing) directories, each on its own disk in real use
        #[arg(required = true, num_args = 1..)]
        dirs: Vec<PathBuf>,
        /// Then spread what is stored over every branch (as `grove branch restripe`)
        #[arg(long)]
        restripe: bool,
    },
    /// Spread what is stored over fewer branches than the pool has (after
    /// `grove branch add`) over all of them, online and resumable: run it
    /// again after a crash or an interruption and it goes on where it was
    #[command(after_help = "Example:\n  grove branch restripe")]
    Restripe,
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Give a volume a policy: a template, counts, or a template with counts over it
    #[command(
        after_help = "Examples:\n  grove policy set disk --template production\n  \
                            grove policy set db --template production --hourly 48 --daily 14\n  \
                            grove policy set ci --frequent 8 --frequent-period 5m"
    )]
    Set {
        volume: String,
        /// Start from this template (see `grove policy templates`)
        #[arg(long)]
        template: Option<String>,
        #[arg(long, value_name = "N")]
        frequent: Option<u32>,
        #[arg(long, value_name = "N")]
        hourly: Option<u32>,
        #[arg(long, value_name = "N")]
        daily: Option<u32>,
        #[arg(long, value_name = "N")]
        weekly: Option<u32>,
        #[arg(long, value_name = "N")]
        monthly: Option<u32>,
        #[arg(long, value_name = "N")]
        yearly: Option<u32>,
        /// How often a frequent snapshot is due (default 15m)
        #[arg(long, value_name = "DURATION")]
        frequent_period: Option<String>,
        /// Snapshots pruning for space never takes, newest first (default 1)
        #[arg(long, value_name = "N")]
        minimum: Option<u32>,
    },
    /// Take a volume's policy away (its snapshots stay)
    Unset { volume: String },
    /// For each snapshot: its rank, and the rule that keeps it and until when
    Show {
        /// Only these volumes (default: every volume with a policy)
        volumes: Vec<String>,
        /// Print JSON
        #[arg(long)]
        json: bool,
        /// The time to judge at, as YYYY-MM-DDTHH:MM[:SS] (UTC) or @UNIXSECONDS
        #[arg(long, value_name = "TIME")]
        now: Option<String>,
    },
    /// List the templates: built-in and the pool's own
    Templates,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn definitions_are_consistent() {
        Cli::command().debug_assert();
    }
}
