//! The control socket: how `grove` commands reach a pool that a running
//! `grove serve` holds open. The daemon listens on `POOL/grove.control`; a
//! command that finds the pool busy sends one request as a JSON line and
//! reads one JSON line back. The engine runs in the daemon, so a snapshot
//! taken this way is crash-consistent with what NBD clients wrote: it holds
//! every write acknowledged before it began.
//!
//! Request, one line: {"command":"snapshot","source":"disk","name":"disk@1"}
//! Reply, one line:   {"ok":<result>} or {"error":{"kind":"NotFound","message":"..."}}
//!
//! A request that fails in any way is answered with an error; one that
//! panics is answered ("internal error while running the ... request"),
//! logged, and its connection closed, while the daemon goes on. A command
//! waits for its reply at most `REPLY_TIMEOUT_MS` (`LONG_REPLY_TIMEOUT_MS`
//! for check and gc --wait).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use grove_send::digest::unhex;
use grove_store::{
    CheckReport, DiffReport, Error, ErrorKind, HoldInfo, Pool, PoolInfo, RemovalSummary,
    RemoveOptions, Shrink, SpaceSettings, SpaceStatus, VolumeInfo, VolumeSummary,
};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::branch_pool::{
    BranchAdmin, BranchReport, RebuildSummary, RestripeSummary, ScrubSummary,
};
use crate::control_limits;
use crate::open::OpenedPool;
pub use crate::reclaimer::GcReport;

/// The control socket's file name inside the pool directory.
pub const CONTROL_SOCKET_NAME: &str = "grove.control";
/// Longest request line the daemon reads; requests are small.
const REQUEST_LINE_MAX_BYTES: u64 = 64 * 1024;
/// Most bytes one `grove read` request through the daemon returns (its
/// reply is twice that in hex, streamed like any reply).
pub const BYTES_PER_REQUEST_MAX: usize = 1 << 20;
/// Most bytes one `grove write` request carries: their hex and the rest of
/// the request must fit REQUEST_LINE_MAX_BYTES.
const WRITE_BYTES_PER_REQUEST_MAX: usize = 16 * 1024;
const _: () = assert!(2 * WRITE_BYTES_PER_REQUEST_MAX + 1024 < REQUEST_LINE_MAX_BYTES as usize);
/// Requests one control connection may send before it is closed.
const REQUESTS_PER_CONNECTION_MAX: usize = 1000;
/// How often stopping checks whether the connections have finished.
const STOP_POLL_MS: u64 = 20;
/// How long a command waits for the daemon's reply before it gives up: a
/// wedged daemon must not hang the command for ever. Generous, as a
/// rollback or removal may wait for the daemon's commits under load.
const REPLY_TIMEOUT_MS: u64 = 10 * 60 * 1000;
/// The same for `check` and `gc --wait`, whose time grows with the pool:
/// a check runs at millions of blocks a second, so a day is far past any
/// pool grove can hold.
const LONG_REPLY_TIMEOUT_MS: u64 = 24 * 60 * 60 * 1000;
/// Debug builds only: the request kind named in this environment variable
/// of the daemon panics in its handler, so that tests can see a panicking
/// request answered and closed while the daemon goes on. `KIND:locked`
/// panics with the engine's state lock held instead.
const PANIC_FOR_TESTS_ENV: &str = "GROVE_TEST_PANIC_CONTROL_REQUEST";

/// `names` in runs whose `remove_snapshots` request each fits one control
/// request line, in order: a prune of thousands of snapshots would
/// otherwise be one request longer than the daemon reads.
pub fn names_per_request(names: &[String]) -> Vec<&[String]> {
    // Room for the request's own fields; each name costs its JSON form and
    // a comma.
    const BUDGET_BYTES: usize = REQUEST_LINE_MAX_BYTES as usize - 256;
    let mut runs = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, name) in names.iter().enumerate() {
        let cost = serde_json::to_string(name).map_or(name.len() + 2, |q| q.len()) + 1;
        if bytes + cost > BUDGET_BYTES && i > start {
            runs.push(&names[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += cost;
    }
    if start < names.len() {
        runs.push(&names[start..]);
    }
    runs
}

/// What `grove list` shows beside the volumes.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ReplicationState {
    pub cursors: Vec<grove_store::CursorInfo>,
    pub partial_receives: Vec<grove_store::PartialReceive>,
}

impl Request {
    /// The request's kind, as on the wire ("snapshot", "check", ...).
    fn kind(&self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v["command"].as_str().map(str::to_string))
            .unwrap_or_else(|| "unknown".into())
    }

    /// How long a client waits for the reply to this request.
    fn reply_timeout(&self) -> Duration {
        let ms = match self {
            Request::Check { .. }
            | Request::Gc { wait: true }
            | Request::Hash { .. }
            | Request::ArchivePush { .. }
            | Request::ArchiveRestore { .. }
            | Request::Rebuild { .. }
            | Request::Scrub { .. }
            | Request::Restripe => LONG_REPLY_TIMEOUT_MS,
            _ => REPLY_TIMEOUT_MS,
        };
        Duration::from_millis(ms)
    }

    /// What the progress bar of a long branch request says, if it has one
    /// (the client polls the daemon's branch report for it).
    fn progress_label(&self) -> Option<String> {
        match self {
            Request::Rebuild { label, .. } => Some(format!("rebuilding {label}")),
            Request::Scrub { .. } => Some("scrubbing".into()),
            Request::Restripe => Some("restriping".into()),
            _ => None,
        }
    }
}

