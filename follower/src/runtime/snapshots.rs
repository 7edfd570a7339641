//! The snapshot thread: carries out the snapshot rules
//! ([`crate::protocol::snapshot`]) on what the members report (their
//! status over the control channel): images this node's server when it is
//! its turn ([`ServerImage::take`] at a turn boundary the apply thread
//! stops at), deletes the log a majority's snapshots cover, and installs
//! a peer's snapshot when this node's log ends before what its peers keep.
//! The peer side of a transfer is served by `control_server`.
//!
//! Nothing runs without an image implementation (`Node::start_with_image`)
//! or with `snapshot = "off"`: the log is then kept and replayed whole.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use lockstep_common::config::SnapshotMode;
use lockstep_common::control::{self, NodeStatus, Request, Response};
use lockstep_common::entry::SAME_TURN;

use crate::protocol::snapshot::{self as rules, Every, Member};
use crate::protocol::Event;
use crate::snapshot::catalog::Catalog;
use crate::snapshot::transfer::{self, ChunkSource};
use crate::snapshot::{sum_files, write_meta, Meta, Position, ServerImage};
use crate::store::LogEnd;

use super::node::Carried;
use super::Node;

/// How often the rules run.
const PERIOD: Duration = Duration::from_secs(1);
/// How long a peer's status may take.
const STATUS_TIMEOUT: Duration = Duration::from_millis(500);
/// How long the server may take to apply up to the snapshot's seq.
const QUIESCE_PATIENCE: Duration = Duration::from_secs(30);
/// The `apply_cap` word while a snapshot asks the apply thread to stop.
pub(super) const PAUSE: u64 = u64::MAX;
/// Complete snapshots a node keeps (the newest and one before it).
const KEEP: usize = 2;

/// This node's snapshot state, for its status and the rules.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SnapshotState {
    /// Seq of the newest complete snapshot (0: none).
    pub(crate) newest: u64,
    /// Imaging the server now.
    pub(crate) taking: bool,
    /// Bytes the apply thread had fed when the newest snapshot was taken.
    pub(crate) bytes_at: u64,
}

impl Node {
    /// Runs the snapshot rules every [`PERIOD`] until the node stops.
    pub(super) fn snapshot_loop(&self) {
        let Some(image) = self.image.as_deref() else {
            if self.config.snapshot == SnapshotMode::Process {
                log::warn!(
                    "node {}: snapshots are off: this follower has no process image support; the log is kept and replayed whole",
                    self.me
                );
            }
            return;
        };
        if self.config.snapshot == SnapshotMode::Off {
            return;
        }
        let every = Every {
            entries: self.config.snapshot_every.entries,
            bytes: self.config.snapshot_every.bytes,
        };
        while !self.stopping() {
            std::thread::sleep(PERIOD);
            let members = self.members();
            if rules::taker(&members, every) == Some(self.me) {
                if let Err(e) = self.take_snapshot(image) {
                    log::warn!("node {}: snapshot failed: {e:#}", self.me);
                }
            }
            self.compact(&members);
            let last = self.store().last().seq;
            if let Some(peer) = rules::install_source(self.me, last, &members) {
                if let Err(e) = self.install_from(peer, image) {
                    log::warn!("node {}: installing node {peer}'s snapshot: {e:#}", self.me);
                }
            }
        }
    }

