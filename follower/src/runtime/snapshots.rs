//! Snapshots in the runtime, one path for each thing:
//!
//! - At start, [`restore_newest`] restores the newest usable snapshot and
//!   the apply thread resumes the restored server's stream after it.
//! - Taking one happens on the apply thread ([`Node::snapshot_if_asked`]):
//!   asked by an operator (`lockstep snapshot`, [`Node::request_snapshot`])
//!   or by the replica (its [`Action::TakeSnapshot`], when `snapshot_every`
//!   says this backup is next), carried out by the rules' thread
//!   ([`Node::snapshot_loop`]). Between two feeds that
//!   find the server idle at a turn boundary, the apply thread has the
//!   image taken, writes `meta.json`, and feeds on; the leader never waits
//!   for any of it.
//! - The rules' thread decides nothing itself: once a second it gathers
//!   every member's snapshot state (the peers' from their status), steps
//!   the replica with it ([`Event::SnapshotRound`]), and carries out what
//!   the replica decided: take a snapshot, delete the log a majority's
//!   snapshots cover ([`Action::Compact`]), install a peer's snapshot when
//!   this node's log ends before what its peers keep ([`Action::Install`],
//!   through [`transfer`]; the peer side is served by `control_server`).
//!
//! Nothing is taken, compacted or installed without an image taker (one
//! line at start says why there is none) or with `snapshot = "off"`: the
//! log is then kept and replayed whole.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use lockstep_common::config::SnapshotMode;
use lockstep_common::control::{self, NodeStatus, Request, Response, SnapshotFailing};
use lockstep_common::region::{Region, Role};

use crate::io::feed::Feeder;
use crate::io::store::{LogEnd, LogStore};
use crate::protocol::snapshot::{self as rules, Member};
use crate::protocol::{Action, Event, SnapshotRound};
use crate::snapshot::catalog::{Catalog, Snapshot};
use crate::snapshot::transfer::{self, ChunkSource};
use crate::snapshot::{build_id, criu, sum_files, write_meta, Meta, Position, ServerImage};

use super::carried::Carried;
use super::Node;

/// How often the rules run (the replica's pause after a failed install,
/// `INSTALL_RETRY_MS`, is one round).
const PERIOD: Duration = Duration::from_secs(1);
/// How long a peer's status may take.
const STATUS_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a trigger waits for its snapshot.
pub const TRIGGER_PATIENCE: Duration = Duration::from_secs(120);
/// Complete snapshots kept on a node (the newest, and one before it for
/// when the newest turns out unusable).
const KEEP: usize = 2;

/// This node's snapshots failing: since when, how often, why.
#[derive(Clone, Debug)]
pub(crate) struct Failing {
    /// The first failure of this run (or the follower's start, for a node
    /// that cannot take any).
    pub(crate) since: Instant,
    /// The latest failure.
    pub(crate) last: Instant,
    /// Failed attempts (0: it cannot take any).
    pub(crate) failures: u64,
    /// The latest reason, one line.
    pub(crate) reason: String,
}

impl Failing {
    /// As the status reports it.
    pub(crate) fn report(&self) -> SnapshotFailing {
        SnapshotFailing {
            for_ms: self.since.elapsed().as_millis() as u64,
            failures: self.failures,
            last_ms: self.last.elapsed().as_millis() as u64,
            reason: self.reason.clone(),
            fix: fix_for(&self.reason).into(),
        }
    }
}

/// What fixes a snapshot failure, from its reason.
pub fn fix_for(reason: &str) -> &'static str {
    if reason.contains("no criu")
        || reason.contains("needs root")
        || reason.contains(" check` fails")
    {
        "install CRIU 4.2 or newer (scripts/setup builds it) and run the follower as root, or set snapshot = \"off\" to keep the whole log on purpose"
    } else if reason.contains("PID namespace") || reason.contains("session leader") {
        "start the server with `lockstep run --config … --node N` (as `lockstep up` does)"
    } else if reason.contains("no snapshot within") {
        "the server found no idle moment to be imaged in: see the follower's log; the log is kept meanwhile"
    } else {
        "see the CRIU log named in the reason; until it works the log is kept (it grows), or set snapshot = \"off\" to keep the whole log on purpose"
    }
}