/// `path` made absolute for the daemon, whose working directory is not
/// the client's (as it is if that fails).
fn absolute_path(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

impl Admin for Pool {
    fn dir(&self) -> &Path {
        Pool::dir(self)
    }
    fn create_volume(&self, name: &str, size_bytes: u64) -> grove_store::Result<VolumeInfo> {
        Pool::create_volume(self, name, size_bytes)
    }
    fn snapshot(&self, source: &str, name: &str) -> grove_store::Result<VolumeInfo> {
        Pool::snapshot(self, source, name)
    }
    fn clone_volume(&self, source: &str, name: &str) -> grove_store::Result<VolumeInfo> {
        Pool::clone_volume(self, source, name)
    }
    fn remove(&self, name: &str, recursive: bool, force: bool) -> grove_store::Result<Option<u64>> {
        Pool::remove(self, name, RemoveOptions { recursive, force }).map(Some)
    }
    fn rollback(
        &self,
        snapshot: &str,
        volume: Option<&str>,
        force: bool,
    ) -> grove_store::Result<VolumeInfo> {
        Pool::rollback(self, snapshot, volume, force)
    }
    fn diff(&self, a: &str, b: &str) -> grove_store::Result<DiffReport> {
        Pool::diff(self, a, b)
    }
    fn gc(&self, wait: bool) -> grove_store::Result<GcReport> {
        let freed_bytes = if wait {
            self.reclaim_all(|_| {})?
        } else {
            self.reclaim_batch()?.0
        };
        Ok(GcReport {
            freed_bytes,
            pending_free_bytes: self.pending_free_bytes()?,
        })
    }
    fn resize_volume(
        &self,
        name: &str,
        size_bytes: u64,
        shrink: Shrink,
    ) -> grove_store::Result<VolumeInfo> {
        Pool::resize_volume_with(self, name, size_bytes, shrink)
    }
    fn rename_volume(&self, name: &str, new_name: &str) -> grove_store::Result<VolumeInfo> {
        Pool::rename_volume(self, name, new_name)
    }
    fn read_bytes(&self, name: &str, offset: u64, length: u64) -> grove_store::Result<Vec<u8>> {
        let length = usize::try_from(length.min(BYTES_PER_REQUEST_MAX as u64))
            .expect("bounded by BYTES_PER_REQUEST_MAX");
        let mut bytes = vec![0u8; length];
        self.volume(name)?.read_at(&mut bytes, offset)?;
        Ok(bytes)
    }
    fn write_bytes(&self, name: &str, offset: u64, data: &[u8]) -> grove_store::Result<()> {
        self.volume(name)?.write_at(data, offset)
    }
    fn flush_volume(&self, name: &str) -> grove_store::Result<()> {
        self.volume(name)?.flush()
    }
    fn volumes(&self) -> grove_store::Result<Vec<VolumeInfo>> {
        Pool::volumes(self)
    }
    fn summaries(&self) -> grove_store::Result<Vec<VolumeSummary>> {
        Ok(Pool::volume_summaries(self))
    }
    fn family_summaries(&self, name: &str) -> grove_store::Result<Vec<VolumeSummary>> {
        Pool::family_summaries(self, name)
    }
    fn volume_info(&self, name: &str) -> grove_store::Result<VolumeInfo> {
        Pool::volume_info(self, name)
    }
    fn info(&self) -> grove_store::Result<PoolInfo> {
        Pool::info(self)
    }
    fn check(&self, repair: bool) -> grove_store::Result<CheckReport> {
        Pool::check(self, repair)
    }
    fn replication_state(&self) -> grove_store::Result<ReplicationState> {
        Ok(ReplicationState {
            cursors: self.cursors(),
            partial_receives: self.partial_receives(),
        })
    }
    fn snapshot_ranked(
        &self,
        source: &str,
        name: &str,
        rank: u8,
        created_unix_secs: u64,
    ) -> grove_store::Result<VolumeInfo> {
        Pool::snapshot_ranked(self, source, name, rank, created_unix_secs)
    }
    fn set_rank(&self, snapshot: &str, rank: u8) -> grove_store::Result<()> {
        Pool::set_rank(self, snapshot, rank)
    }
    fn hold(&self, snapshot: &str, tag: &str, until: Option<u64>) -> grove_store::Result<()> {
        Pool::hold(self, snapshot, tag, until)
    }
    fn release(&self, snapshot: &str, tag: &str) -> grove_store::Result<()> {
        Pool::release(self, snapshot, tag)
    }
    fn holds(&self) -> grove_store::Result<Vec<HoldInfo>> {
        Ok(Pool::holds(self))
    }
    fn remove_snapshots(&self, names: &[String]) -> grove_store::Result<RemovalSummary> {
        // Paced by the clients' load: on a pool no client uses (a command
        // that opened it here), at full speed.
        let never_stopping = AtomicBool::new(false);
        crate::reclaimer::remove_snapshots_paced(self, names, &never_stopping)
    }
    fn release_expired_holds(&self, now_unix_secs: u64) -> grove_store::Result<Vec<HoldInfo>> {
        Pool::release_expired_holds(self, now_unix_secs)
    }
    fn space_settings(&self) -> grove_store::Result<SpaceSettings> {
        Ok(Pool::space_settings(self))
    }
    fn set_space(
        &self,
        settings: &SpaceSettings,
        capacity_bytes: Option<u64>,
    ) -> grove_store::Result<SpaceStatus> {
        self.set_space_settings(settings)?;
        if let Some(bytes) = capacity_bytes {
            self.raise_capacity(bytes)?;
        }
        self.watch_space()
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Reply {
    Ok(serde_json::Value),
    Error { kind: ErrorKind, message: String },
}

/// Declares each control-socket operation once, and from that one entry
/// makes the `Request` variant (its wire form: `{"command":
/// "snake_name", field...}`), the daemon's dispatch for it (`execute`) and,
/// for most, the method a command calls, whose client side (on
/// `ControlClient`) sends the request and returns the daemon's reply.
///
/// An operation with a method reads:
///
/// ```text
/// fn rename_volume(&self, name: &str, new_name: &str) -> VolumeInfo  // the method
///     => Rename { name: String, new_name: String }                    // the request
///     => reply(pool.rename_volume(&name, &new_name));                 // the daemon's work
/// ```
///
/// The method returns `grove_store::Result` of the type named (`Result`,
/// anyhow's, in `impl ControlClient`). Each field of the request is made
/// from the method's argument of the same name by `From` (`&str` to
/// `String`, `&[String]` to `Vec<String>`, a number to itself), or, where
/// that does not fit, by the expression after its type: `drop_data: bool =
/// shrink == Shrink::DropData`. The daemon's work sees the fields by name,
/// and `pool` (the engine), `opened` (the pool with its branches) and
/// `stopping` (the daemon's shutdown, for long work).
///
/// The sections say where the methods go (`client_methods!`): `trait Admin`
/// declares that trait (with the methods it has besides, written out in
/// `by_hand`) and implements it for `ControlClient`; `impl BranchAdmin`
/// implements branch_pool.rs's trait (declared there, beside the pool's own
/// implementation); `impl ControlClient` makes replication's methods.
/// `requests` holds those whose client is written out elsewhere, as they
/// are not one request for one call: the streams, `grove read` and `grove
/// write` in pieces, and the holder of a busy pool.
macro_rules! control_operations {
    (
        serve($pool:ident, $opened:ident, $stopping:ident);

        requests {
            $(
                $(#[$request_doc:meta])*
                $request:ident $({ $($request_field:ident: $request_type:ty),* $(,)? })?
                    => $request_serve:expr;
            )*
        }

        $(
            $(#[$section_doc:meta])*
            $section_kind:ident $section:ident {
                $(by_hand { $($by_hand:tt)* })?
                $(
                    $(#[$doc:meta])*
                    fn $method:ident(&self $(, $arg:ident: $arg_type:ty)* $(,)?) -> $return:ty
                        => $variant:ident $({
                            $($field:ident: $field_type:ty $(= $value:expr)?),* $(,)?
                        })?
                        => $serve:expr;
                )*
            }
        )*
    ) => {
        #[derive(Debug, Serialize, Deserialize)]
        #[serde(tag = "command", rename_all = "snake_case")]
        enum Request {
            $( $(#[$request_doc])* $request $({ $($request_field: $request_type),* })?, )*
            $($( $(#[$doc])* $variant $({ $($field: $field_type),* })?, )*)*
        }

        /// Runs one request against the pool and turns the result into a
        /// reply. A long request stops at a safe point once `stopping` is set.
        // A field a request's work does not need (Send's, Receive's here).
        #[allow(unused_variables)]
        fn execute($opened: &OpenedPool, request: Request, $stopping: &AtomicBool) -> Reply {
            let $pool = &$opened.pool;
            match request {
                $( Request::$request $({ $($request_field),* })? => $request_serve, )*
                $($( Request::$variant $({ $($field),* })? => $serve, )*)*
            }
        }

        $(
            client_methods! {
                $section_kind $section [$(#[$section_doc])*] [$($($by_hand)*)?]
                $(
                    [$(#[$doc])*] $method($($arg: $arg_type),*) -> $return
                        = Request::$variant $({
                            $($field: request_field!($field $(= $value)?)),*
                        })?;
                )*
            }
        )*
    };
}

/// Where `control_operations!` puts a section's client methods, each of
/// which sends its request (`ControlClient::call`).
macro_rules! client_methods {
    // The trait is declared here, with the methods written out by hand.
    (
        trait $trait:ident [$($trait_doc:tt)*] [
            $(
                $(#[$by_hand_doc:meta])*
                fn $by_hand:ident(&$this:ident $(, $by_hand_arg:ident: $by_hand_type:ty)* $(,)?)
                    -> $by_hand_return:ty $by_hand_body:block
            )*
        ]
        $([$($doc:tt)*] $method:ident($($arg:ident: $type:ty),*) -> $return:ty = $request:expr;)*
    ) => {
        $($trait_doc)*
        pub trait $trait {
            $(
                $(#[$by_hand_doc])*
                fn $by_hand(&self $(, $by_hand_arg: $by_hand_type)*) -> $by_hand_return;
            )*
            $( $($doc)* fn $method(&self, $($arg: $type),*) -> grove_store::Result<$return>; )*
        }

        impl $trait for ControlClient {
            $(
                fn $by_hand(&$this $(, $by_hand_arg: $by_hand_type)*) -> $by_hand_return
                    $by_hand_body
            )*
            $(
                fn $method(&self, $($arg: $type),*) -> grove_store::Result<$return> {
                    self.call($request)
                }
            )*
        }
    };
    // The client's own methods, for commands whose errors are anyhow's.
    (
        impl ControlClient [$($section_doc:tt)*] []
        $([$($doc:tt)*] $method:ident($($arg:ident: $type:ty),*) -> $return:ty = $request:expr;)*
    ) => {
        impl ControlClient {
            $(
                $($doc)*
                pub fn $method(&self, $($arg: $type),*) -> Result<$return> {
                    self.exchange::<$return>(&$request)?.map_err(Into::into)
                }
            )*
        }
    };
    // A trait declared elsewhere, beside the pool's own implementation.
    (
        impl $trait:ident [$($section_doc:tt)*] []
        $([$($doc:tt)*] $method:ident($($arg:ident: $type:ty),*) -> $return:ty = $request:expr;)*
    ) => {
        impl $trait for ControlClient {
            $(
                $($doc)*
                fn $method(&self, $($arg: $type),*) -> grove_store::Result<$return> {
                    self.call($request)
                }
            )*
        }
    };
}

/// A request's field in a client method (see `control_operations!`): the
/// expression given, or else the argument of the field's name by `From`.
macro_rules! request_field {
    ($argument:ident = $value:expr) => {
        $value
    };
    ($argument:ident) => {
        From::from($argument)
    };
}

control_operations! {
    serve(pool, opened, stopping);

    requests {
        /// Which process holds the pool, so that a refused open can name it.
        Holder => reply(Ok(Holder::this_process()));
        /// `grove read` through the daemon: a piece of at most
        /// BYTES_PER_REQUEST_MAX bytes, answered in hex.
        ReadBytes { name: String, offset: u64, length: u64 } =>
            reply(Admin::read_bytes(pool, &name, offset, length).map(hex::encode));
        /// `grove write` through the daemon: a piece whose hex fits a request
        /// line (WRITE_BYTES_PER_REQUEST_MAX).
        WriteBytes { name: String, offset: u64, hex: String } => reply(
            unhex(&hex)
                .map_err(|e| Error::new(ErrorKind::InvalidArgument, format!("{e:#}")))
                .and_then(|data| Admin::write_bytes(pool, &name, offset, &data)),
        );
        /// A replication stream follows the request line, up to its end; the
        /// reply comes once it is received.
        Receive { name: String } => refuse_stream_on_shared_connection();
        /// Answered with one reply line, then (if ok) the stream, then the
        /// connection closes.
        Send { args: crate::stream::SendArgs } => refuse_stream_on_shared_connection();
    }

    /// What a command can ask of a pool, whether it holds the pool itself or
    /// reaches it through a daemon.
    trait Admin {
        // Not one request for one call: the client's side is written out.
        by_hand {
            fn dir(&self) -> &Path {
                &self.dir
            }
            /// `length` bytes of volume `name` from `offset` (`grove read`).
            fn read_bytes(&self, name: &str, offset: u64, length: u64)
                -> grove_store::Result<Vec<u8>>
            {
                self.read_piece(name, offset, length)
            }
            /// Writes `data` into volume `name` at `offset` (`grove write`).
            fn write_bytes(&self, name: &str, offset: u64, data: &[u8]) -> grove_store::Result<()> {
                self.write_in_pieces(name, offset, data)
            }
        }
        fn create_volume(&self, name: &str, size_bytes: u64) -> VolumeInfo
            => Create { name: String, size_bytes: u64 }
            => reply(pool.create_volume(&name, size_bytes));
        fn snapshot(&self, source: &str, name: &str) -> VolumeInfo
            => Snapshot { source: String, name: String }
            => reply(pool.snapshot(&source, &name));
        fn clone_volume(&self, source: &str, name: &str) -> VolumeInfo
            => Clone { source: String, name: String }
            => reply(pool.clone_volume(&source, &name));
        /// Removes a volume (and its descendants if `recursive`); returns the
        /// bytes the reclaimer gives back, or None where they were not
        /// counted (a snapshot removed by a daemon: `remove_served`).
        fn remove(&self, name: &str, recursive: bool, force: bool) -> Option<u64>
            => Remove { name: String, recursive: bool, force: bool }
            => reply(crate::reclaimer::remove_served(
                pool, &name, RemoveOptions { recursive, force }, stopping));
        /// Resets a volume to a snapshot; one in use needs `force`.
        fn rollback(&self, snapshot: &str, volume: Option<&str>, force: bool) -> VolumeInfo
            => Rollback {
                snapshot: String,
                volume: Option<String> = volume.map(str::to_string),
                force: bool,
            }
            => reply(pool.rollback(&snapshot, volume.as_deref(), force));
        fn diff(&self, a: &str, b: &str) -> DiffReport
            => Diff { a: String, b: String }
            => reply(pool.diff(&a, &b));
        /// Reclaims one batch, or everything with `wait`.
        fn gc(&self, wait: bool) -> GcReport
            => Gc { wait: bool }
            => reply(crate::reclaimer::gc_until_stopped(pool, wait, stopping));
        /// Resizes a writable volume; a smaller size is refused unless
        /// `shrink` says its data past the new end may go (on the wire,
        /// `drop_data`: `grove resize --force`).
        fn resize_volume(&self, name: &str, size_bytes: u64, shrink: Shrink) -> VolumeInfo
            => Resize { name: String, size_bytes: u64, drop_data: bool = shrink == Shrink::DropData }
            => reply(pool.resize_volume_with(&name, size_bytes, shrink_for(drop_data)));
        fn rename_volume(&self, name: &str, new_name: &str) -> VolumeInfo
            => Rename { name: String, new_name: String }
            => reply(pool.rename_volume(&name, &new_name));
        /// Makes the pool's completed writes durable.
        fn flush_volume(&self, name: &str) -> ()
            => FlushVolume { name: String }
            => reply(Admin::flush_volume(pool, &name));
        fn volumes(&self) -> Vec<VolumeInfo>
            => List
            => reply(pool.volumes());
        /// Every volume without the accounting (cheap at any pool size).
        fn summaries(&self) -> Vec<VolumeSummary>
            => Summaries
            => reply(Ok(pool.volume_summaries()));
        /// `name`'s summary, then those of the volumes shown under it: a
        /// family's, without listing the whole pool.
        fn family_summaries(&self, name: &str) -> Vec<VolumeSummary>
            => FamilySummaries { name: String }
            => reply(pool.family_summaries(&name));
        fn volume_info(&self, name: &str) -> VolumeInfo
            => VolumeInfo { name: String }
            => reply(pool.volume_info(&name));
        fn info(&self) -> PoolInfo
            => Info
            => reply(pool.info());
        fn check(&self, repair: bool) -> CheckReport
            => Check { repair: bool }
            => reply(control_limits::check_until_stopped(pool, repair, stopping));
        /// Replication cursors and partial receives, for `grove list`.
        fn replication_state(&self) -> ReplicationState
            => ReplicationState
            => reply(Admin::replication_state(pool));
        /// A snapshot taken with a rank at `created_unix_secs` (retention's).
        fn snapshot_ranked(&self, source: &str, name: &str, rank: u8, created_unix_secs: u64)
            -> VolumeInfo
            => SnapshotRanked { source: String, name: String, rank: u8, created_unix_secs: u64 }
            => reply(pool.snapshot_ranked(&source, &name, rank, created_unix_secs));
        fn set_rank(&self, snapshot: &str, rank: u8) -> ()
            => SetRank { snapshot: String, rank: u8 }
            => reply(pool.set_rank(&snapshot, rank));
        fn hold(&self, snapshot: &str, tag: &str, until: Option<u64>) -> ()
            => Hold { snapshot: String, tag: String, until: Option<u64> }
            => reply(pool.hold(&snapshot, &tag, until));
        fn release(&self, snapshot: &str, tag: &str) -> ()
            => Release { snapshot: String, tag: String }
            => reply(pool.release(&snapshot, &tag));
        fn holds(&self) -> Vec<HoldInfo>
            => Holds
            => reply(Ok(pool.holds()));
        /// Removes many snapshots in batches (pruning), all or none checked
        /// first: unforced, one held or in use refuses the lot.
        fn remove_snapshots(&self, names: &[String]) -> RemovalSummary
            => RemoveSnapshots { names: Vec<String> }
            => reply(crate::reclaimer::remove_snapshots_paced(pool, &names, stopping));
        /// Releases the holds whose lease ended by `now_unix_secs`.
        fn release_expired_holds(&self, now_unix_secs: u64) -> Vec<HoldInfo>
            => ReleaseExpiredHolds { now_unix_secs: u64 }
            => reply(pool.release_expired_holds(now_unix_secs));
        /// The space settings (grove.toml's `[space]`).
        fn space_settings(&self) -> SpaceSettings
            => SpaceSettings
            => reply(Admin::space_settings(pool));
        /// Applies space settings, then raises the capacity if asked; returns
        /// where the pool stands after.
        fn set_space(&self, settings: &SpaceSettings, capacity_bytes: Option<u64>) -> SpaceStatus
            => SetSpace { settings: SpaceSettings = settings.clone(), capacity_bytes: Option<u64> }
            => reply(Admin::set_space(pool, &settings, capacity_bytes));
    }

    // The trait is branch_pool.rs's.
    impl BranchAdmin {
        /// The branches of a pool over branch directories (null for one file).
        fn branch_report(&self) -> Option<BranchReport>
            => Branches
            => reply(opened.branch_report());
        /// `to` is absolute: the daemon's working directory is not the client's.
        fn rebuild_branch(&self, label: &str, to: &Path, force: bool) -> RebuildSummary
            => Rebuild { label: String, to: PathBuf = absolute_path(to), force: bool }
            => reply(with_branches(opened, stopping, |branches, stopped| {
                crate::branch_pool::rebuild(branches, &label, &to, force, &mut |_, _| {}, stopped)
            }));
        fn scrub_branches(&self, repair: bool) -> ScrubSummary
            => Scrub { repair: bool }
            => reply(with_branches(opened, stopping, |branches, stopped| {
                crate::branch_pool::scrub(branches, repair, &mut |_, _| {}, stopped)
            }));
        fn fail_branch(&self, label: &str) -> BranchReport
            => FailBranch { label: String }
            => reply(with_branches(opened, stopping, |branches, _| {
                crate::branch_pool::fail(branches, &label)
            }));
        /// `dirs` are absolute, as for Rebuild.
        fn add_branches(&self, dirs: &[PathBuf]) -> BranchReport
            => AddBranches { dirs: Vec<PathBuf> = dirs.iter().map(|dir| absolute_path(dir)).collect() }
            => reply(with_branches(opened, stopping, |branches, _| {
                crate::branch_pool::add(branches, &dirs)
            }));
        fn restripe_branches(&self) -> RestripeSummary
            => Restripe
            => reply(with_branches(opened, stopping, |branches, stopped| {
                crate::branch_pool::restripe(branches, &mut |_, _| {}, stopped)
            }));
    }

    // Replication's, whose errors are the command's.
    impl ControlClient {
        /// `grove receive --abort`: drops partial receive `name`; the bytes the
        /// reclaimer gives back.
        fn receive_abort(&self, name: &str) -> u64
            => ReceiveAbort { name: String }
            => reply_any(grove_send::abort(pool, &name));
        /// `grove receive --status`: the token that resumes partial receive `name`.
        fn receive_status(&self, name: &str) -> String
            => ReceiveStatus { name: String }
            => reply_any(crate::stream::status(pool, &name));
        /// `grove hash`: the content digest of volume `name`, as hex.
        fn hash(&self, name: &str) -> String
            => Hash { name: String }
            => reply_any(crate::stream::hash(pool, &name));
        /// Which stream `grove send` with `args` makes (for resuming uploads).
        fn stream_fingerprint(&self, args: &crate::stream::SendArgs) -> [u8; 16]
            => StreamFingerprint { args: crate::stream::SendArgs = args.clone() }
            => reply_any(crate::stream::fingerprint(pool, &args));
        /// `grove archive push` while the daemon holds the pool: it pushes.
        fn archive_push(&self, request: &crate::archiving::PushRequest) -> Vec<grove_archive::PushReport>
            => ArchivePush { request: crate::archiving::PushRequest = request.clone() }
            => reply_any(crate::archiving::push_volumes(pool, &request, &mut |_, _, _| {}, &mut |_| Ok(())));
        /// `grove archive restore` while the daemon holds the pool: it
        /// restores, and keeps the snapshot only if it hashes as recorded.
        fn archive_restore(&self, request: &crate::archiving::RestoreRequest) -> crate::archiving::Restored
            => ArchiveRestore { request: crate::archiving::RestoreRequest = request.clone() }
            => reply_any(crate::archiving::restore_snapshot(pool, &request, &mut |_, _| {}));
        /// Where partial receive `name` restarts, if there is one.
        fn restart_point(&self, name: &str) -> Option<grove_send::RestartPoint>
            => RestartPoint { name: String }
            => reply_any(match pool.partial_receive(&name) {
                None => Ok(None),
                Some(_) => grove_send::restart_point(pool, &name).map(Some),
            });
    }
}

/// A streaming request (send, receive) on a connection that serves
/// one-line requests: they need a connection of their own.
fn refuse_stream_on_shared_connection() -> Reply {
    Reply::Error {
        kind: ErrorKind::InvalidArgument,
        message: "send and receive stream on a connection of their own".into(),
    }
}

fn reply<T: Serialize>(result: grove_store::Result<T>) -> Reply {
    match result {
        Ok(value) => Reply::Ok(serde_json::to_value(value).unwrap_or(serde_json::Value::Null)),
        Err(e) => Reply::Error {
            kind: e.kind(),
            message: e.message().to_string(),
        },
    }
}

/// Runs `job` on the pool's branches, with the daemon's stop as the job's
/// "stopped" question; refused for a pool kept in one file.
/// A job the daemon's shutdown stopped says so.
fn with_branches<T>(
    opened: &OpenedPool,
    stopping: &AtomicBool,
    job: impl FnOnce(&crate::open::Branches, &dyn Fn() -> bool) -> grove_store::Result<T>,
) -> grove_store::Result<T> {
    let branches = opened
        .branches
        .as_deref()
        .ok_or_else(|| crate::open::not_a_branch_pool(opened.pool.dir()))?;
    job(branches, &|| stopping.load(Ordering::SeqCst)).map_err(|e| {
        if stopping.load(Ordering::SeqCst) {
            Error::new(
                e.kind(),
                format!(
                    "the daemon is shutting down: {} (run it again once the pool is open again)",
                    e.message()
                ),
            )
        } else {
            e
        }
    })
}

/// The reply to a command-level result (an anyhow error's whole chain).
/// The request's flag as the engine's choice.
fn shrink_for(drop_data: bool) -> Shrink {
    if drop_data {
        Shrink::DropData
    } else {
        Shrink::KeepData
    }
}

fn reply_any<T: Serialize>(result: Result<T>) -> Reply {
    match result {
        Ok(value) => Reply::Ok(serde_json::to_value(value).unwrap_or(serde_json::Value::Null)),
        Err(e) => Reply::Error {
            kind: e
                .downcast_ref::<Error>()
                .map_or(ErrorKind::InvalidArgument, Error::kind),
            message: format!("{e:#}"),
        },
    }
}

/// How long a receiving daemon waits for the next bytes of a stream: a
/// sender behind ssh or a slow disk may pause, but not for ever.
const STREAM_IDLE_TIMEOUT_MS: u64 = 10 * 60 * 1000;

/// Runs a streaming request on its connection: reads a stream for
/// Receive, writes one for Send. Returns false if the connection must close.
fn serve_stream(
    pool: &Pool,
    request: Request,
    reader: &mut BufReader<UnixStream>,
    writer: &mut UnixStream,
) {
    let _ = reader
        .get_ref()
        .set_read_timeout(Some(Duration::from_millis(STREAM_IDLE_TIMEOUT_MS)));
    let _ = writer.set_write_timeout(Some(Duration::from_millis(STREAM_IDLE_TIMEOUT_MS)));
    match request {
        Request::Receive { name } => {
            let outcome = crate::stream::receive_into_pool(pool, &name, &mut *reader);
            if let Err(e) = &outcome {
                tracing::warn!(name = %name, "receive through the control socket failed: {e:#}");
            }
            let _ = writer.write_all(reply_line(&reply_any(outcome)).as_bytes());
        }
        Request::Send { args } => {
            // The stream's first bytes may fail (a bad name): answer that
            // as an error; once the stream flows, a failure can only cut it.
            let mut out = std::io::BufWriter::with_capacity(1 << 20, &mut *writer);
            let started = out.write_all(reply_line(&Reply::Ok(serde_json::Value::Null)).as_bytes());
            if started.is_err() {
                return;
            }
            match crate::stream::send_from_pool(pool, &args, &mut out) {
                Ok(summary) => {
                    let _ = out.flush();
                    tracing::info!("{}", crate::stream::describe_send(&summary));
                }
                Err(e) => tracing::warn!("send through the control socket failed: {e:#}"),
            }
        }
        _ => unreachable!("only send and receive stream"),
    }
}

/// The process holding a pool open: its pid and command line.
#[derive(Debug, Serialize, Deserialize)]
pub struct Holder {
    pub pid: u32,
    pub command: String,
}

impl Holder {
    fn this_process() -> Holder {
        let mut args = std::env::args();
        let program = args
            .next()
            .map(|arg0| {
                Path::new(&arg0)
                    .file_name()
                    .map_or(arg0.clone(), |name| name.to_string_lossy().into_owned())
            })
            .unwrap_or_else(|| "grove".into());
        Holder {
            pid: std::process::id(),
            command: std::iter::once(program)
                .chain(args)
                .collect::<Vec<_>>()
                .join(" "),
        }
    }
}

/// Opens the pool in `dir` for a daemon (`grove serve`, `grove mount`). A
/// pool another process holds is refused with that process named, as its
/// control socket reports it.
pub fn open_pool_exclusive(dir: &Path, degraded: bool) -> Result<OpenedPool> {
    crate::open::open_pool(dir, degraded).map_err(|e| match e.kind() {
        ErrorKind::Busy => {
            let holder = ControlClient::connect(dir)
                .and_then(|client| client.holder().ok())
                .map_or_else(
                    || "another grove process".to_string(),
                    |h| format!("`{}` (pid {})", h.command, h.pid),
                );
            anyhow!("pool {} is already held by {holder}", dir.display())
        }
        _ => e.into(),
    })
}

/// The daemon's side: answers requests on the control socket until stopped.
pub struct ControlServer {
    path: PathBuf,
    stopping: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
    /// The open connections, so that stopping can hang up on idle clients
    /// instead of waiting for them to time out.
    connections: Connections,
}

/// Open connections by number; each handler removes its own when it ends.
type Connections = Arc<std::sync::Mutex<std::collections::HashMap<u64, UnixStream>>>;

impl ControlServer {
    /// Listens on `POOL/grove.control`. The pool is already open (and so
    /// locked) by this process, so a socket file found there is a stale one
    /// from a daemon that died, and is replaced.
    pub fn start(opened: OpenedPool, socket_mode: u32) -> Result<ControlServer> {
        let path = opened.pool.dir().join(CONTROL_SOCKET_NAME);
        let _ = std::fs::remove_file(&path);
        let listener = grove_nbd::bind_unix_socket(&path, socket_mode)
            .with_context(|| format!("cannot listen on control socket {}", path.display()))?;
        let stopping = Arc::new(AtomicBool::new(false));
        let connections = Connections::default();
        let acceptor = {
            let (stopping, connections) = (stopping.clone(), connections.clone());
            std::thread::Builder::new()
                .name("grove-control".into())
                .spawn(move || accept_loop(listener, opened, stopping, connections))?
        };
        tracing::info!(socket = %path.display(), "control socket listening");
        Ok(ControlServer {
            path,
            stopping,
            acceptor: Some(acceptor),
            connections,
        })
    }

    /// Stops accepting and hangs up on idle clients: shutting down only
    /// the reading side lets a request being answered still get its reply.
    /// Returns at once; [`ControlServer::stop`] finishes the job.
    pub fn begin_stop(&self) {
        if self.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        // Wake the blocking accept with a connection of our own.
        let _ = UnixStream::connect(&self.path);
        for stream in self.lock_connections().values() {
            let _ = stream.shutdown(std::net::Shutdown::Read);
        }
    }

    /// Stops: lets requests in progress finish until `deadline`, then
    /// closes both directions of every connection left (a client that does
    /// not read its replies cannot hold the daemon), and removes the socket.
    pub fn stop(mut self, deadline: std::time::Instant) {
        self.begin_stop();
        while !self.lock_connections().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(STOP_POLL_MS));
        }
        let left = self.lock_connections();
        if !left.is_empty() {
            tracing::warn!(
                connections = left.len(),
                "control clients still busy after the grace period; closing them"
            );
        }
        for stream in left.values() {
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
        drop(left);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }

    fn lock_connections(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, UnixStream>> {
        self.connections.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn accept_loop(
    listener: UnixListener,
    opened: OpenedPool,
    stopping: Arc<AtomicBool>,
    connections: Connections,
) {
    // Handlers with the uid of their client.
    let mut handlers: Vec<(JoinHandle<()>, Option<u32>)> = Vec::new();
    let mut next_id = 0u64;
    let owner = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(opened.pool.dir()).map_or(0, |m| m.uid())
    };
    for stream in listener.incoming() {
        if stopping.load(Ordering::SeqCst) {
            break;
        }
        handlers.retain(|(h, _)| !h.is_finished());
        let Ok(mut stream) = stream else { continue };
        let uid = control_limits::peer_uid(&stream);
        let open: Vec<Option<u32>> = handlers.iter().map(|(_, uid)| *uid).collect();
        if let Err(why) = control_limits::admit(uid, owner, &open) {
            tracing::warn!("control connection refused: {why}");
            // A fresh socket's buffer takes one short line without waiting.
            let refusal = Reply::Error {
                kind: ErrorKind::Busy,
                message: why,
            };
            let _ = stream.set_write_timeout(Some(Duration::from_millis(STOP_POLL_MS)));
            let _ = stream.write_all(reply_line(&refusal).as_bytes());
            continue;
        }
        next_id += 1;
        let id = next_id;
        if let Ok(clone) = stream.try_clone() {
            connections
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(id, clone);
        }
        let (opened, connections, stopping) =
            (opened.clone(), connections.clone(), stopping.clone());
        if let Ok(handler) = std::thread::Builder::new()
            .name("grove-control-conn".into())
            .spawn(move || {
                let _registered = Registered { id, connections };
                serve_connection(stream, &opened, &stopping);
            })
        {
            handlers.push((handler, uid));
        }
    }
    for (handler, _) in handlers {
        let _ = handler.join();
    }
}

/// A connection's entry in `Connections`, removed when its handler ends,
/// even by a panic: the clone kept there would otherwise hold the socket
/// open, and the client would wait for a reply until the daemon stopped.
struct Registered {
    id: u64,
    connections: Connections,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.connections
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

fn serve_connection(stream: UnixStream, opened: &OpenedPool, stopping: &AtomicBool) {
    let pool = &opened.pool;
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    for _ in 0..REQUESTS_PER_CONNECTION_MAX {
        let line =
            match control_limits::read_request_line(&mut reader, REQUEST_LINE_MAX_BYTES as usize) {
                Ok(Some(line)) => line,
                Ok(None) => return,
                Err(e) => {
                    tracing::info!("control connection closed: {e}");
                    return;
                }
            };
        // A line that did not end within the limit gets one answer and a
        // hang-up, rather than have its rest read as more requests.
        let too_long = !line.ends_with('\n');
        let reply = if too_long {
            Reply::Error {
                kind: ErrorKind::InvalidArgument,
                message: format!("control request longer than {REQUEST_LINE_MAX_BYTES} bytes"),
            }
        } else {
            match serde_json::from_str::<Request>(&line) {
                Ok(request @ (Request::Receive { .. } | Request::Send { .. })) => {
                    tracing::info!(?request, "control request");
                    return serve_stream_caught(pool, request, &mut reader, writer);
                }
                Ok(request) => {
                    log_request(&request);
                    match execute_catching_panics(opened, request, stopping) {
                        Ok(reply) => reply,
                        Err(panicked) => {
                            // Answered, then closed: the client must not
                            // wait for the server to stop.
                            let _ = control_limits::write_reply(
                                &mut writer,
                                reply_line(&panicked).as_bytes(),
                            );
                            return;
                        }
                    }
                }
                Err(e) => Reply::Error {
                    kind: ErrorKind::InvalidArgument,
                    message: format!("malformed control request: {e}"),
                },
            }
        };
        if let Err(e) = control_limits::write_reply(&mut writer, reply_line(&reply).as_bytes()) {
            tracing::info!("control connection closed: {e}");
            return;
        }
        if too_long {
            return;
        }
    }
}

/// A streaming request on its connection, which then closes; a panic in
/// it is logged.
fn serve_stream_caught(
    pool: &Pool,
    request: Request,
    reader: &mut BufReader<UnixStream>,
    mut writer: UnixStream,
) {
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        serve_stream(pool, request, reader, &mut writer)
    }));
    if caught.is_err() {
        tracing::error!("a streaming control request panicked; its connection is closed");
    }
}

fn log_request(request: &Request) {
    // A rebuild's or scrub's progress is polled several times a second:
    // not worth a log line each.
    if matches!(request, Request::Branches) {
        tracing::debug!(?request, "control request");
    } else {
        tracing::info!(?request, "control request");
    }
}

fn reply_line(reply: &Reply) -> String {
    let mut text = serde_json::to_string(reply).unwrap_or_default();
    text.push('\n');
    text
}

/// Runs a request with a panic in it caught, logged and turned into an
/// error reply (Err). The pool is not marked failed here: a panic with
/// the engine's state lock held poisons it, and the engine then takes no
/// more changes (`lock_state`), as after a failed commit; a panic outside
/// that lock left no change half made, so the pool goes on as it was.
fn execute_catching_panics(
    opened: &OpenedPool,
    request: Request,
    stopping: &AtomicBool,
) -> std::result::Result<Reply, Reply> {
    let pool = &opened.pool;
    let kind = request.kind();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        if cfg!(debug_assertions) {
            match std::env::var(PANIC_FOR_TESTS_ENV) {
                Ok(wanted) if wanted == kind => {
                    panic!("{PANIC_FOR_TESTS_ENV} asked the {kind} request to panic")
                }
                Ok(wanted) if wanted == format!("{kind}:locked") => {
                    pool.panic_holding_state_lock_for_tests()
                }
                _ => {}
            }
        }
        execute(opened, request, stopping)
    }));
    let payload = match outcome {
        Ok(reply) => return Ok(reply),
        Err(payload) => payload,
    };
    let cause = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into());
    // Asking takes the state lock, which marks a poisoned pool failed.
    let after = match pool.failure() {
        Some(_) => "the server goes on, but the pool takes no more changes until it is restarted",
        None => "the server goes on",
    };
    tracing::error!(request = %kind, cause = %cause, "control request panicked; answered with an error and closed");
    Err(Reply::Error {
        kind: ErrorKind::Io,
        message: format!("internal error while running the {kind} request ({cause}); {after}"),
    })
}

/// A command's side: a connection to the daemon that holds the pool.
pub struct ControlClient {
    dir: PathBuf,
    stream: std::cell::RefCell<BufReader<UnixStream>>,
    /// Requests sent on `stream`: the daemon hangs up after
    /// REQUESTS_PER_CONNECTION_MAX, so the next one goes on a new connection.
    sent: std::cell::Cell<usize>,
}

impl ControlClient {
    /// Connects to the daemon serving `dir`, or None if there is none.
    pub fn connect(dir: &Path) -> Option<ControlClient> {
        let stream = UnixStream::connect(dir.join(CONTROL_SOCKET_NAME)).ok()?;
        Some(ControlClient {
            dir: dir.to_path_buf(),
            stream: std::cell::RefCell::new(BufReader::new(stream)),
            sent: std::cell::Cell::new(0),
        })
    }

    /// The connection for one more request: a new one once the daemon's
    /// quota of requests per connection is used up (a prune that falls
    /// back to one removal at a time sends thousands).
    fn stream_for_request(&self) -> std::io::Result<std::cell::RefMut<'_, BufReader<UnixStream>>> {
        let mut stream = self.stream.borrow_mut();
        if self.sent.get() >= REQUESTS_PER_CONNECTION_MAX {
            *stream = BufReader::new(UnixStream::connect(self.dir.join(CONTROL_SOCKET_NAME))?);
            self.sent.set(0);
        }
        self.sent.set(self.sent.get() + 1);
        assert!(self.sent.get() <= REQUESTS_PER_CONNECTION_MAX);
        Ok(stream)
    }

    /// Sends `request` and returns the daemon's reply; a long branch
    /// request shows its progress meanwhile.
    fn call<T: DeserializeOwned>(&self, request: Request) -> grove_store::Result<T> {
        match request.progress_label() {
            Some(what) => self.call_with_progress(&what, request),
            None => self.call_once(request),
        }
    }

    fn call_once<T: DeserializeOwned>(&self, request: Request) -> grove_store::Result<T> {
        self.exchange(&request).map_err(|e| {
            Error::new(
                ErrorKind::Io,
                format!(
                    "cannot reach the grove serving {}: {e:#}",
                    self.dir.display()
                ),
            )
        })?
    }

    /// The process serving the pool.
    pub fn holder(&self) -> grove_store::Result<Holder> {
        self.call(Request::Holder)
    }

    /// `Admin::read_bytes` through the daemon: one request, of at most
    /// BYTES_PER_REQUEST_MAX bytes, answered in hex.
    fn read_piece(&self, name: &str, offset: u64, length: u64) -> grove_store::Result<Vec<u8>> {
        let text: String = self.call(Request::ReadBytes {
            name: name.into(),
            offset,
            length: length.min(BYTES_PER_REQUEST_MAX as u64),
        })?;
        unhex(&text).map_err(|e| {
            Error::new(
                ErrorKind::Io,
                format!("the daemon's reply to a read is not hex: {e:#}"),
            )
        })
    }

    /// `Admin::write_bytes` through the daemon: one request a piece whose
    /// hex fits a request line.
    fn write_in_pieces(&self, name: &str, offset: u64, data: &[u8]) -> grove_store::Result<()> {
        if data.is_empty() {
            // Still asked: the engine refuses a snapshot or an offset past
            // the end before any input is read.
            return self.call(Request::WriteBytes {
                name: name.into(),
                offset,
                hex: String::new(),
            });
        }
        for (index, piece) in data.chunks(WRITE_BYTES_PER_REQUEST_MAX).enumerate() {
            self.call::<()>(Request::WriteBytes {
                name: name.into(),
                offset: offset + (index * WRITE_BYTES_PER_REQUEST_MAX) as u64,
                hex: hex::encode(piece),
            })?;
        }
        Ok(())
    }

    fn exchange<T: DeserializeOwned>(&self, request: &Request) -> Result<grove_store::Result<T>> {
        let mut stream = self.stream_for_request()?;
        let mut line = serde_json::to_string(request)?;
        line.push('\n');
        let timeout = request.reply_timeout();
        stream.get_ref().set_read_timeout(Some(timeout))?;
        stream.get_mut().write_all(line.as_bytes())?;
        let mut answer = String::new();
        match stream.read_line(&mut answer) {
            Ok(0) => return Err(anyhow!("the daemon closed the connection")),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(anyhow!(
                    "no reply to the {} request within {} s",
                    request.kind(),
                    timeout.as_secs()
                ))
            }
            Err(e) => return Err(e.into()),
        }
        Ok(match serde_json::from_str::<Reply>(&answer)? {
            Reply::Ok(value) => Ok(serde_json::from_value(value)?),
            Reply::Error { kind, message } => Err(Error::new(kind, message)),
        })
    }
}

impl ControlClient {
    /// Sends a stream from `input` for the daemon to receive as `name`.
    pub fn receive_stream(
        &self,
        name: &str,
        mut input: impl Read,
    ) -> Result<grove_send::ReceiveSummary> {
        let mut stream = self.stream_for_request()?;
        let mut line = serde_json::to_string(&Request::Receive { name: name.into() })?;
        line.push('\n');
        stream.get_mut().write_all(line.as_bytes())?;
        // The daemon may refuse early (a missing base) and stop reading:
        // its answer says why, so a failed copy only matters without one.
        let copied = std::io::copy(&mut input, stream.get_mut());
        let _ = stream.get_ref().shutdown(std::net::Shutdown::Write);
        stream
            .get_ref()
            .set_read_timeout(Some(Duration::from_millis(LONG_REPLY_TIMEOUT_MS)))?;
        let mut answer = String::new();
        match stream.read_line(&mut answer) {
            Ok(n) if n > 0 => {}
            _ => {
                copied.context("cannot pass the stream to the daemon")?;
                return Err(anyhow!("the daemon closed the connection without a reply"));
            }
        }
        match serde_json::from_str::<Reply>(&answer)? {
            Reply::Ok(value) => Ok(serde_json::from_value(value)?),
            Reply::Error { message, .. } => Err(anyhow!("{message}")),
        }
    }

    /// Has the daemon send a stream, which `consume` reads.
    pub fn send_stream(
        &self,
        args: &crate::stream::SendArgs,
        consume: &mut dyn FnMut(&mut dyn Read) -> Result<()>,
    ) -> Result<()> {
        let mut stream = self.stream_for_request()?;
        let mut line = serde_json::to_string(&Request::Send { args: args.clone() })?;
        line.push('\n');
        stream.get_mut().write_all(line.as_bytes())?;
        stream
            .get_ref()
            .set_read_timeout(Some(Duration::from_millis(REPLY_TIMEOUT_MS)))?;
        let mut answer = String::new();
        if stream.read_line(&mut answer)? == 0 {
            return Err(anyhow!("the daemon closed the connection without a reply"));
        }
        if let Reply::Error { message, .. } = serde_json::from_str::<Reply>(&answer)? {
            return Err(anyhow!("{message}"));
        }
        consume(&mut *stream)
    }
}

impl ControlClient {
    /// Runs a long branch request, with a progress bar fed by polling the
    /// daemon's branch report on a connection of its own meanwhile.
    fn call_with_progress<T: DeserializeOwned>(
        &self,
        what: &str,
        request: Request,
    ) -> grove_store::Result<T> {
        // The bar shows only on a terminal: poll only for one.
        if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            return self.call_once(request);
        }
        let done = Arc::new(AtomicBool::new(false));
        let poller = {
            let (done, dir, what) = (done.clone(), self.dir.clone(), what.to_string());
            std::thread::spawn(move || {
                let Some(client) = ControlClient::connect(&dir) else {
                    return;
                };
                let bar = crate::progress::Progress::count(&what, 0);
                while !done.load(Ordering::Acquire) {
                    if let Ok(Some(BranchReport { job: Some(job), .. })) = client.branch_report() {
                        bar.set_length(job.total);
                        bar.set_position(job.done);
                    }
                    std::thread::sleep(Duration::from_millis(PROGRESS_POLL_MS));
                }
            })
        };
        let result = self.call_once(request);
        done.store(true, Ordering::Release);
        let _ = poller.join();
        result
    }
}

/// How often a command polls the daemon for a rebuild's or scrub's progress.
const PROGRESS_POLL_MS: u64 = 250;

/// A volume of a pool reached through `Admin` (here or the daemon's
/// control socket), as `grove read` and `grove write` move its bytes.
pub struct AdminVolume<'a> {
    pub admin: &'a dyn Admin,
    pub name: &'a str,
}

impl crate::transfer::VolumeBytes for AdminVolume<'_> {
    fn size_bytes(&self) -> grove_store::Result<u64> {
        Ok(self.admin.volume_info(self.name)?.summary.size_bytes)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> grove_store::Result<()> {
        for (index, piece) in buf.chunks_mut(BYTES_PER_REQUEST_MAX).enumerate() {
            let at = offset + (index * BYTES_PER_REQUEST_MAX) as u64;
            let got = self.admin.read_bytes(self.name, at, piece.len() as u64)?;
            if got.len() != piece.len() {
                return Err(Error::new(
                    ErrorKind::Io,
                    format!("asked for {} bytes at {at}, got {}", piece.len(), got.len()),
                ));
            }
            piece.copy_from_slice(&got);
        }
        Ok(())
    }
    fn write_at(&self, data: &[u8], offset: u64) -> grove_store::Result<()> {
        self.admin.write_bytes(self.name, offset, data)
    }
    fn flush(&self) -> grove_store::Result<()> {
        self.admin.flush_volume(self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use grove_store::PoolOptions;

    #[test]
    fn names_are_split_into_requests_the_daemon_reads_whole() {
        assert!(names_per_request(&[]).is_empty());
        // 128-byte names, the longest: 2,000 of them are ~260 KB of JSON.
        let names: Vec<String> = (0..2000).map(|i| format!("{i:0>128}")).collect();
        let runs = names_per_request(&names);
        assert!(runs.len() > 1, "one request of {} names", names.len());
        for run in &runs {
            let request = Request::RemoveSnapshots {
                names: run.to_vec(),
            };
            let line_bytes = serde_json::to_string(&request).unwrap().len() + 1;
            assert!(
                line_bytes <= REQUEST_LINE_MAX_BYTES as usize,
                "{line_bytes}"
            );
        }
        let rejoined: Vec<&String> = runs.iter().flat_map(|r| r.iter()).collect();
        assert_eq!(rejoined, names.iter().collect::<Vec<_>>());
    }

    /// Requests as clients of every version send them: each must still be
    /// read as the same request (old clients and daemons interoperate).
    #[test]
    fn requests_keep_their_wire_form() {
        let lines = [
            r#"{"command":"create","name":"v","size_bytes":4096}"#,
            r#"{"command":"snapshot","source":"v","name":"v@1"}"#,
            r#"{"command":"clone","source":"v@1","name":"c"}"#,
            r#"{"command":"remove","name":"v","recursive":true,"force":false}"#,
            r#"{"command":"rollback","snapshot":"v@1","volume":null,"force":true}"#,
            r#"{"command":"diff","a":"v@1","b":"v"}"#,
            r#"{"command":"gc","wait":true}"#,
            r#"{"command":"resize","name":"v","size_bytes":8192,"drop_data":false}"#,
            r#"{"command":"rename","name":"v","new_name":"w"}"#,
            r#"{"command":"read_bytes","name":"v","offset":0,"length":512}"#,
            r#"{"command":"write_bytes","name":"v","offset":512,"hex":"00ff"}"#,
            r#"{"command":"flush_volume","name":"v"}"#,
            r#"{"command":"list"}"#,
            r#"{"command":"summaries"}"#,
            r#"{"command":"family_summaries","name":"v"}"#,
            r#"{"command":"volume_info","name":"v"}"#,
            r#"{"command":"info"}"#,
            r#"{"command":"check","repair":false}"#,
            r#"{"command":"holder"}"#,
            r#"{"command":"replication_state"}"#,
            r#"{"command":"receive","name":"v"}"#,
            r#"{"command":"receive_abort","name":"v"}"#,
            r#"{"command":"receive_status","name":"v"}"#,
            r#"{"command":"hash","name":"v"}"#,
            r#"{"command":"restart_point","name":"v"}"#,
            r#"{"command":"snapshot_ranked","source":"v","name":"v@2","rank":3,"created_unix_secs":9}"#,
            r#"{"command":"set_rank","snapshot":"v@2","rank":1}"#,
            r#"{"command":"hold","snapshot":"v@2","tag":"t","until":100}"#,
            r#"{"command":"release","snapshot":"v@2","tag":"t"}"#,
            r#"{"command":"holds"}"#,
            r#"{"command":"remove_snapshots","names":["v@1","v@2"]}"#,
            r#"{"command":"release_expired_holds","now_unix_secs":100}"#,
            r#"{"command":"space_settings"}"#,
            r#"{"command":"branches"}"#,
            r#"{"command":"rebuild","label":"b1","to":"/new/b1","force":false}"#,
            r#"{"command":"scrub","repair":true}"#,
            r#"{"command":"fail_branch","label":"b1"}"#,
            r#"{"command":"add_branches","dirs":["/b3","/b4"]}"#,
            r#"{"command":"restripe"}"#,
        ];
        for line in lines {
            let request: Request = serde_json::from_str(line).expect(line);
            let sent: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(serde_json::to_value(&request).unwrap(), sent, "{line}");
        }
    }

    #[test]
    fn a_client_goes_on_past_the_daemon_s_requests_per_connection() {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::create(dir.path(), &PoolOptions::default()).unwrap();
        let opened = OpenedPool {
            pool,
            branches: None,
        };
        let server = ControlServer::start(opened, 0o600).unwrap();
        let client = ControlClient::connect(dir.path()).expect("the daemon listens");
        for i in 0..REQUESTS_PER_CONNECTION_MAX + 5 {
            let holds = client.holds();
            assert!(holds.is_ok(), "request {i}: {holds:?}");
        }
        drop(client);
        server.stop(std::time::Instant::now() + Duration::from_secs(5));
    }
}