    /// Every member's state: this node's own, the peers' from their status.
    fn members(&self) -> Vec<Member> {
        let own = self.status();
        self.config
            .ids()
            .map(|id| {
                if id == self.me {
                    return member_of(&own, true);
                }
                match self.peer_status(id) {
                    Ok(st) => member_of(&st, true),
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

    fn peer_status(&self, peer: u64) -> anyhow::Result<NodeStatus> {
        let mut s = self.control_connect(peer, STATUS_TIMEOUT)?;
        s.set_read_timeout(Some(STATUS_TIMEOUT))?;
        control::send_json(&mut s, &Request::Status)?;
        match control::recv_json::<Response>(&mut s)? {
            Response::Status(st) => Ok(st),
            other => bail!("node {peer} answered {other:?}"),
        }
    }

    /// Images this node's server at the end of the turn the apply thread
    /// reached, and records it in the catalog.
    fn take_snapshot(&self, image: &dyn ServerImage) -> anyhow::Result<()> {
        self.snapshot_state().taking = true;
        let r = self.take_paused(image);
        self.apply_cap.store(0, Ordering::Release);
        if let Some(t) = self.applier.get() {
            t.unpark();
        }
        let mut st = self.snapshot_state();
        st.taking = false;
        let meta = r?;
        st.newest = meta.position.seq;
        st.bytes_at = self.applied_bytes.load(Ordering::Relaxed);
        drop(st);
        let deleted = self.catalog.clean(KEEP)?;
        log::info!(
            "node {}: snapshot at seq {} ({} bytes); deleted older ones {deleted:?}",
            self.me,
            meta.position.seq,
            meta.bytes()
        );
        Ok(())
    }

    fn take_paused(&self, image: &dyn ServerImage) -> anyhow::Result<Meta> {
        self.apply_cap.store(PAUSE, Ordering::Release);
        if let Some(t) = self.applier.get() {
            t.unpark();
        }
        let since = Instant::now();
        // The apply thread answers with what it fed; the snapshot goes to
        // the end of that turn (the server stops only between turns).
        let fed = loop {
            let cap = self.apply_cap.load(Ordering::Acquire);
            if cap != PAUSE {
                break cap;
            }
            if since.elapsed() > QUIESCE_PATIENCE || self.stopping() {
                bail!("the apply thread did not pause");
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        let upto = loop {
            if let Some(end) = self.turn_end(fed)? {
                break end;
            }
            if since.elapsed() > QUIESCE_PATIENCE || self.stopping() {
                bail!("the turn at seq {fed} did not end in the stored log");
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        self.apply_cap.store(upto.max(1), Ordering::Release);
        if let Some(t) = self.applier.get() {
            t.unpark();
        }
        while self.replica().applied() < upto {
            if since.elapsed() > QUIESCE_PATIENCE || self.stopping() {
                bail!("the server did not apply up to seq {upto}");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let h = self
            .store()
            .get(upto)?
            .with_context(|| format!("entry {upto} is not in the log"))?
            .header();
        let position = Position {
            seq: upto,
            view: h.view,
            time_us: h.time_us,
        };
        let dir = self.catalog.dir_of(upto);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let taken = image.take(&dir, position).and_then(|build_ids| {
            let meta = Meta {
                position,
                build_ids,
                files: sum_files(&dir)?,
                lockstep_version: env!("CARGO_PKG_VERSION").into(),
            };
            write_meta(&dir, &meta)?;
            Ok(meta)
        });
        if taken.is_err() {
            let _ = self.catalog.drop_incomplete(upto);
        }
        taken
    }

    /// The last seq of the turn that `seq` is in (None: the stored log
    /// ends before the turn is known to end).
    fn turn_end(&self, seq: u64) -> anyhow::Result<Option<u64>> {
        let store = self.store();
        let mut end = seq;
        loop {
            match store.get(end + 1)? {
                Some(e) if e.header().flags & SAME_TURN != 0 => end += 1,
                Some(_) => return Ok(Some(end)),
                None => return Ok(None),
            }
        }
    }

    /// Deletes the log up to what the rules allow.
    fn compact(&self, members: &[Member]) {
        let point = rules::compaction_point(self.me, members);
        let mut store = self.store();
        if point < store.oldest() {
            return;
        }
        match store.compact_through(point) {
            Ok(n) => log::info!(
                "node {}: deleted {n} log entries up to seq {point} (a majority's snapshots cover them)",
                self.me
            ),
            Err(e) => log::warn!("node {}: compacting the log up to {point}: {e}", self.me),
        }
    }

    /// Installs `peer`'s newest snapshot and restores this node's server
    /// from it; the log then starts after it (fetched from peers).
    fn install_from(&self, peer: u64, image: &dyn ServerImage) -> anyhow::Result<()> {
        let have = self.store().last().seq.max(self.snapshot_state().newest);
        let local = crate::snapshot::build_id::local(self.config.server.as_deref());
        let mut src = PeerSource { node: self, peer };
        let got = transfer::install(&self.catalog, &mut src, have, &local)?;
        let at = got.snapshot.meta.position;
        log::info!(
            "node {}: installed node {peer}'s snapshot at seq {} ({} bytes fetched)",
            self.me,
            at.seq,
            got.fetched
        );
        image.restore(&got.snapshot.dir, at)?;
        self.store().restart_after(LogEnd {
            seq: at.seq,
            view: at.view,
            end_pos: 0,
        })?;
        self.snapshot_state().newest = at.seq;
        // The apply thread starts a new stream after the image's seq, the
        // reader from the new log end.
        self.refeed.store(true, Ordering::Release);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.step(Event::Applied { seq: at.seq }, Carried::Nothing);
        Ok(())
    }

    pub(crate) fn snapshot_state(&self) -> std::sync::MutexGuard<'_, SnapshotState> {
        self.snapshots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Serves `SnapshotMeta`: the newest complete snapshot's `meta.json`.
    pub(super) fn newest_snapshot_meta(&self) -> Response {
        match Catalog::newest(&self.catalog) {
            Ok(Some(s)) => match serde_json::to_string(&s.meta) {
                Ok(text) => Response::Snapshot(Some((s.meta.position.seq, text))),
                Err(e) => Response::Error(e.to_string()),
            },
            Ok(None) => Response::Snapshot(None),
            Err(e) => Response::Error(e.to_string()),
        }
    }
}

/// A member's state as its status tells it.
fn member_of(st: &NodeStatus, live: bool) -> Member {
    Member {
        node: st.node,
        live,
        leader: st.role == "leader",
        backup: st.role == "backup",
        taking: st.snapshotting,
        applied: st.applied,
        last: st.persisted,
        committed: st.committed,
        oldest: st.oldest,
        snapshot: st.snapshot,
        bytes_since: st.bytes_since_snapshot,
    }
}

/// A peer's newest snapshot over the control channel.
struct PeerSource<'a> {
    node: &'a Node,
    peer: u64,
}

impl ChunkSource for PeerSource<'_> {
    fn meta(&mut self) -> anyhow::Result<Option<Meta>> {
        let mut s = self.node.control_connect(self.peer, STATUS_TIMEOUT)?;
        control::send_json(&mut s, &Request::SnapshotMeta)?;
        match control::recv_json::<Response>(&mut s)? {
            Response::Snapshot(None) => Ok(None),
            Response::Snapshot(Some((_, text))) => Ok(Some(serde_json::from_str(&text)?)),
            other => bail!("node {} answered {other:?}", self.peer),
        }
    }

    fn chunk(&mut self, seq: u64, file: &str, offset: u64, len: u32) -> anyhow::Result<Vec<u8>> {
        // One connection per chunk: a broken one costs one chunk.
        let mut s = self.node.control_connect(self.peer, STATUS_TIMEOUT)?;
        let req = Request::SnapshotChunk {
            seq,
            file: file.into(),
            offset,
            len,
        };
        control::send_json(&mut s, &req)?;
        Ok(control::recv_snapshot_chunk(&mut s)?)
    }
}