/// This node's snapshot state, for its status and the rules.
#[derive(Clone, Debug, Default)]
pub(crate) struct SnapshotState {
    /// Seq of the newest complete snapshot (0: none).
    pub(crate) newest: u64,
    /// A snapshot is asked for or being taken.
    pub(crate) taking: bool,
    /// Bytes the apply thread had fed when the newest snapshot was taken.
    pub(crate) bytes_at: u64,
    /// Bytes of the newest snapshot's image (0: none).
    pub(crate) image_bytes: u64,
    /// The largest newest image any member reported lately: a node's log
    /// is as long as the backups' image rule lets it grow, also on a node
    /// with no image of its own (a leader takes none).
    pub(crate) members_image_bytes: u64,
    /// Snapshots fail (or cannot be taken at all) since then.
    pub(crate) failing: Option<Failing>,
}

/// Makes the image taker of a node's server from its region, its
/// snapshots directory and its app address, or says in one line why there
/// is none.
pub type ImageMaker =
    fn(Arc<Region>, &Path, std::net::SocketAddr) -> Result<Arc<dyn ServerImage>, String>;

/// A node's snapshots: the image taker, triggers waiting for the apply
/// thread, the state its status reports.
pub struct Snapshots {
    /// The image taker, or why this node cannot snapshot.
    pub(super) image: Result<Arc<dyn ServerImage>, String>,
    /// Triggers waiting for the apply thread.
    requests: Mutex<Vec<mpsc::Sender<Result<u64, String>>>>,
    /// The server was replaced by an image (at start, or installed): the
    /// apply thread resumes its stream instead of starting a new one.
    resume: AtomicBool,
    /// An installed image is replacing the server: the apply thread feeds
    /// nothing and drops its stream.
    installing: AtomicBool,
    /// Neither this node's log nor its snapshots can rebuild its server
    /// (it deleted its log past its own newest snapshot, as a leader does,
    /// and restarted): it feeds nothing until a peer's image is installed.
    needs_image: AtomicBool,
    /// The replica's snapshot decisions of the latest round, for the
    /// rules' thread to carry out (not under the replica's lock: they take
    /// a while, and taking one asks the replica's role).
    orders: Mutex<Vec<Action>>,
    state: Mutex<SnapshotState>,
}

impl Snapshots {
    /// Snapshot state with `image` (Err: why none can be taken); `restored`:
    /// the server was restored from the snapshot at `newest` (its image
    /// `image_bytes` large).
    /// `failing`: the config asks for snapshots (`snapshot = "process"`),
    /// so a missing image taker is a failure to report.
    pub fn new(
        image: Result<Arc<dyn ServerImage>, String>,
        restored: bool,
        needs_image: bool,
        newest: u64,
        image_bytes: u64,
        wanted: bool,
    ) -> Snapshots {
        let failing = match &image {
            Err(why) if wanted => Some(Failing {
                since: Instant::now(),
                last: Instant::now(),
                failures: 0,
                reason: why.clone(),
            }),
            _ => None,
        };
        Snapshots {
            image,
            requests: Mutex::new(Vec::new()),
            resume: AtomicBool::new(restored),
            installing: AtomicBool::new(false),
            needs_image: AtomicBool::new(needs_image),
            orders: Mutex::new(Vec::new()),
            state: Mutex::new(SnapshotState {
                newest,
                image_bytes,
                failing,
                ..SnapshotState::default()
            }),
        }
    }

    /// Whether the apply thread must resume a restored server's stream
    /// (true once).
    pub(super) fn take_resume(&self) -> bool {
        self.resume.swap(false, Ordering::AcqRel)
    }

