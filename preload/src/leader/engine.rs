//! The leader's replication path: turn one input into entries in the local
//! ring, post the same bytes to every peer, and let the server act on it
//! only as the cluster's commit discipline allows.
//!
//! One writer per process behind a mutex (the sequence lock): it holds the
//! cluster's [`LeaderWriter`] (ring position, next seq, flow control, the
//! append and post of every entry) and a pre-sized gather buffer, so the
//! steady state allocates nothing. Waiting for acks happens outside the
//! lock, in [`leader_writer::wait_until`]; what this module adds to the
//! writer is the preload's own: fencing checks, the follower-alive probe,
//! bounded apply lag, the commit disciplines and the hand-over word.
//!
//! # Commit disciplines
//!
//! - `input` (APUS): [`Engine::replicate`] returns once a majority stored
//!   the input; only then does the server see it.
//! - `output` (default): [`Engine::replicate`] returns as soon as the input
//!   is in the local ring and posted to the peers; the server acts on it at
//!   once. [`Engine::wait_output`] runs before every externally visible act
//!   on a client connection and waits until a majority stored *every* input
//!   appended so far (the server is single-threaded: any reply may depend
//!   on any earlier input). After a burst of N inputs the first reply waits
//!   once, the other N-1 find the commit point already past them; replies
//!   written before the commit on a loop thread are held instead and wait
//!   together when the turn ends (`held_output`).
//!
//! Either way the commit point never passes what the server was handed
//! (the region's hand-over word), so a deposed leader knows exactly which
//! of its view's inputs its server consumed.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use lockstep_common::apply_lag::{self, Gate};
use lockstep_common::config::CommitMode;
use lockstep_common::entry::{EntryHeader, Kind};
use lockstep_common::leader_writer::{
    self, AckMajority, AppendError, AppendHooks, LeaderWriter, Waited,
};
use lockstep_common::region::{Region, Role};
use lockstep_common::transport::{self, Transport, TransportError};
use lockstep_common::Config;

use crate::leader::entry_tags::AppendTags;
use crate::sys;

/// How long one park on the doorbell lasts before the wait loop looks at
/// role, view and fencing again (those changes do not all ring the bell).
const PARK: Duration = Duration::from_millis(5);
/// A wait this long gets a warning (and another one every such period).
const SLOW_WAIT: Duration = Duration::from_secs(5);
/// Parked this long, the wait loop also checks that the local follower
/// still runs (one lock probe per park): without it no view change ever
/// reaches this node, and the server must not wait forever, for it would
/// never get back to its event loop, not even to handle SIGTERM.
const OWNER_CHECK_AFTER: Duration = Duration::from_millis(100);

/// Why an input could not be replicated. Either way the connection fails;
/// the server never sees the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fail {
    /// This node stopped leading, or its view changed, or a peer is in a
    /// newer view.
    Lost(&'static str),
    /// Something that should not happen (a bug or a broken region).
    Internal(String),
}

impl std::fmt::Display for Fail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fail::Lost(why) => write!(f, "{why}"),
            Fail::Internal(why) => write!(f, "internal error: {why}"),
        }
    }
}

/// What one replicated input produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Logged {
    /// Seq of its first entry (the conn id of an ACCEPT).
    pub first: u64,
    /// Seq of its last entry.
    pub last: u64,
    /// View it was written in.
    pub view: u64,
}

struct Writer {
    /// Ring position, next seq, flow control; started for each new view.
    log: LeaderWriter,
    /// Payload gathered from several buffers (`max_entry`).
    gather: Vec<u8>,
    /// The server thread's event-loop turn at the last append (see
    /// `entry::SAME_TURN`).
    turn: Option<(usize, u64)>,
    /// The last entry belongs to a turn whose end is not logged (a turn's
    /// `TICK` or a `TIME` end marker closes it, and so does any entry of a
    /// later turn).
    open: bool,
}

