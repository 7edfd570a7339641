//! Snapshots in the runtime: restoring the newest usable one when the
//! follower starts ([`restore_newest`]), and taking one on the apply
//! thread when asked ([`Node::snapshot_if_asked`]: the apply loop stops
//! feeding, waits until the server applied everything fed and its turn is
//! over, has the image taken, completes it with `meta.json`, and feeds on;
//! the leader never waits for any of it).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use lockstep_common::region::Role;

use crate::feed::Feeder;
use crate::snapshot::files::{self, snapshot_dir};
use crate::snapshot::{criu, Position, ServerImage};
use crate::store::LogStore;

use super::Node;

/// How long a snapshot waits for the server to apply what was fed.
const QUIESCE_LIMIT: Duration = Duration::from_secs(30);
/// How long a manual trigger waits for its snapshot.
pub const TRIGGER_PATIENCE: Duration = Duration::from_secs(120);
/// Complete snapshots kept on a node (the newest, and one before it for
/// when the newest turns out unusable).
const KEPT: usize = 2;

/// A node's snapshot state.
pub struct Snapshots {
    /// The image taker, or why this machine cannot snapshot.
    pub(super) image: Result<Arc<dyn ServerImage>, String>,
    /// Manual triggers waiting for the apply thread.
    requests: Mutex<Vec<mpsc::Sender<Result<u64, String>>>>,
    /// The server was restored from an image: the apply thread resumes its
    /// stream instead of starting a new one.
    resume: AtomicBool,
}

impl Snapshots {
    /// Snapshot state with `image` (Err: why none can be taken).
    pub fn new(image: Result<Arc<dyn ServerImage>, String>, restored: bool) -> Snapshots {
        Snapshots {
            image,
            requests: Mutex::new(Vec::new()),
            resume: AtomicBool::new(restored),
        }
    }

    /// Whether the apply thread must resume a restored server's stream
    /// (true once).
    pub(super) fn take_resume(&self) -> bool {
        self.resume.swap(false, Ordering::AcqRel)
    }

    fn pending(&self) -> Vec<mpsc::Sender<Result<u64, String>>> {
        std::mem::take(&mut *self.requests.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn has_pending(&self) -> bool {
        !self
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }
}

/// The image taker for the server attached to `region` (CRIU, logging
/// into the snapshots directory of `node_dir`), or one line saying why this
/// machine cannot snapshot.
pub fn image_taker(
    region: Arc<lockstep_common::Region>,
    node_dir: &Path,
) -> Result<Arc<dyn ServerImage>, String> {
    let work = files::snapshots_dir(node_dir);
    std::fs::create_dir_all(&work).map_err(|e| format!("cannot create {}: {e}", work.display()))?;
    criu::Criu::find(region, &work).map(|c| Arc::new(c) as Arc<dyn ServerImage>)
}

/// Restores the newest usable snapshot of the node whose data directory is
/// `node_dir` (its log in `store`); returns its seq. Each snapshot that is
/// incomplete, corrupt, of another build, ahead of the log, or that fails
/// to restore is passed over with one line; None: full replay.
pub fn restore_newest(image: &dyn ServerImage, node_dir: &Path, store: &LogStore) -> Option<u64> {
    let last = store.last().seq;
    for (seq, dir) in files::list(node_dir) {
        let meta = match files::verify(&dir, &criu::current_build_id) {
            Ok(m) => m,
            Err(why) => {
                log::warn!("{why}: not restored");
                continue;
            }
        };
        if seq > last {
            log::warn!(
                "snapshot {} is past the log's end (seq {last}): not restored",
                dir.display()
            );
            continue;
        }
        match image.restore(&dir, meta.position) {
            Ok(()) => {
                log::info!(
                    "restored the server from snapshot {}; replaying from seq {}",
                    dir.display(),
                    seq + 1
                );
                return Some(seq);
            }
            Err(e) => log::warn!("snapshot {} failed to restore: {e:#}", dir.display()),
        }
    }
    None
}

impl Node {
    /// A manual trigger (`lockstep snapshot`): waits for the apply thread
    /// to take one; returns its seq.
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
        self.snapshots
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(tx);
        if let Some(t) = self.applier.get() {
            t.unpark();
        }
        rx.recv_timeout(TRIGGER_PATIENCE)
            .map_err(|_| format!("no snapshot within {TRIGGER_PATIENCE:?}"))?
    }

    /// Answers manual triggers that cannot be served now (the node leads,
    /// or is stale).
    pub(super) fn refuse_snapshots(&self, why: &str) {
        for tx in self.snapshots.pending() {
            let _ = tx.send(Err(format!("node {}: {why}", self.me)));
        }
    }

    /// On the apply thread, between feeds: takes a snapshot when one was
    /// asked for.
    pub(super) fn snapshot_if_asked(&self, f: &Feeder) {
        if !self.snapshots.has_pending() {
            return;
        }
        let result = self.snapshot_now(f);
        match &result {
            Ok(seq) => log::info!("node {}: snapshot at seq {seq} complete", self.me),
            Err(e) => log::warn!("node {}: snapshot failed: {e}", self.me),
        }
        for tx in self.snapshots.pending() {
            let _ = tx.send(result.clone());
        }
    }

    /// Stops feeding at what was fed, waits until the server applied it
    /// at a turn boundary, takes the image and completes it.
    fn snapshot_now(&self, f: &Feeder) -> Result<u64, String> {
        let image = self.snapshots.image.as_ref().map_err(|e| e.clone())?;
        let seq = f.next() - 1;
        if seq == 0 {
            return Err("the server applied nothing yet".into());
        }
        // The preload sets `applied` when the turn's threads went back to
        // their event loop, and `head` when it read the turn: both at the
        // end of what was fed means the server idles at a turn boundary.
        let since = Instant::now();
        let a = self.region.apply();
        while f.applied() != seq || a.head() != f.pos() {
            if since.elapsed() > QUIESCE_LIMIT || self.stopping() {
                return Err(format!(
                    "the server did not apply up to seq {seq} within {QUIESCE_LIMIT:?} (at {})",
                    f.applied()
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let entry = self
            .store()
            .range(seq, 1)
            .map_err(|e| e.to_string())?
            .into_iter()
            .next()
            .filter(|(s, _)| *s == seq)
            .ok_or_else(|| format!("seq {seq} is not in the log"))?
            .1
            .header();
        let at = Position {
            seq,
            view: entry.view,
            time_us: entry.time_us,
        };
        let node_dir = self.config.node_data_dir(self.me);
        let dir = snapshot_dir(&node_dir, seq);
        if files::verify(&dir, &|_| None).is_ok() {
            return Ok(seq);
        }
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let taken = image
            .take(&dir, at)
            .map_err(|e| format!("{e:#}"))
            .and_then(|ids| files::complete(&dir, at, ids).map_err(|e| e.to_string()));
        if let Err(e) = taken {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        prune(&node_dir);
        Ok(seq)
    }
}

/// Removes all but the newest [`KEPT`] complete snapshots, and incomplete
/// ones older than the newest complete one (a crash while taking).
fn prune(node_dir: &Path) {
    let mut complete = 0;
    for (_, dir) in files::list(node_dir) {
        let done = dir.join(files::META_FILE).exists();
        if done && complete < KEPT {
            complete += 1;
            continue;
        }
        if complete > 0 {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}