    /// Whether an installed image is replacing the server now, or one must
    /// before the server can apply anything.
    pub(super) fn installing(&self) -> bool {
        self.installing.load(Ordering::Acquire) || self.needs_image()
    }

    /// Whether the server can only be rebuilt from a peer's image.
    pub(super) fn needs_image(&self) -> bool {
        self.needs_image.load(Ordering::Acquire)
    }

    /// Queues a snapshot decision of the replica for the rules' thread.
    pub(super) fn order(&self, action: Action) {
        self.orders
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(action);
    }

    fn take_orders(&self) -> Vec<Action> {
        std::mem::take(&mut *self.orders.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn pending(&self) -> Vec<mpsc::Sender<Result<u64, String>>> {
        std::mem::take(&mut *self.requests.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub(super) fn has_pending(&self) -> bool {
        !self
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }
}

/// The CRIU image taker for the server attached to `region` and serving
/// `app` (logging into `work`), or one line saying why this machine cannot
/// snapshot.
pub fn criu_image(
    region: Arc<Region>,
    work: &Path,
    app: std::net::SocketAddr,
) -> Result<Arc<dyn ServerImage>, String> {
    std::fs::create_dir_all(work).map_err(|e| format!("cannot create {}: {e}", work.display()))?;
    criu::Criu::find(region, work, app).map(|c| Arc::new(c) as Arc<dyn ServerImage>)
}

/// Restores the newest usable snapshot in `catalog` (the node's log in
/// `store`, its server's program `server`); returns its seq. Each snapshot
/// that is corrupt, of another build, ahead of the log, or that fails to
/// restore is passed over with one line; None: full replay.
pub fn restore_newest(
    image: &dyn ServerImage,
    catalog: &Catalog,
    store: &LogStore,
    server: Option<&[String]>,
) -> Option<u64> {
    let last = store.last().seq;
    let list = match catalog.list() {
        Ok(l) => l,
        Err(e) => {
            log::warn!("reading the snapshots: {e}");
            return None;
        }
    };
    for snap in list.into_iter().rev() {
        let seq = snap.meta.position.seq;
        if let Err(why) = usable(&snap, server) {
            log::warn!("{why}: not restored ({})", snap.dir.display());
            continue;
        }
        if seq > last || seq + 1 < store.oldest() {
            log::warn!(
                "snapshot {} is outside the log (seqs {} to {last}): not restored",
                snap.dir.display(),
                store.oldest()
            );
            continue;
        }
        match image.restore(&snap.dir, snap.meta.position) {
            Ok(()) => {
                log::info!(
                    "restored the server from snapshot {}; replaying from seq {}",
                    snap.dir.display(),
                    seq + 1
                );
                return Some(seq);
            }
            Err(e) => log::warn!("snapshot {} failed to restore: {e:#}", snap.dir.display()),
        }
    }
    None
}

/// Whether `snap` may be restored here: every file as its `meta.json`
/// says, taken under this node's builds; one line why not.
fn usable(snap: &Snapshot, server: Option<&[String]>) -> Result<(), String> {
    Catalog::verify(snap).map_err(|e| e.to_string())?;
    let local = build_id::for_image(&snap.meta.build_ids, server);
    transfer::check_build_ids(&snap.meta.build_ids, &local)
        .map_err(|why| format!("snapshot {}: {why}", snap.meta.position.seq))
}

impl Node {
    pub(crate) fn snapshot_state(&self) -> MutexGuard<'_, SnapshotState> {
        self.snapshots
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Asks the apply thread for a snapshot (an operator's `lockstep
    /// snapshot`, or the rules) and waits for it; returns its seq.
    pub(crate) fn request_snapshot(&self) -> Result<u64, String> {
        if let Err(why) = &self.snapshots.image {
            return Err(format!("node {} cannot snapshot: {why}", self.me));
        }
        if self.replica().role() != Role::Backup {
            return Err(format!(
                "node {} is not a backup: only backups snapshot",
                self.me
            ));
        }
        let (tx, rx) = mpsc::channel();
        self.snapshot_state().taking = true;
        self.snapshots
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(tx);
        if let Some(t) = self.applier.get() {
            t.unpark();
        }
        let r = rx
            .recv_timeout(TRIGGER_PATIENCE)
            .map_err(|_| format!("no snapshot within {TRIGGER_PATIENCE:?}"));
        if !self.snapshots.has_pending() {
            self.snapshot_state().taking = false;
        }
        r?
    }

    /// Answers triggers that cannot be served now (the node leads, or is
    /// stale).
    pub(super) fn refuse_snapshots(&self, why: &str) {
        for tx in self.snapshots.pending() {
            let _ = tx.send(Err(format!("node {}: {why}", self.me)));
        }
        self.answered_snapshots();
    }

    /// The pending triggers were answered: this node takes none now unless
    /// another came meanwhile. (A trigger whose asker gave up waiting is
    /// answered later, when the server is idle; `taking` stayed set until
    /// then for good, and with a member taking no node's turn ever came.)
    fn answered_snapshots(&self) {
        let more = self.snapshots.has_pending();
        self.snapshot_state().taking = more;
    }

    /// On the apply thread, between feeds: takes a snapshot when one was
    /// asked for and the server idles at a turn boundary: it applied
    /// everything fed (the preload sets `applied` when the turn's threads
    /// went back to their event loop) and read all of it (`head`). A
    /// server still in a turn may be waiting for the turn's next entry
    /// (its end, a clock record): the feed goes on, one entry at a time
    /// while a snapshot is asked for (see `apply_loop`), and the snapshot
    /// waits for the next boundary.
    pub(super) fn snapshot_if_asked(&self, f: &Feeder) {
        if !self.snapshots.has_pending() {
            return;
        }
        let fed = f.next() - 1;
        if fed == 0 || f.applied() != fed || self.region.apply().head() != f.pos() {
            return;
        }
        let result = self.snapshot_now(fed);
        match &result {
            Ok(seq) => {
                log::info!("node {}: snapshot at seq {seq} complete", self.me);
                self.snapshot_worked();
            }
            Err(e) => self.snapshot_failed(e),
        }
        for tx in self.snapshots.pending() {
            let _ = tx.send(result.clone());
        }
        self.answered_snapshots();
    }

    /// Records a failed attempt. The first of a run (or one with another
    /// reason) is said at WARN with its fix; the same again only at DEBUG
    /// (status, metrics and `/health` carry it while it lasts).
    pub(super) fn snapshot_failed(&self, reason: &str) {
        let mut st = self.snapshot_state();
        let now = Instant::now();
        match &mut st.failing {
            Some(f) if f.reason == reason => {
                f.failures += 1;
                f.last = now;
                log::debug!(
                    "node {}: snapshot failed again ({} times): {reason}",
                    self.me,
                    f.failures
                );
                return;
            }
            Some(f) => {
                f.failures += 1;
                f.last = now;
                f.reason = reason.to_string();
            }
            None => {
                st.failing = Some(Failing {
                    since: now,
                    last: now,
                    failures: 1,
                    reason: reason.to_string(),
                })
            }
        }
        log::warn!(
            "node {}: snapshot failed: {reason}; fix: {}. Until a snapshot works the log below is kept and grows (said once; `lockstep status` shows it while it lasts)",
            self.me,
            fix_for(reason)
        );
    }

    /// Records a snapshot that worked: a failing run ends.
    fn snapshot_worked(&self) {
        if let Some(f) = self.snapshot_state().failing.take() {
            log::info!(
                "node {}: snapshots work again, after {} failed attempts in {:.0} s",
                self.me,
                f.failures,
                f.since.elapsed().as_secs_f64()
            );
        }
    }

    /// Takes the image of the server, idle after applying `seq`, and
    /// completes it with `meta.json`.
    fn snapshot_now(&self, seq: u64) -> Result<u64, String> {
        let image = self.snapshots.image.as_ref().map_err(|e| e.clone())?;
        let since = Instant::now();
        let h = match self.store().get(seq) {
            Ok(Some(e)) => e.header(),
            Ok(None) => return Err(format!("seq {seq} is not in the log")),
            Err(e) => return Err(e.to_string()),
        };
        let at = Position {
            seq,
            view: h.view,
            time_us: h.time_us,
        };
        let dir = self.catalog.dir_of(seq);
        if let Ok(Some(_)) = Catalog::read_meta(&dir) {
            return Ok(seq);
        }
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let taken = image.take(&dir, at).and_then(|build_ids| {
            let meta = Meta {
                position: at,
                build_ids,
                files: sum_files(&dir)?,
                lockstep_version: env!("CARGO_PKG_VERSION").into(),
                origin_us: self.region.origin_us(),
            };
            write_meta(&dir, &meta)?;
            Ok(meta)
        });
        let meta = match taken {
            Ok(m) => m,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(format!("{e:#}"));
            }
        };
        {
            let mut st = self.snapshot_state();
            st.newest = seq;
            st.bytes_at = self.applied_bytes.load(Ordering::Relaxed);
            st.image_bytes = meta.bytes();
        }
        match self.catalog.clean(KEEP) {
            Ok(deleted) => log::info!(
                "node {}: snapshot at seq {seq}: {} bytes in {} ms; deleted older ones {deleted:?}",
                self.me,
                meta.bytes(),
                since.elapsed().as_millis()
            ),
            Err(e) => log::warn!("node {}: cleaning the snapshots: {e}", self.me),
        }
        Ok(seq)
    }

    /// Runs a round of the snapshot rules every [`PERIOD`] until the node
    /// stops: gathers the members' states, steps the replica with them
    /// (which decides: take on this backup's turn, compact, install) and
    /// carries out what it decided, in order.
    pub(super) fn snapshot_loop(&self) {
        if self.config.snapshot == SnapshotMode::Off || self.snapshots.image.is_err() {
            return;
        }
        // A node that cannot rebuild its server without a peer's image
        // asks for one at once.
        let mut first = self.snapshots.needs_image();
        while !self.stopping() {
            if !std::mem::take(&mut first) {
                std::thread::sleep(PERIOD);
            }
            let members = self.members();
            self.snapshot_state().members_image_bytes =
                members.iter().map(|m| m.image_bytes).max().unwrap_or(0);
            let round = SnapshotRound {
                members,
                can_rebuild: !self.snapshots.needs_image(),
            };
            self.step(Event::SnapshotRound(round), Carried::Nothing);
            for order in self.snapshots.take_orders() {
                self.carry_out_snapshot(order);
            }
        }
    }

    /// Carries out one of the replica's snapshot decisions (on the rules'
    /// thread: taking and installing take a while).
    fn carry_out_snapshot(&self, order: Action) {
        match order {
            Action::TakeSnapshot => match self.request_snapshot() {
                Ok(_) => {}
                // The apply thread recorded (and said) an imaging
                // failure; a wait that found no idle moment is one too.
                Err(e) if e.starts_with("no snapshot within") => self.snapshot_failed(&e),
                Err(e) => log::info!("node {}: no snapshot: {e}", self.me),
            },
            Action::Compact { through } => self.compact(through),
            // Said once, and shown in the status while it lasts, as a
            // failed snapshot is: the replica has it tried again, less and
            // less often.
            Action::Install { from } => match self.install_from(from) {
                Ok(()) => self.snapshot_worked(),
                Err(e) => {
                    self.step(Event::InstallFailed, Carried::Nothing);
                    self.snapshot_failed(&format!("installing node {from}'s snapshot: {e:#}"))
                }
            },
            other => log::warn!("node {}: not a snapshot action: {other:?}", self.me),
        }
    }

    /// Every member's state: this node's own, the peers' from their status.
    fn members(&self) -> Vec<Member> {
        let own = self.status();
        self.config
            .ids()
            .map(|id| {
                if id == self.me {
                    return Member {
                        failing: own
                            .snapshot_failing
                            .as_ref()
                            .is_some_and(|f| rules::failing_lately(f.failures, f.last_ms, true)),
                        ..member_of(&own)
                    };
                }
                match self.peer_status(id, STATUS_TIMEOUT) {
                    Ok(st) => member_of(&st),
                    Err(e) => {
                        log::debug!("node {}: status of node {id}: {e:#}", self.me);
                        Member {
                            node: id,
                            ..Member::default()
                        }
                    }
                }
            })
            .collect()
    }

    /// Deletes the log up to `point` (the rules' compaction point).
    fn compact(&self, point: u64) {
        let deleted = {
            let mut store = self.store();
            if point < store.oldest() {
                return;
            }
            store.compact_through(point)
        };
        match deleted {
            Ok(deleted) => {
                // Outside the store's lock: the ingest goes on meanwhile.
                let started = std::time::Instant::now();
                let n = deleted.reclaim_now();
                log::info!(
                    "node {}: deleted {n} log entries up to seq {point} (a majority's snapshots cover them; disk reclaimed in {:.0?})",
                    self.me,
                    started.elapsed()
                );
            }
            Err(e) => log::warn!("node {}: compacting the log up to {point}: {e}", self.me),
        }
    }

    /// Installs `peer`'s newest snapshot and replaces this node's server
    /// by it; the log then starts after it (fetched from peers).
    fn install_from(&self, peer: u64) -> anyhow::Result<()> {
        let image = self.snapshots.image.clone().map_err(anyhow::Error::msg)?;
        // What a snapshot must pass to be worth installing: anything, for a
        // node whose server cannot be rebuilt otherwise.
        let have = if self.snapshots.needs_image() {
            0
        } else {
            self.store().last().seq.max(self.snapshot_state().newest)
        };
        let mut src = PeerSource {
            node: self,
            peer,
            conn: None,
        };
        // This node's builds of what the peer's image names (a second
        // look at its meta: the transfer reads it again, in case it moved).
        let names = src.meta()?.map(|m| m.build_ids).unwrap_or_default();
        let local = build_id::for_image(&names, self.config.server.as_deref());
        let got = transfer::install(&self.catalog, &mut src, have, &local)?;
        let at = got.snapshot.meta.position;
        self.learn_origin(&self.store(), at.seq);
        log::info!(
            "node {}: installed node {peer}'s snapshot at seq {} ({} bytes fetched)",
            self.me,
            at.seq,
            got.fetched
        );
        // The apply thread lets go of the old server's stream, which ends
        // with it.
        self.snapshots.installing.store(true, Ordering::Release);
        let replaced = image
            .stop_server()
            .and_then(|()| image.restore(&got.snapshot.dir, at))
            .context("replacing the server by the installed image");
        if let Err(e) = replaced {
            self.snapshots.installing.store(false, Ordering::Release);
            return Err(e);
        }
        {
            // A log that continues the image stays (a leader rebuilding its
            // server keeps the entries only it may hold); else the log
            // starts after the image, fetched from peers.
            let mut store = self.store();
            if store.oldest() <= at.seq + 1 && at.seq <= store.last().seq {
                // One that holds the image's own entry (its seq and view)
                // holds its history below too: kept whole for peers that
                // still fetch it there (the compaction rule deletes it once
                // none does; deleted here, a node that was away could catch
                // up from nobody: the simulation found it). Another may
                // differ below from what committed: deleted.
                let view = store
                    .base_view_at(at.seq)
                    .or_else(|| store.get(at.seq).ok().flatten().map(|e| e.header().view));
                if view == Some(at.view) {
                    let committed = store.commit()?.max(at.seq);
                    store.set_commit(committed)?;
                } else {
                    let deleted = store.compact_through(at.seq)?;
                    drop(store);
                    deleted.reclaim_now();
                }
            } else {
                store.restart_after(LogEnd {
                    seq: at.seq,
                    view: at.view,
                    end_pos: 0,
                })?;
            }
        }
        {
            let mut st = self.snapshot_state();
            st.newest = at.seq;
            st.image_bytes = got.snapshot.meta.bytes();
            // The image holds what the old server applied: the log since
            // it counts from here.
            st.bytes_at = self.applied_bytes.load(Ordering::Relaxed);
        }
        self.snapshots.resume.store(true, Ordering::Release);
        self.snapshots.needs_image.store(false, Ordering::Release);
        self.snapshots.installing.store(false, Ordering::Release);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.step(Event::Installed { seq: at.seq }, Carried::Nothing);
        if let Some(t) = self.applier.get() {
            t.unpark();
        }
        Ok(())
    }

    /// Serves `SnapshotMeta`: the newest complete snapshot's `meta.json`.
    pub(super) fn newest_snapshot_meta(&self) -> Response {
        match self.catalog.newest() {
            Ok(Some(s)) => match serde_json::to_string(&s.meta) {
                Ok(text) => Response::SnapshotMeta(Some((s.meta.position.seq, text))),
                Err(e) => Response::Error(e.to_string()),
            },
            Ok(None) => Response::SnapshotMeta(None),
            Err(e) => Response::Error(e.to_string()),
        }
    }
}

/// A member's state as its status tells it.
fn member_of(st: &NodeStatus) -> Member {
    Member {
        node: st.node,
        live: true,
        leader: st.role == "leader",
        // A backup still catching up applies too.
        backup: st.role == "backup" || st.role == "catching-up",
        stale: st.role == "stale",
        failing: st
            .snapshot_failing
            .as_ref()
            .is_some_and(|f| rules::failing_lately(f.failures, f.last_ms, false)),
        taking: st.snapshotting,
        applied: st.applied,
        last: st.persisted,
        committed: st.committed,
        oldest: st.oldest,
        snapshot: st.snapshot,
        bytes_since: st.bytes_since_snapshot,
        image_bytes: st.snapshot_bytes,
    }
}

/// A peer's newest snapshot over the control channel.
struct PeerSource<'a> {
    node: &'a Node,
    peer: u64,
    /// The connection the last chunk came over, used for the next one (a
    /// handshake per chunk cost more than the chunk); dropped on any error,
    /// so a broken one costs one chunk.
    conn: Option<std::net::TcpStream>,
}

impl ChunkSource for PeerSource<'_> {
    fn meta(&mut self) -> anyhow::Result<Option<Meta>> {
        let mut s = self.node.control_connect(self.peer, STATUS_TIMEOUT)?;
        control::send_json(&mut s, &Request::SnapshotMeta)?;
        match control::recv_json::<Response>(&mut s)? {
            Response::SnapshotMeta(None) => Ok(None),
            Response::SnapshotMeta(Some((_, text))) => Ok(Some(serde_json::from_str(&text)?)),
            other => bail!("node {} answered {other:?}", self.peer),
        }
    }

    fn chunk(&mut self, seq: u64, file: &str, offset: u64, len: u32) -> anyhow::Result<Vec<u8>> {
        let mut s = match self.conn.take() {
            Some(s) => s,
            None => self.node.control_connect(self.peer, STATUS_TIMEOUT)?,
        };
        let req = Request::SnapshotChunk {
            seq,
            file: file.into(),
            offset,
            len,
        };
        control::send_json(&mut s, &req)?;
        let bytes = control::recv_snapshot_chunk(&mut s)?;
        self.conn = Some(s);
        Ok(bytes)
    }
}