/// A node's attached preload: config, region, transport and the writer.
pub struct Engine {
    /// This node's id.
    pub me: u64,
    /// The cluster config.
    pub config: Config,
    /// This node's `app` address.
    pub app: SocketAddr,
    /// This node's region.
    pub region: Arc<Region>,
    transport: Box<dyn Transport>,
    /// The members whose acks (and applied marks) count.
    majority: AckMajority,
    max_entry: usize,
    writer: Mutex<Writer>,
    /// The cluster's commit discipline.
    mode: CommitMode,
    /// Last seq appended, and the view it was appended in (written under
    /// the writer lock, read by [`Engine::wait_output`] without it).
    appended: AtomicU64,
    appended_view: AtomicU64,
    /// Highest seq this process has seen a majority store in
    /// `appended_view`: outputs covered by it pass without looking at the
    /// ack array.
    released: AtomicU64,
    /// Entries appended since the last [`Engine::post`]: the writer
    /// defers its wake-ups (see `LeaderWriter::defer_posts`).
    unposted: AtomicU64,
}

/// Appended entries wait at most this many for a post: a turn that reads
/// many inputs (or a busy script logging clock records) lets the
/// followers store them while it goes on.
const POST_EVERY: u64 = 32;

impl Engine {
    /// Sets up the writer and opens the transport (which does no I/O yet).
    pub fn new(config: Config, me: u64, region: Arc<Region>) -> Result<Engine, String> {
        let app = config.node(me).map_err(|e| e.0)?.app;
        let transport = transport::open(&config, me, region.clone()).map_err(|e| e.to_string())?;
        let max_entry = config.max_entry as usize;
        let mut log = LeaderWriter::for_node(&config, me);
        log.defer_posts();
        let writer = Writer {
            log,
            gather: vec![0; max_entry],
            turn: None,
            open: false,
        };
        Ok(Engine {
            me,
            majority: writer.log.majority().clone(),
            app,
            region,
            transport,
            max_entry,
            writer: Mutex::new(writer),
            mode: config.commit,
            appended: AtomicU64::new(0),
            appended_view: AtomicU64::new(0),
            released: AtomicU64::new(0),
            unposted: AtomicU64::new(0),
            config,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Writer> {
        // A panic while holding the lock leaves the writer consistent at
        // entry granularity (seq is bumped only after a complete append).
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Checks that this node still leads `view`.
    fn check(&self, view: u64) -> Result<(), Fail> {
        if self.region.role() != Role::Leader {
            return Err(Fail::Lost("this node is no longer the leader"));
        }
        if self.region.view() != view {
            return Err(Fail::Lost("the view changed"));
        }
        if self.transport.fenced_by() > view {
            return Err(Fail::Lost("a peer is in a newer view"));
        }
        Ok(())
    }

    /// The view this leader writes in, setting the writer up from the
    /// follower's hand-off when the view is new to it.
    fn writer_view(&self, w: &mut Writer) -> Result<u64, Fail> {
        if self.region.role() != Role::Leader {
            return Err(Fail::Lost("this node is not the leader"));
        }
        if self.region.handover_fenced() {
            return Err(Fail::Lost("this node stopped serving"));
        }
        let view = self.region.view();
        if self.transport.fenced_by() > view {
            return Err(Fail::Lost("a peer is in a newer view"));
        }
        if w.log.view() != view {
            let (seq, pos) = self.region.writer_start();
            w.log.start(view, seq, pos);
            w.turn = None;
            w.open = false;
            self.released.store(0, Ordering::Release);
            log::info!(
                "leading view {view}: next seq {} at ring position {pos}",
                w.log.next_seq()
            );
        }
        Ok(view)
    }

    /// Replicates one input: `segments` (`total` bytes, split into entries
    /// of at most `max_entry`) for DATA, nothing for ACCEPT/CLOSE. Returns
    /// once the server may have the input: in input mode once a majority
    /// stored every entry (commit index raised), in output mode once it is
    /// in the local ring and posted to the peers.
    pub fn replicate(
        &self,
        kind: Kind,
        conn: u64,
        out_hash: u64,
        segments: &[&[u8]],
        total: usize,
    ) -> Result<Logged, Fail> {
        let logged = self.append(kind, conn, out_hash, segments, total, None)?;
        self.hand_over(logged)
    }

    /// Replicates a turn of event loop `loop_id` that moved the log's time
    /// to `time_us` and read no input (a `TICK`), as an input.
    pub fn replicate_tick(&self, time_us: u64, loop_id: u64) -> Result<Logged, Fail> {
        let logged = self.append(Kind::Tick, loop_id, 0, &[], 0, Some(time_us))?;
        self.hand_over(logged)
    }

    /// Replicates a clock record of the calling thread's turn: its `k`-th
    /// read of the current window reads `time_us` (see `turn_time`). The
    /// server reads that value once this returns, as it would an input.
    pub fn replicate_time(&self, k: u32, time_us: u64) -> Result<Logged, Fail> {
        let logged = self.append(Kind::Time, u64::from(k), 0, &[], 0, Some(time_us))?;
        self.hand_over(logged)
    }

    /// Replicates the calling thread's `k`-th read of its window being a
    /// poll for children that reaped `child` (a clock record naming it;
    /// see `turn_time`). The server acts on the child's end once this
    /// returns, as on an input.
    pub fn replicate_child(
        &self,
        k: u32,
        time_us: u64,
        child: crate::determinism::turn_time::Child,
    ) -> Result<Logged, Fail> {
        let payload = child.encode();
        let logged = self.append(
            Kind::Time,
            u64::from(k),
            0,
            &[&payload],
            payload.len(),
            Some(time_us),
        )?;
        self.hand_over(logged)
    }

    /// The calling loop thread is about to block: when the last logged
    /// turn's end is not in the log yet, logs it (a `TIME` entry with read
    /// index 0), so that a backup's server knows no more clock records of
    /// that turn come. The caller holds the turn lock: no other turn's
    /// entry can come between. Returns whether it logged one.
    pub fn close_turn(&self) -> bool {
        let mut guard = self.lock();
        let w = &mut *guard;
        if !w.open || self.writer_view(w).is_err() {
            return false;
        }
        let view = w.log.view();
        let fields = crate::leader::entry_tags::turn_end(
            view,
            crate::determinism::clock::now_us(true, || 0).unwrap_or(0),
            crate::determinism::clock::turn_loop(),
        );
        if self.append_one(&mut w.log, view, &fields, &[]).is_err() {
            return false;
        }
        w.open = false;
        let last = w.log.next_seq() - 1;
        self.note_appended(view, last);
        let _ = self.hand_over(Logged {
            first: last,
            last,
            view,
        });
        true
    }

    /// The last seq appended, in `view` (what `wait_output` waits for).
    fn note_appended(&self, view: u64, last: u64) {
        self.appended_view.store(view, Ordering::Release);
        self.appended.store(last, Ordering::Release);
    }

    /// Whether the last logged turn's end is not in the log yet.
    pub fn turn_open(&self) -> bool {
        self.lock().open
    }

    /// The server may have what was `logged` once this returns (see
    /// `replicate`).
    fn hand_over(&self, logged: Logged) -> Result<Logged, Fail> {
        if self.mode == CommitMode::Input {
            self.wait_majority(logged.last, logged.view)?;
        }
        // The follower may have stopped this node leading meanwhile; what
        // it fenced out never reaches the server, so it knows exactly
        // what the server consumed.
        if !self.region.hand_over(logged.last) {
            return Err(Fail::Lost("this node stopped leading"));
        }
        if self.mode == CommitMode::Input {
            self.release(logged.last);
        }
        Ok(logged)
    }

    /// Output mode: returns once a majority stored every input appended so
    /// far, so that the server may act outside (reply, close). Fails when
    /// this node stops leading meanwhile: that output must never be
    /// released. Input mode: every input was committed before the server
    /// saw it, so this returns at once.
    pub fn wait_output(&self) -> Result<(), Fail> {
        if self.output_free() {
            return Ok(());
        }
        self.wait_released(self.appended_mark())
    }

    /// The last seq appended and its view: what output produced so far
    /// may depend on (see [`Engine::wait_output_upto`]).
    pub fn appended_mark(&self) -> (u64, u64) {
        let view = self.appended_view.load(Ordering::Acquire);
        (self.appended.load(Ordering::Acquire), view)
    }

    /// [`Engine::wait_output`] for output that depends on no input past
    /// `mark` (an [`Engine::appended_mark`] taken before): inputs other
    /// loops appended since are not waited for.
    pub fn wait_output_upto(&self, mark: (u64, u64)) -> Result<(), Fail> {
        if self.released_upto(mark) {
            return Ok(());
        }
        self.wait_released(mark)
    }

    /// Whether output depending on no input past `mark` may leave
    /// without asking the acks: input mode, nothing appended, or released
    /// already in the same view.
    fn released_upto(&self, (seq, view): (u64, u64)) -> bool {
        self.mode == CommitMode::Input
            || seq == 0
            || (view == self.appended_view.load(Ordering::Acquire)
                && self.released.load(Ordering::Acquire) >= seq)
    }

    /// [`Engine::wait_output_upto`] without the wait: Some(Ok) when output
    /// depending on no input past `mark` may leave now, Some(Err) when it
    /// never may (this node stopped leading that view), None when a
    /// majority has not stored it yet.
    pub fn try_output_upto(&self, (seq, view): (u64, u64)) -> Option<Result<(), Fail>> {
        if self.released_upto((seq, view)) {
            return Some(Ok(()));
        }
        if self.acked(seq) {
            self.release(seq);
            return Some(Ok(()));
        }
        self.check(view).err().map(Err)
    }

    /// Waits until a majority stored everything up to `mark` (seq, view),
    /// then releases output up to it.
    fn wait_released(&self, (seq, view): (u64, u64)) -> Result<(), Fail> {
        self.wait_majority(seq, view)?;
        self.release(seq);
        Ok(())
    }

    /// Whether output may leave now without a wait: input mode, or a
    /// majority stored every input appended so far (see `wait_output`).
    pub fn output_free(&self) -> bool {
        if self.mode == CommitMode::Input {
            return true;
        }
        let seq = self.appended.load(Ordering::Acquire);
        // The released mark is reset (under the writer lock) before any
        // seq of a new view is appended.
        seq == 0 || self.released.load(Ordering::Acquire) >= seq
    }

    /// Records that a majority stored everything up to `seq` and raises the
    /// commit word, never past what the server was handed (an input whose
    /// hand-over was fenced is not the server's, and stays uncommitted
    /// here; the next view decides about it).
    fn release(&self, seq: u64) {
        self.released.fetch_max(seq, Ordering::AcqRel);
        self.region.raise_commit(seq.min(self.region.served()));
    }

    fn append(
        &self,
        kind: Kind,
        conn: u64,
        out_hash: u64,
        segments: &[&[u8]],
        total: usize,
        time: Option<u64>,
    ) -> Result<Logged, Fail> {
        let mut guard = self.lock();
        let w = &mut *guard;
        let view = self.writer_view(w)?;
        let first = w.log.next_seq();
        // The turn's time: recorded with the entry (see `clock`).
        let time_us =
            time.unwrap_or_else(|| crate::determinism::clock::entry_time(sys::realtime_us()));
        // Whether a backup may hand this input to its server in the same
        // turn as the entry before (a later chunk of one read always may).
        let here = crate::determinism::turns::current();
        let mut tags = AppendTags::new(
            kind,
            view,
            conn,
            out_hash,
            time_us,
            here,
            &mut w.turn,
            crate::determinism::clock::turn_loop(),
            || crate::determinism::turns::log_turn(view),
        )
        .returned(
            matches!(kind, Kind::Data | Kind::Close)
                && crate::determinism::stack_depth::read_returned(),
        );
        let Writer { log, gather, .. } = w;
        let mut one = |payload: &[u8]| self.append_one(log, view, tags.entry(), payload);
        if kind == Kind::Data {
            for_each_chunk(segments, total, self.max_entry, gather, one)?;
        } else {
            // A clock record naming a child carries it (one small segment).
            one(segments.first().copied().unwrap_or(&[]))?;
        }
        let last = w.log.next_seq() - 1;
        // A turn's TICK is appended as it ends: it closes the turn.
        w.open = kind != Kind::Tick;
        self.note_appended(view, last);
        if matches!(kind, Kind::Accept | Kind::Data | Kind::Close) {
            // The server's clock reads count from this input on.
            crate::determinism::clock::input_logged();
        }
        Ok(Logged { first, last, view })
    }

    /// Appends one entry (`fields`: its kind, conn, digest, flags, time
    /// and loop) through the writer, once the apply lag allows.
    fn append_one(
        &self,
        log: &mut LeaderWriter,
        view: u64,
        fields: &EntryHeader,
        payload: &[u8],
    ) -> Result<(), Fail> {
        self.wait_applied(log.next_seq(), view)?;
        let mut hooks = LeaderHooks { engine: self, view };
        let posted = log
            .append(&self.region, &*self.transport, fields, payload, &mut hooks)
            .map_err(|e| match e {
                AppendError::Room(fail) => fail,
                AppendError::Fenced(_) => Fail::Lost("a peer is in a newer view"),
                e => Fail::Internal(e.to_string()),
            })?;
        if self.unposted.fetch_add(1, Ordering::AcqRel) + 1 >= POST_EVERY {
            self.post();
        }
        log::trace!(
            "appended {:?} seq {} conn {} ({} bytes)",
            fields.kind,
            posted.seq,
            posted.conn,
            payload.len()
        );
        Ok(())
    }

    /// Wakes the followers for what was appended since the last post (see
    /// `LeaderWriter::defer_posts`): before any wait for them, and when
    /// the server's loop is about to block. Needs no writer lock.
    pub fn post(&self) {
        if self.unposted.swap(0, Ordering::AcqRel) != 0 {
            leader_writer::post(&self.region, &*self.transport);
        }
    }

    /// Whether a majority (this node included) acknowledged `seq`.
    pub fn acked(&self, seq: u64) -> bool {
        self.majority.has_acked(&self.region, seq)
    }

    /// Waits until a majority acknowledged `seq`, failing when this node
    /// stops leading `view` meanwhile.
    pub fn wait_majority(&self, seq: u64, view: u64) -> Result<(), Fail> {
        self.wait_until(seq, view, Waiting::Acks, || self.acked(seq))
    }

    /// Bounded apply lag: before appending `seq`, waits until a majority of
    /// the cluster (this node, whose server has everything, included) has
    /// applied up to `seq - max_apply_lag`, so a failover never inherits a
    /// longer backlog. Only backups that can apply count (a server
    /// attached, reports coming: see `apply_lag`); when fewer than a
    /// majority can, nothing is held (the follower says the backlog grows).
    fn wait_applied(&self, seq: u64, view: u64) -> Result<(), Fail> {
        let lag = self.config.max_apply_lag;
        if lag == 0 || seq <= lag {
            return Ok(());
        }
        let Gate::Hold(floor) = self.apply_gate(seq) else {
            return Ok(());
        };
        self.wait_until(floor, view, Waiting::Apply, || {
            !matches!(self.apply_gate(seq), Gate::Hold(_))
        })
    }

    /// The `max_apply_lag` rule for appending `seq`, over the backups'
    /// applied marks and which of them can apply (published by this node's
    /// follower).
    fn apply_gate(&self, seq: u64) -> Gate {
        let able = self.region.appliers();
        let backups = self.majority.ids().iter().filter(|&&id| id != self.me);
        apply_lag::gate(
            seq,
            self.config.max_apply_lag,
            self.majority.need(),
            backups.map(|&id| (self.region.applied_by(id), able & apply_lag::bit(id) != 0)),
        )
    }

    /// Waits until `done()`, failing when this node stops leading `view`
    /// or its follower is gone.
    fn wait_until(
        &self,
        seq: u64,
        view: u64,
        what: Waiting,
        done: impl FnMut() -> bool,
    ) -> Result<(), Fail> {
        self.post();
        let mut warned_at = Duration::ZERO;
        leader_writer::wait_until(&self.region, PARK, done, |waited| {
            let Waited::Parked(waited) = waited else {
                return self.check(view);
            };
            if waited >= OWNER_CHECK_AFTER && !self.region.owner_alive() {
                // Without its follower this node can neither ack nor
                // change views: it stops serving this view for good.
                // Should a majority still store this input, no later
                // one commits it behind the server's back (they all
                // fail before being logged), and the next view drops
                // it: the fence keeps `served` exact.
                let served = self.region.fence_handover();
                log::error!(
                    "seq {seq}: this node's follower is not running; failing the input and every later one (the server consumed up to seq {served}); restart the node"
                );
                return Err(Fail::Lost("this node's follower is not running"));
            }
            if waited >= warned_at + SLOW_WAIT {
                warned_at = waited;
                match what {
                    Waiting::Acks => log::warn!(
                        "seq {seq} not acknowledged by a majority after {waited:.0?} (acks: {})",
                        AckList(self)
                    ),
                    Waiting::Apply => log::warn!(
                        "waiting {waited:.0?} for a majority to apply up to seq {seq} (max_apply_lag {})",
                        self.config.max_apply_lag
                    ),
                }
            }
            Ok(())
        })
    }
}

/// The engine's side of an append: waiting for room is waiting for the
/// majority in the writer's view (with every check of `wait_until`), and
/// a peer that cannot be written is reported once.
struct LeaderHooks<'a> {
    engine: &'a Engine,
    view: u64,
}

impl AppendHooks for LeaderHooks<'_> {
    type Error = Fail;

    fn wait_for_room(&mut self, seq: u64) -> Result<(), Fail> {
        self.engine.wait_majority(seq, self.view)
    }

    fn peer_missed(&mut self, node: u64, error: &TransportError) {
        log::warn!("cannot write to node {node}: {error}");
    }
}

/// What a leader waits for.
#[derive(Clone, Copy)]
enum Waiting {
    Acks,
    Apply,
}

/// Formats the ack array for diagnostics.
struct AckList<'a>(&'a Engine);

impl std::fmt::Display for AckList<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, &id) in self.0.majority.ids().iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "node {id}: {}", self.0.region.ack(id))?;
        }
        Ok(())
    }
}

/// Calls `f` with consecutive chunks of at most `max` bytes covering the
/// first `total` bytes of `segments`; a chunk inside one segment is
/// borrowed, one spanning segments is gathered into `buf` (`max` bytes).
pub fn for_each_chunk(
    segments: &[&[u8]],
    total: usize,
    max: usize,
    buf: &mut [u8],
    mut f: impl FnMut(&[u8]) -> Result<(), Fail>,
) -> Result<(), Fail> {
    let short = || Fail::Internal("the read returned more bytes than its buffers hold".into());
    let mut seg = 0;
    let mut off = 0;
    let mut left = total;
    while left > 0 {
        let take = left.min(max);
        while seg < segments.len() && off == segments[seg].len() {
            seg += 1;
            off = 0;
        }
        let cur = *segments.get(seg).ok_or_else(short)?;
        if cur.len() - off >= take {
            f(&cur[off..off + take])?;
            off += take;
        } else {
            let mut got = 0;
            while got < take {
                while seg < segments.len() && off == segments[seg].len() {
                    seg += 1;
                    off = 0;
                }
                let s = *segments.get(seg).ok_or_else(short)?;
                let n = (s.len() - off).min(take - got);
                buf[got..got + n].copy_from_slice(&s[off..off + n]);
                got += n;
                off += n;
            }
            f(&buf[..take])?;
        }
        left -= take;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(segs: &[&[u8]], total: usize, max: usize) -> Result<Vec<Vec<u8>>, Fail> {
        let mut buf = vec![0; max];
        let mut out = Vec::new();
        for_each_chunk(segs, total, max, &mut buf, |c| {
            out.push(c.to_vec());
            Ok(())
        })?;
        Ok(out)
    }

    #[test]
    fn chunks_cover_exactly_the_bytes_read() {
        let data: Vec<u8> = (0..100u8).collect();
        let segs: Vec<&[u8]> = vec![&data[..10], &[], &data[10..55], &data[55..]];
        for max in [1, 7, 10, 45, 64, 100, 1000] {
            for total in [0, 1, 9, 10, 11, 54, 55, 99, 100] {
                let got = chunks(&segs, total, max).unwrap();
                assert!(got.iter().all(|c| !c.is_empty() && c.len() <= max));
                assert_eq!(got.concat(), &data[..total], "max {max} total {total}");
                assert_eq!(got.len(), total.div_ceil(max));
            }
        }
        assert!(chunks(&segs, 101, 64).is_err());
    }

    #[test]
    fn chunking_stops_at_the_first_failure() {
        let data = [1u8; 30];
        let mut buf = [0u8; 10];
        let mut calls = 0;
        let r = for_each_chunk(&[&data], 30, 10, &mut buf, |_| {
            calls += 1;
            if calls == 2 {
                Err(Fail::Lost("test"))
            } else {
                Ok(())
            }
        });
        assert_eq!(r, Err(Fail::Lost("test")));
        assert_eq!(calls, 2);
    }
}
