//! A simulated cluster: real [`Replica`]s over a deterministic network,
//! with the real leader writer into real rings.
//!
//! Each node has a stored log (kept across crashes; the lazily saved
//! commit and applied marks are lost up to the last save; each entry keeps
//! its ring position, the same on every node), a region, a server (the
//! inputs it consumed, in order) and a preload that appends client inputs
//! while the node leads (output commit: the server consumes an input at
//! once). The region is part real, part modelled: its ring, tail word,
//! writer hand-off and commit word are a real [`Memory`] (the commit word
//! kept equal to the modelled one); view, leader, role, acks, commit
//! record and the served mark with its fence are modelled. The leader's
//! preload appends with the real [`LeaderWriter`] (started at the
//! follower's hand-off when it leads a view it has not written in yet,
//! flow-controlled by a majority's acks: a small ring wraps, and an input
//! that finds it full is refused), and each follower reads its own ring
//! with the real [`RingReader`], as the runtime's poll loop does.
//! The network delivers the writer's one-sided writes in order per link
//! (it may lose them), and the followers' writes and control messages
//! after a delay, and may drop, duplicate (and so reorder) those or cut
//! links. ZooKeeper is an oracle: the lowest live, connected, non-stale
//! node is the candidate; views are claimed from one counter. With
//! `snapshot_every`, nodes image their servers, delete their logs' prefix
//! and install each other's images as their replicas decide (`images`);
//! a stored log then starts after its deleted part.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use lockstep_common::config::SnapshotEvery;
use lockstep_common::entry::{self, EntryHeader, Kind};
use lockstep_common::leader_writer::{AppendError, AppendHooks, LeaderWriter};
use lockstep_common::region::{self as words, Region as Memory, RegionSpec};
use lockstep_common::ring::{ReadOutcome, RingReader};
use lockstep_common::transport::{Transport, TransportError};
use lockstep_follower::protocol::replica::Restored;
use lockstep_follower::protocol::{
    commit, fence, Action, EntryMeta, Event, LeaderChoice, Message, Millis, Replica, ReplicaConfig,
    Role, Session, Words,
};

use crate::rng::Rng;

mod images;

pub use images::{SnapshotCounts, ROUND_MS};

/// Ring bytes per node: 128 entries (every entry takes 128 bytes), so
/// that long runs wrap and the writer's flow control takes part.
const RING_SIZE: u64 = 16 << 10;
/// The largest payload (a client value takes 8 bytes).
const MAX_ENTRY: usize = 64;
/// The connection every client input comes on (the sim has one client).
const CONN: u64 = 1;

/// One entry: seq, the view that wrote it, the client value (0: a
/// view-start entry), the commit point its header carries, and where it
/// lies in the ring (start and end position: the same on every node, as
/// the store keeps them) — enough to encode it again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub seq: u64,
    pub view: u64,
    pub value: u64,
    pub last_committed: u64,
    pub pos: u64,
    pub end: u64,
}

impl Entry {
    fn meta(&self) -> EntryMeta {
        EntryMeta {
            seq: self.seq,
            view: self.view,
            last_committed: self.last_committed,
        }
    }
}

/// Durable state (RocksDB).
#[derive(Clone, Debug, Default)]
pub struct Storage {
    /// The entries after `compacted`, in order.
    pub log: Vec<Entry>,
    /// Where the log starts (the store's `LogEnd` below its first entry):
    /// the last deleted entry's seq, view and end position ((0, 0, 0):
    /// nothing deleted). A log restarted after an installed image starts
    /// at the image's seq and view, at position 0, as the store's
    /// `restart_after` does.
    pub compacted: (u64, u64, u64),
    pub view: u64,
    pub log_view: u64,
    /// Saved lazily (on view start, and now and then).
    pub committed: u64,
}

impl Storage {
    /// Ring position just past the stored log (the runtime's
    /// `store.last().end_pos`).
    pub fn end(&self) -> u64 {
        self.log.last().map_or(self.compacted.2, |e| e.end)
    }

    /// The last stored seq and its view (the store's `last()`: the log's
    /// start when it holds no entry).
    pub fn last(&self) -> (u64, u64) {
        self.log
            .last()
            .map_or((self.compacted.0, self.compacted.1), |e| (e.seq, e.view))
    }

    /// Stored entry `seq` (None: never stored, cut, or deleted).
    pub fn get(&self, seq: u64) -> Option<&Entry> {
        let i = seq.checked_sub(self.compacted.0 + 1)?;
        self.log.get(i as usize)
    }

    /// Cuts the log after `after`, never into its deleted part (only
    /// committed entries are deleted, and none of them is ever cut).
    fn truncate_after(&mut self, after: u64) {
        assert!(
            after >= self.compacted.0,
            "cutting the log after {after}, inside its deleted part (up to {})",
            self.compacted.0
        );
        self.log.truncate((after - self.compacted.0) as usize);
    }

    /// Deletes the entries up to `through` (the store's `compact_through`:
    /// the saved commit point is at least `through` then).
    pub fn compact_through(&mut self, through: u64) {
        self.committed = self.committed.max(through);
        let n = through.saturating_sub(self.compacted.0) as usize;
        if n == 0 {
            return;
        }
        let n = n.min(self.log.len());
        if let Some(e) = self.log.drain(..n).next_back() {
            self.compacted = (e.seq, e.view, e.end);
        }
    }

    /// Drops the log: it starts after `seq` of `view` (the store's
    /// `restart_after`, after an installed image).
    pub fn restart_after(&mut self, seq: u64, view: u64) {
        self.committed = self.committed.max(seq);
        self.log.clear();
        self.compacted = (seq, view, 0);
    }
}

/// The region's words, modelled (the ring, the tail and the writer's
/// hand-off are in the node's real region, [`Node::memory`], whose commit
/// word and its view tag follow `commit` and `commit_record`: the writer
/// reads them there).
#[derive(Clone, Debug, Default)]
pub struct Region {
    pub view: u64,
    pub leader: u64,
    pub role: Option<Role>,
    pub commit: u64,
    pub commit_record: (u64, u64),
    pub acks: BTreeMap<u64, u64>,
    pub served: u64,
    pub fenced: bool,
    pub fenced_by: u64,
}

/// One node.
pub struct Node {
    pub id: u64,
    pub replica: Option<Replica>,
    pub storage: Storage,
    pub region: Region,
    /// The real region: its ring, tail word and writer hand-off (and the
    /// commit word, kept equal to the modelled one).
    pub memory: Memory,
    /// The preload's writer: appends while the node leads.
    writer: LeaderWriter,
    /// The follower's ring reader (None: to be made again from the stored
    /// log's end, as the runtime does when its epoch moves).
    reader: Option<RingReader>,
    /// The reader's position after its last empty read (`u64::MAX`: it
    /// read entries), for `tail_ahead`, as the runtime's `stalled_at`.
    stalled_at: u64,
    /// Inputs the server consumed, in order: (seq, view, value).
    pub server: Vec<(u64, u64, u64)>,
    pub server_alive: bool,
    pub stale: bool,
    /// Its images (see `images`).
    pub snapshots: images::Snapshots,
    pending: Vec<Entry>,
    /// What the safety checks already covered (they run after every step,
    /// so each looks only at what changed since):
    checked: Checked,
}

/// Watermarks of the incremental checks. Stored entries change only by
/// truncation (appends do not touch earlier seqs), committed entries
/// never change, servers only grow (or restart empty).
#[derive(Clone, Copy, Debug, Default)]
struct Checked {
    /// Every stored seq up to here agrees with the committed entry of that
    /// seq (where one exists).
    agree: u64,
    /// Every stored seq up to here was committed by this node before.
    recorded: u64,
    /// The server's first input not yet compared with a committed entry.
    applied: usize,
    /// (node, its server restarts, length): the server's first `length`
    /// inputs equal that node's server's.
    prefix_of: (u64, u64, usize),
    /// How often the server restarted empty.
    restarts: u64,
}

struct Host<'a> {
    storage: &'a Storage,
    region: &'a mut Region,
}

impl lockstep_follower::protocol::Host for Host<'_> {
    fn last(&self) -> (u64, u64) {
        self.storage.last()
    }
    fn view_at(&self, seq: u64) -> Option<u64> {
        // The entry a compacted log starts after is known by its view (the
        // store's `base_view_at`).
        let (base, view) = (self.storage.compacted.0, self.storage.compacted.1);
        if seq != 0 && seq == base {
            return Some(view);
        }
        self.storage.get(seq).map(|e| e.view)
    }
    fn fence_handover(&mut self) -> u64 {
        self.region.fenced = true;
        self.region.served
    }
}

/// What travels.
#[derive(Clone, Debug)]
enum Payload {
    /// The writer's one-sided writes into a peer's region (ring bytes, a
    /// wrap marker, the tail word), tagged with the writer's view.
    Write {
        offset: u64,
        bytes: Vec<u8>,
    },
    Ack(u64),
    CommitRecord(u64, u64),
    /// Control messages (fetch answers carry the entries).
    Control(Message, Vec<Entry>),
}

#[derive(Clone, Debug)]
struct Flight {
    at: Millis,
    from: u64,
    to: u64,
    view: u64,
    payload: Payload,
}

/// With `LOCKSTEP_SIM_TRACE` set, a failing run prints every event and
/// action first.
impl Drop for Cluster {
    fn drop(&mut self) {
        if self.tracing && std::thread::panicking() {
            for l in &self.trace {
                eprintln!("{l}");
            }
        }
    }
}

/// Fault rates (percent) and delays.
#[derive(Clone, Copy, Debug)]
pub struct Faults {
    pub drop: u64,
    pub duplicate: u64,
    pub max_delay: Millis,
}

impl Faults {
    pub const NONE: Faults = Faults {
        drop: 0,
        duplicate: 0,
        max_delay: 1,
    };
}

/// The cluster.
pub struct Cluster {
    pub now: Millis,
    pub nodes: Vec<Node>,
    pub election: LeaderChoice,
    flights: Vec<Flight>,
    pub faults: Faults,
    /// Cut links (unordered pairs); node 0 stands for ZooKeeper.
    pub cut: BTreeSet<(u64, u64)>,
    pub rng: Rng,
    zk_view: u64,
    zk_leader: Option<(u64, u64)>,
    /// id -> (znode order, last heard).
    sessions: BTreeMap<u64, (u64, Millis)>,
    znodes: u64,
    next_value: u64,
    /// (view, value) of every entry ever committed, by seq - 1 (commits
    /// cover every seq up to theirs).
    pub committed: Vec<(u64, u64)>,
    /// Where each committed entry lies in the ring (start, end): the same
    /// on every node that commits it, or a follower reading on from its
    /// log's end would look for the leader's next entry elsewhere.
    committed_at: Vec<(u64, u64)>,
    /// view -> its leader, for every view that started.
    pub started: BTreeMap<u64, u64>,
    pub session_timeout: Millis,
    pub trace: Vec<String>,
    pub tracing: bool,
    /// (writer, peer) -> when the last one-sided write on that link lands:
    /// later writes land no earlier (see [`Cluster::send_write`]).
    links: BTreeMap<(u64, u64), Millis>,
    /// Client inputs refused because the ring was full (a majority had
    /// not acked what the writer would overwrite).
    pub refused_full: u64,
    /// How much log between two snapshots (None: no snapshots).
    pub snapshot_every: Option<SnapshotEvery>,
    /// What the snapshots did so far.
    pub snapshot_counts: SnapshotCounts,
    /// The ring readers' buffer (kept: one allocation).
    read_buf: Vec<u8>,
}

/// The writer's transport: it keeps each one-sided write, which travels
/// as a flight once the append returned ([`Cluster::send_write`]); the
/// sim cannot tell at posting time whether a peer refuses it (a delivered
/// write of an older view is refused then, as a region server does).
struct Wire<'a> {
    local: &'a Memory,
    writes: Mutex<Vec<Posted>>,
}

/// A posted write: (node, view, offset, bytes).
type Posted = (u64, u64, u64, Vec<u8>);

impl Transport for Wire<'_> {
    fn write(&self, node: u64, view: u64, offset: u64, bytes: &[u8]) -> Result<(), TransportError> {
        let mut w = self.writes.lock().unwrap_or_else(|p| p.into_inner());
        w.push((node, view, offset, bytes.to_vec()));
        Ok(())
    }

    fn local(&self) -> &Memory {
        self.local
    }
}

/// Flow control: the sim cannot block, so room is there at once (a
/// majority acked the seq the writer waits for) or the input is refused.
struct Room {
    /// The highest seq a majority acked, as the writer's majority reads
    /// the modelled acks.
    acked: u64,
}

impl AppendHooks for Room {
    type Error = ();

    fn wait_for_room(&mut self, seq: u64) -> Result<(), ()> {
        if self.acked >= seq {
            Ok(())
        } else {
            Err(())
        }
    }
}

fn memory(id: u64) -> Memory {
    let spec = RegionSpec {
        cluster: "sim".into(),
        node: id,
        ring_size: RING_SIZE,
    };
    Memory::anonymous(&spec).expect("an anonymous region")
}

/// The client value an entry read from a ring carries (0: none).
fn value_of(header: &EntryHeader, bytes: &[u8]) -> u64 {
    let payload = &bytes[entry::HEADER_LEN..entry::HEADER_LEN + header.len as usize];
    match (header.kind, payload.try_into()) {
        (Kind::Data, Ok(b)) => u64::from_le_bytes(b),
        _ => 0,
    }
}

fn link(a: u64, b: u64) -> (u64, u64) {
    (a.min(b), a.max(b))
}

impl Cluster {
    /// `n` nodes, fresh, with `election`, without snapshots.
    pub fn new(n: u64, election: LeaderChoice, seed: u64) -> Cluster {
        Cluster::with_snapshots(n, election, seed, None)
    }

    /// `n` nodes, fresh, with `election`, taking snapshots as `every`
    /// says (None: none).
    pub fn with_snapshots(
        n: u64,
        election: LeaderChoice,
        seed: u64,
        snapshot_every: Option<SnapshotEvery>,
    ) -> Cluster {
        let mut c = Cluster {
            now: 0,
            nodes: Vec::new(),
            election,
            flights: Vec::new(),
            faults: Faults::NONE,
            cut: BTreeSet::new(),
            rng: Rng::new(seed),
            zk_view: 0,
            zk_leader: None,
            sessions: BTreeMap::new(),
            znodes: 0,
            next_value: 1,
            committed: Vec::new(),
            committed_at: Vec::new(),
            started: BTreeMap::new(),
            session_timeout: 300,
            trace: Vec::new(),
            tracing: std::env::var("LOCKSTEP_SIM_TRACE").is_ok(),
            links: BTreeMap::new(),
            refused_full: 0,
            snapshot_every,
            snapshot_counts: SnapshotCounts::default(),
            read_buf: Vec::new(),
        };
        let ids: Vec<u64> = (1..=n).collect();
        for id in 1..=n {
            c.nodes.push(Node {
                id,
                replica: None,
                storage: Storage::default(),
                region: Region::default(),
                memory: memory(id),
                writer: LeaderWriter::new(&ids, id, RING_SIZE, MAX_ENTRY),
                reader: None,
                stalled_at: u64::MAX,
                server: Vec::new(),
                server_alive: true,
                stale: false,
                snapshots: images::Snapshots::default(),
                pending: Vec::new(),
                checked: Checked::default(),
            });
        }
        for id in 1..=n {
            c.start(id);
        }
        c
    }

    fn config(&self, id: u64) -> ReplicaConfig {
        ReplicaConfig {
            me: id,
            members: (1..=self.nodes.len() as u64).collect(),
            election: self.election,
            session_timeout: self.session_timeout,
            request_timeout: 60,
            retry: 20,
            snapshot_every: self.snapshot_every,
        }
    }

    fn node(&mut self, id: u64) -> &mut Node {
        &mut self.nodes[id as usize - 1]
    }

    /// Starts (or restarts) node `id`'s follower and a fresh server.
    pub fn start(&mut self, id: u64) {
        let cfg = self.config(id);
        let now = self.now;
        let n = self.node(id);
        let restored = Restored {
            view: n.storage.view,
            log_view: n.storage.log_view,
            committed: n.storage.committed,
        };
        // A fresh region (as the follower resets the one it finds) and a
        // fresh preload (its server restarts).
        n.region = Region::default();
        n.memory = memory(id);
        n.writer = LeaderWriter::new(&cfg.members, id, RING_SIZE, MAX_ENTRY);
        n.reader = None;
        n.stalled_at = u64::MAX;
        n.server.clear();
        n.checked.applied = 0;
        n.checked.restarts += 1;
        n.checked.prefix_of = (0, 0, 0);
        n.server_alive = true;
        n.stale = false;
        let (r, actions) = Replica::new(cfg, restored, now);
        n.replica = Some(r);
        self.znodes += 1;
        self.sessions.insert(id, (self.znodes, now));
        self.carry_out(id, actions);
        self.restore(id);
    }

    /// Kills node `id`'s follower and server; its storage loses what was
    /// not saved (the commit mark is saved lazily).
    pub fn crash(&mut self, id: u64, lose_unsaved: bool) {
        let n = self.node(id);
        n.replica = None;
        n.server_alive = false;
        if lose_unsaved {
            // Compaction and an install save it durably, at least where
            // the log starts.
            n.storage.committed = n.storage.compacted.0;
        }
        self.sessions.remove(&id);
        if self.zk_leader.map(|(_, l)| l) == Some(id) {
            // Its ephemeral node goes; the announced record stays.
        }
    }

    /// Kills node `id`'s server only.
    pub fn kill_server(&mut self, id: u64) {
        let n = self.node(id);
        if n.replica.is_some() && n.server_alive {
            n.server_alive = false;
            self.step_node(id, Event::ServerExited);
        }
    }

    fn up(&self, id: u64) -> bool {
        self.nodes[id as usize - 1].replica.is_some()
    }

    fn reachable(&self, a: u64, b: u64) -> bool {
        !self.cut.contains(&link(a, b))
    }

    /// Cuts node `id` off from everyone (ZooKeeper too).
    pub fn isolate(&mut self, id: u64) {
        for o in 0..=self.nodes.len() as u64 {
            if o != id {
                self.cut.insert(link(id, o));
            }
        }
    }

    /// Cuts every node off from ZooKeeper (it is down or unreachable).
    pub fn lose_zookeeper(&mut self) {
        for id in 1..=self.nodes.len() as u64 {
            self.cut.insert(link(id, 0));
        }
    }

    pub fn heal(&mut self) {
        self.cut.clear();
    }

    fn send(&mut self, from: u64, to: u64, view: u64, payload: Payload) {
        if to == 0 || to as usize > self.nodes.len() {
            return;
        }
        let f = self.faults;
        if from != to && self.rng.percent(f.drop) {
            return;
        }
        let copies = if from != to && self.rng.percent(f.duplicate) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay = if from == to {
                0
            } else {
                1 + self.rng.below(f.max_delay.max(1))
            };
            self.flights.push(Flight {
                at: self.now + delay,
                from,
                to,
                view,
                payload: payload.clone(),
            });
        }
    }

    fn step_node(&mut self, id: u64, event: Event) {
        let now = self.now;
        let n = &mut self.nodes[id as usize - 1];
        let Some(r) = n.replica.as_mut() else {
            return;
        };
        let mut host = Host {
            storage: &n.storage,
            region: &mut n.region,
        };
        if self.tracing {
            self.trace.push(format!("{now} n{id} <- {event:?}"));
        }
        let actions = r.step(now, event, &mut host);
        self.carry_out(id, actions);
    }

    fn carry_out(&mut self, id: u64, actions: Vec<Action>) {
        for a in actions {
            if self.tracing {
                self.trace.push(format!("{} n{id} -> {a:?}", self.now));
            }
            self.carry_out_one(id, a);
        }
    }

    fn carry_out_one(&mut self, id: u64, a: Action) {
        let now = self.now;
        match a {
            Action::Persist { last } => {
                let n = self.node(id);
                let pending = std::mem::take(&mut n.pending);
                for e in pending {
                    if e.seq <= last && e.seq == n.storage.last().0 + 1 {
                        n.storage.log.push(e);
                    }
                }
            }
            // The runtime bumps its epoch: the poll loop makes its reader
            // again from the stored log's end.
            Action::ResetReader => self.node(id).reader = None,
            Action::Truncate { after } => {
                let n = self.node(id);
                n.reader = None;
                n.storage.truncate_after(after);
                n.checked.agree = n.checked.agree.min(after);
                n.checked.recorded = n.checked.recorded.min(after);
            }
            Action::AppendView {
                view,
                seq,
                last_committed,
            } => {
                let n = self.node(id);
                assert_eq!(n.storage.last().0 + 1, seq, "view entry in order");
                // Stored at the log's end (never in a ring): the new view's
                // writer goes on after it.
                let pos = n.storage.end();
                n.storage.log.push(Entry {
                    seq,
                    view,
                    value: 0,
                    last_committed,
                    pos,
                    end: pos + entry::footprint(0) as u64,
                });
            }
            Action::SaveViews { promised, log_view } => {
                let n = self.node(id);
                n.storage.view = promised;
                n.storage.log_view = log_view;
            }
            Action::SaveCommit { committed } => self.node(id).storage.committed = committed,
            Action::Ack { leader, view, seq } => self.send(id, leader, view, Payload::Ack(seq)),
            Action::RaiseCommit { seq } => self.raise_commit(id, seq),
            Action::CommitRecord { to, view, seq } => {
                self.send(id, to, view, Payload::CommitRecord(view, seq));
                // The runtime posts the ring's tail word with it: a
                // backup that missed the writer's last writes sees its
                // tail ahead, even when the writer appends nothing more.
                let tail = self.node(id).memory.tail().to_le_bytes().to_vec();
                let offset = words::tail_offset();
                self.send(
                    id,
                    to,
                    view,
                    Payload::Write {
                        offset,
                        bytes: tail,
                    },
                );
            }
            Action::ApplyUpTo { seq } => {
                let n = self.node(id);
                if !n.server_alive || !n.snapshots.lets_apply() {
                    return;
                }
                let from = n.replica.as_ref().map(|r| r.applied()).unwrap_or(0);
                let mut done = from;
                for s in from + 1..=seq {
                    let Some(e) = n.storage.get(s).copied() else {
                        break;
                    };
                    if e.value != 0 {
                        n.server.push((e.seq, e.view, e.value));
                    }
                    done = s;
                }
                if done > from {
                    self.step_node(id, Event::Applied { seq: done });
                }
            }
            Action::Send { to, msg } => {
                if !self.up(to) || !self.reachable(id, to) {
                    // A refused or timed-out connection: no answer.
                    self.flights.push(Flight {
                        at: now + 1,
                        from: to,
                        to: id,
                        view: u64::MAX,
                        payload: Payload::Control(Message::Refused, vec![]),
                    });
                    let _ = msg;
                    return;
                }
                self.send(id, to, 0, Payload::Control(msg, vec![]));
            }
            Action::SetView { view } => {
                let r = &mut self.node(id).region;
                r.view = r.view.max(view);
            }
            Action::SetLeader { leader } => self.node(id).region.leader = leader,
            Action::SetRole { role } => {
                let n = self.node(id);
                if role == Role::Backup {
                    // A former leader's tail word would look like entries
                    // this node missed.
                    n.memory.set_tail(n.storage.end());
                }
                n.region.role = Some(role);
            }
            Action::StartView { view, seq, holders } => {
                if let Some(&other) = self.started.get(&view) {
                    panic!("view {view} started twice: by {other} and {id}");
                }
                self.started.insert(view, id);
                let n = self.node(id);
                n.region.acks.clear();
                for h in holders {
                    n.region.acks.insert(h, seq);
                }
                n.region.commit = seq;
                n.region.served = seq;
                n.region.fenced = false;
                // The writer's hand-off, as the runtime sets it: the
                // preload starts the view's writer there.
                let end = n.storage.end();
                n.memory.set_commit(seq);
                n.memory.set_writer_start(seq + 1, end);
                n.memory.set_tail(end);
                self.record_commit(id, seq);
            }
            Action::ClaimView { floor } => {
                self.zk_view = self.zk_view.max(floor) + 1;
                let view = self.zk_view;
                self.flights.push(Flight {
                    at: now + 1,
                    from: 0,
                    to: id,
                    view,
                    payload: Payload::Control(Message::Refused, vec![]),
                });
            }
            Action::Announce { view } => {
                // publish_leader: never over a newer view's record.
                let newer = self.zk_leader.is_some_and(|(v, _)| v > view);
                if self.reachable(id, 0) && !newer {
                    self.zk_leader = Some((view, id));
                }
            }
            Action::Yield => {
                if self.reachable(id, 0) && self.sessions.contains_key(&id) {
                    self.znodes += 1;
                    let now = self.now;
                    self.sessions.insert(id, (self.znodes, now));
                }
            }
            Action::GoStale { .. } => {
                self.node(id).stale = true;
            }
            Action::Note { .. } => {}
            Action::TakeSnapshot => self.take_snapshot(id),
            Action::Compact { through } => self.compact(id, through),
            Action::Install { from } => self.install(id, from),
        }
    }

    fn raise_commit(&mut self, id: u64, seq: u64) {
        let n = self.node(id);
        if seq > n.region.commit {
            n.region.commit = seq;
            n.memory.raise_commit(seq);
            self.record_commit(id, seq);
        }
    }

    /// Every seq up to `seq` of node `id`'s log is committed now.
    fn record_commit(&mut self, id: u64, seq: u64) {
        let n = &self.nodes[id as usize - 1];
        let mut bad = None;
        // Deleted entries were committed (a majority's images cover them),
        // and checked when they were.
        for s in n.checked.recorded.max(n.storage.compacted.0) + 1..=seq {
            let Some(e) = n.storage.get(s) else {
                bad = Some(format!("node {id} commits seq {s} it does not hold"));
                break;
            };
            match self.committed.get(s as usize - 1) {
                Some(&(v, val)) if (v, val) != (e.view, e.value) => {
                    bad = Some(format!(
                        "seq {s} committed as {:?} and now as {:?} by node {id}",
                        (v, val),
                        (e.view, e.value)
                    ));
                    break;
                }
                Some(_) => {}
                None => {
                    self.committed.push((e.view, e.value));
                    self.committed_at.push((e.pos, e.end));
                }
            }
            let at = self.committed_at[s as usize - 1];
            if at != (e.pos, e.end) {
                bad = Some(format!(
                    "seq {s} committed at ring positions {at:?} and held at {:?} by node {id}",
                    (e.pos, e.end)
                ));
                break;
            }
        }
        if let Some(b) = bad {
            panic!("{b}");
        }
        let n = &mut self.nodes[id as usize - 1].checked;
        n.recorded = n.recorded.max(seq);
    }

    /// A client input at whichever node's preload leads: appended with
    /// the real writer into the node's ring and posted to every peer.
    pub fn client_input(&mut self) {
        let leaders: Vec<u64> = self
            .nodes
            .iter()
            .filter(|n| {
                n.replica.is_some() && n.server_alive && n.region.role == Some(Role::Leader)
            })
            .map(|n| n.id)
            .collect();
        for id in leaders {
            let value = self.next_value;
            self.next_value += 1;
            let n = &mut self.nodes[id as usize - 1];
            if n.region.fenced {
                continue; // the hand-over fails: the connection is reset
            }
            // The preload's `writer_view`: a view it has not written in
            // yet starts at the follower's hand-off.
            let view = n.region.view;
            if n.writer.view() != view {
                let (seq, pos) = n.memory.writer_start();
                n.writer.start(view, seq, pos);
                if self.tracing {
                    let t = format!(
                        "{} n{id} writer: view {view} from seq {seq} at {pos}",
                        self.now
                    );
                    self.trace.push(t);
                }
            }
            let acks = &n.region.acks;
            let acked = n
                .writer
                .majority()
                .reached_by(|i| acks.get(&i).copied().unwrap_or(0));
            let wire = Wire {
                local: &n.memory,
                writes: Mutex::default(),
            };
            let fields = EntryHeader::new(Kind::Data, view, 0, CONN, 0);
            let appended = n.writer.append(
                &n.memory,
                &wire,
                &fields,
                &value.to_le_bytes(),
                &mut Room { acked },
            );
            let writes = wire.writes.into_inner().unwrap_or_else(|p| p.into_inner());
            match appended {
                Ok(posted) => {
                    n.region.served = posted.seq;
                    n.server.push((posted.seq, view, value));
                }
                // The ring is full: the input is refused (the server
                // never sees it) and takes no seq.
                Err(AppendError::Room(())) => {
                    if self.tracing {
                        let t = format!("{} n{id} refused: ring full (acked {acked})", self.now);
                        self.trace.push(t);
                    }
                    self.refused_full += 1;
                    continue;
                }
                Err(e) => panic!("node {id} cannot append: {e:?}"),
            }
            for (to, view, offset, bytes) in writes {
                self.send_write(id, to, view, offset, bytes);
            }
        }
    }

    /// A one-sided write of a writer, delivered as the real transports
    /// deliver them: in order on each (writer, peer) link (an RDMA RC
    /// queue pair, one TCP stream), so never duplicated nor overtaken by a
    /// later write of that link. The fault rate loses one now and then (a
    /// broken connection): that peer misses what it carried, as the
    /// writer's `peer_missed` says, notices (its tail is ahead, or its
    /// reader is lapped) and catches up from another node.
    fn send_write(&mut self, from: u64, to: u64, view: u64, offset: u64, bytes: Vec<u8>) {
        if self.rng.percent(self.faults.drop) {
            return;
        }
        let delay = 1 + self.rng.below(self.faults.max_delay.max(1));
        let last = self.links.entry((from, to)).or_insert(0);
        let at = (self.now + delay).max(*last);
        *last = at;
        // Flights due together are delivered in the order sent.
        self.flights.push(Flight {
            at,
            from,
            to,
            view,
            payload: Payload::Write { offset, bytes },
        });
    }

    fn deliver(&mut self, f: Flight) {
        let to = f.to;
        if !self.up(to) {
            return;
        }
        if f.from != 0 && f.from != to && !self.reachable(f.from, to) && f.view != u64::MAX {
            return;
        }
        match f.payload {
            Payload::Write { offset, bytes } => {
                let n = self.node(to);
                if fence::accepts_write(n.region.view, f.view) {
                    n.memory
                        .write(offset, &bytes)
                        .expect("a write inside the region");
                } else {
                    let theirs = n.region.view;
                    self.note_refused(f.from, to, theirs);
                }
            }
            Payload::Ack(seq) => {
                let n = self.node(to);
                if fence::accepts_write(n.region.view, f.view) {
                    n.region.acks.insert(f.from, seq);
                } else {
                    let theirs = n.region.view;
                    self.note_refused(f.from, to, theirs);
                }
            }
            Payload::CommitRecord(v, seq) => {
                let n = self.node(to);
                if fence::accepts_write(n.region.view, f.view) {
                    n.region.commit_record = (v, seq);
                    // The real word's view tag (the commit word itself
                    // stays the modelled one, see `Words::commit`).
                    n.memory
                        .write(words::commit_record_offset(), &v.to_le_bytes())
                        .expect("the commit word's tag");
                } else {
                    let theirs = n.region.view;
                    self.note_refused(f.from, to, theirs);
                }
            }
            Payload::Control(msg, entries) => {
                if f.from == 0 {
                    self.step_node(to, Event::ViewClaimed { view: f.view });
                    return;
                }
                if f.view == u64::MAX {
                    self.step_node(to, Event::Unanswered { to: f.from });
                    return;
                }
                match msg {
                    Message::Peek { seq } => {
                        let view = self.nodes[to as usize - 1].storage.get(seq).map(|e| e.view);
                        self.send(
                            to,
                            f.from,
                            0,
                            Payload::Control(Message::PeekAnswer { seq, view }, vec![]),
                        );
                    }
                    Message::Fetch { from, to: upto } => {
                        // Below a compacted log's start: refused (the
                        // runtime's "entries below seq N were compacted"),
                        // which the asker hears as no answer.
                        let base = self.nodes[to as usize - 1].storage.compacted.0;
                        if base > 0 && from <= base {
                            self.flights.push(Flight {
                                at: self.now + 1,
                                from: to,
                                to: f.from,
                                view: u64::MAX,
                                payload: Payload::Control(Message::Refused, vec![]),
                            });
                            return;
                        }
                        let log = &self.nodes[to as usize - 1].storage.log;
                        let es: Vec<Entry> = log
                            .iter()
                            .filter(|e| e.seq >= from && (upto == 0 || e.seq <= upto))
                            .copied()
                            .collect();
                        self.stream_entries(to, f.from, es);
                    }
                    Message::Entries {
                        entries: metas,
                        more,
                    } => {
                        self.node(to).pending = entries;
                        self.step_node(
                            to,
                            Event::Message {
                                from: f.from,
                                msg: Message::Entries {
                                    entries: metas,
                                    more,
                                },
                            },
                        );
                    }
                    msg => self.step_node(to, Event::Message { from: f.from, msg }),
                }
            }
        }
    }

    /// A fetch's answer from `from` to `to`, as the runtime's stream
    /// carries it: chunks one millisecond apart, in order (one stream, no
    /// duplicates), the last saying `more: false`; a stream may break
    /// before any chunk (the fault rate's drops), which the fetching node
    /// hears as no answer, with the chunks before the break delivered.
    /// Chunks hold 1 to 4 entries, more in a long answer: about 16 chunks
    /// at most, as the runtime's chunks of a thousand entries take a small
    /// part of its request timeout, not several times the sim's.
    fn stream_entries(&mut self, from: u64, to: u64, es: Vec<Entry>) {
        let mut at = self.now + 1 + self.rng.below(self.faults.max_delay.max(1));
        let size = es.len() / 16 + 1 + self.rng.below(4) as usize;
        let mut rest = &es[..];
        loop {
            if self.rng.percent(self.faults.drop) {
                self.flights.push(Flight {
                    at,
                    from,
                    to,
                    view: u64::MAX,
                    payload: Payload::Control(Message::Refused, vec![]),
                });
                return;
            }
            let n = rest.len().min(size);
            let (chunk, after) = rest.split_at(n);
            rest = after;
            let more = !rest.is_empty();
            let metas = chunk.iter().map(|e| e.meta()).collect();
            self.flights.push(Flight {
                at,
                from,
                to,
                view: 0,
                payload: Payload::Control(
                    Message::Entries {
                        entries: metas,
                        more,
                    },
                    chunk.to_vec(),
                ),
            });
            if !more {
                return;
            }
            // Strictly later: due flights are delivered in time order.
            at += 1;
        }
    }

    fn note_refused(&mut self, writer: u64, peer: u64, theirs: u64) {
        if self.up(writer) {
            let n = self.node(writer);
            n.region.fenced_by = n.region.fenced_by.max(theirs);
            self.step_node(writer, Event::WriteRefused { peer, theirs });
        }
    }

    /// The runtime's poll loop, one round: the node's real ring read
    /// with the real reader (made from the stored log's end when missing,
    /// its minimum view the region's), up to the region's tail word.
    fn poll(&mut self, id: u64) {
        let mut buf = std::mem::take(&mut self.read_buf);
        let n = &mut self.nodes[id as usize - 1];
        let (seq, end) = (n.storage.last().0, n.storage.end());
        let reader = n
            .reader
            .get_or_insert_with(|| RingReader::new(RING_SIZE, end, seq + 1, MAX_ENTRY as u32));
        reader.set_min_view(n.region.view);
        let (ring, tail) = (n.memory.ring(), n.memory.tail());
        let mut batch = Vec::new();
        let mut failed = false;
        while batch.len() < 16 {
            match reader.poll(ring, tail, &mut buf) {
                ReadOutcome::Entry { header, pos, len } => batch.push(Entry {
                    seq: header.seq,
                    view: header.view,
                    value: value_of(&header, &buf[..len]),
                    last_committed: header.last_committed,
                    pos,
                    end: pos + len as u64,
                }),
                ReadOutcome::Empty => break,
                ReadOutcome::Lapped { .. } | ReadOutcome::Corrupt { .. } => {
                    failed = true;
                    break;
                }
            }
        }
        self.read_buf = buf;
        let n = &mut self.nodes[id as usize - 1];
        if batch.is_empty() {
            n.stalled_at = n.reader.as_ref().map_or(u64::MAX, |r| r.pos());
            if failed {
                self.step_node(id, Event::ReadFailed);
            }
            return;
        }
        n.stalled_at = u64::MAX;
        let metas = batch.iter().map(|e| e.meta()).collect();
        n.pending = batch;
        self.step_node(id, Event::Read(metas));
    }

    fn tick(&mut self, id: u64) {
        let n = &self.nodes[id as usize - 1];
        // The leader's preload raises the commit word too.
        if n.region.role == Some(Role::Leader) {
            let c = commit::leader_commit(
                1..=self.nodes.len() as u64,
                self.nodes.len() / 2 + 1,
                |i| n.region.acks.get(&i).copied().unwrap_or(0),
                n.region.served,
            );
            self.raise_commit(id, c);
        }
        let n = &self.nodes[id as usize - 1];
        let words = Words {
            acks: n.region.acks.iter().map(|(&k, &v)| (k, v)).collect(),
            served: n.region.served,
            // The sim keeps the record apart from the word the preload
            // raises; the word's view is the last record's, as in a region.
            commit: (n.region.commit_record.0, n.region.commit),
            commit_record: n.region.commit_record,
            fenced_by: n.region.fenced_by,
            // The runtime's: the writer's tail is past where the reader
            // found nothing it may read (an empty slot, or an older view's
            // entry: a write of this view was lost there).
            tail_ahead: n.stalled_at != u64::MAX && n.memory.tail() > n.stalled_at,
        };
        self.step_node(id, Event::Tick(words));
    }

    fn election_round(&mut self) {
        let ids: Vec<u64> = (1..=self.nodes.len() as u64).collect();
        // Sessions: a node cut from ZooKeeper (or stale: it left) loses its
        // session after the timeout.
        for &id in &ids {
            if !self.up(id) {
                continue;
            }
            if self.reachable(id, 0) && !self.nodes[id as usize - 1].stale {
                let now = self.now;
                let fresh = match self.sessions.get(&id) {
                    Some(&(order, t)) if now - t < self.session_timeout => (order, now),
                    _ => {
                        self.znodes += 1;
                        (self.znodes, now)
                    }
                };
                self.sessions.insert(id, fresh);
            } else if self.nodes[id as usize - 1].stale {
                self.sessions.remove(&id);
            }
        }
        let live: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|&id| {
                self.up(id)
                    && !self.nodes[id as usize - 1].stale
                    && self
                        .sessions
                        .get(&id)
                        .is_some_and(|&(_, t)| self.now - t < self.session_timeout)
            })
            .collect();
        let candidate = live.iter().copied().min_by_key(|id| self.sessions[id].0);
        for &id in &ids {
            if !self.up(id) {
                continue;
            }
            let session = match self.sessions.get(&id) {
                Some(&(_, t)) if self.now == t => Session::Connected,
                Some(&(_, t)) if self.now - t < self.session_timeout => {
                    Session::Disconnected(self.now - t)
                }
                _ => Session::Expired,
            };
            let announced = if self.reachable(id, 0) {
                self.zk_leader
            } else {
                None
            };
            let is_candidate = candidate == Some(id) && session == Session::Connected;
            // The runtime asks the leader it follows for its status.
            let followed_serving = is_candidate
                && self.nodes[id as usize - 1]
                    .replica
                    .as_ref()
                    .is_some_and(|r| {
                        let l = r.leader();
                        l != 0
                            && l != id
                            && self.up(l)
                            && self.reachable(id, l)
                            && self.nodes[l as usize - 1]
                                .replica
                                .as_ref()
                                .is_some_and(|lr| lr.serving() && lr.promised() >= r.log_view())
                    });
            self.step_node(
                id,
                Event::Election {
                    session,
                    candidate: is_candidate,
                    announced,
                    followed_serving,
                },
            );
        }
    }

    fn static_round(&mut self, leader: u64) {
        let Some(status) = self.nodes[leader as usize - 1]
            .replica
            .as_ref()
            .map(|r| (r.promised(), r.serving()))
        else {
            return;
        };
        for id in 1..=self.nodes.len() as u64 {
            if id != leader && self.up(id) && self.reachable(id, leader) {
                self.step_node(
                    id,
                    Event::LeaderStatus {
                        view: status.0,
                        serving: status.1,
                    },
                );
            }
        }
    }

    /// Advances the clock by one millisecond: delivers what is due, polls
    /// rings, ticks replicas, runs the election, checks the properties.
    pub fn step(&mut self) {
        self.now += 1;
        let now = self.now;
        // Stable: flights due at the same time go in the order sent (a
        // link's writes stay in order).
        let mut due: Vec<Flight> = self.flights.extract_if(.., |f| f.at <= now).collect();
        due.sort_by_key(|f| f.at);
        for f in due {
            self.deliver(f);
        }
        let ids: Vec<u64> = (1..=self.nodes.len() as u64).collect();
        for &id in &ids {
            if self.up(id) {
                self.poll(id);
            }
        }
        if now.is_multiple_of(5) {
            for &id in &ids {
                if self.up(id) {
                    self.tick(id);
                }
            }
        }
        if now.is_multiple_of(20) {
            match self.election {
                LeaderChoice::Zookeeper => self.election_round(),
                LeaderChoice::Static { leader } => self.static_round(leader),
            }
        }
        if self.snapshot_every.is_some() {
            self.finish_images();
            if now.is_multiple_of(ROUND_MS) {
                for &id in &ids {
                    if self.up(id) {
                        self.snapshot_round(id);
                    }
                }
            }
        }
        if now.is_multiple_of(200) {
            // The lazy save of the commit point.
            for n in &mut self.nodes {
                if let Some(r) = &n.replica {
                    n.storage.committed = r.committed();
                }
            }
        }
        self.check();
    }

    /// The safety properties, after every step. Each check starts where
    /// the last one ended ([`Checked`]): what it covered cannot change
    /// unseen (truncations and restarts lower the marks).
    pub fn check(&mut self) {
        let committed = &self.committed;
        let newest = self.started.keys().next_back().copied().unwrap_or(0);
        // No committed entry lost or changed: every node's log agrees with
        // the committed entries up to its own commit point, and a serving
        // leader of the newest view holds them all. (A leader whose lost
        // ZooKeeper session let another node start a newer view serves on
        // until it learns so, by design (`protocol::session`): the backups
        // that promised the newer view refuse its writes, so it commits
        // and releases nothing more; the checks above and `record_commit`
        // hold it to that.)
        for n in &mut self.nodes {
            let Some(r) = &n.replica else { continue };
            let storage = &n.storage;
            let reach = (storage.last().0 as usize).min(committed.len());
            // Deleted entries are covered by a majority's images (checked
            // when deleted), not compared here.
            let mut agree = n.checked.agree.max(storage.compacted.0) as usize;
            while agree < reach
                && storage
                    .get(agree as u64 + 1)
                    .is_some_and(|e| committed[agree] == (e.view, e.value))
            {
                agree += 1;
            }
            n.checked.agree = agree as u64;
            let upto = (r.committed() as usize).min(reach);
            assert!(
                agree >= upto,
                "node {} changed committed seq {} (committed {:?}, stored {:?})",
                n.id,
                agree + 1,
                committed.get(agree),
                storage.get(agree as u64 + 1)
            );
            if r.serving() && r.promised() >= newest {
                assert!(
                    agree >= committed.len(),
                    "serving leader {} lost committed seq {}",
                    n.id,
                    agree + 1
                );
            }
        }
        // One leader per view: checked when a view starts (StartView).
        // Applied prefixes equal across replicas whose servers are in line:
        // each is a prefix of the longest one's (then any two agree on
        // their common length). A deposed leader that has not synced with a
        // newer view yet may have run inputs that view drops (output
        // commit): it is judged when it syncs (it goes stale then), not
        // before.
        let top = self.started.keys().next_back().copied().unwrap_or(0);
        let in_line =
            |n: &Node| n.replica.as_ref().is_some_and(|r| r.log_view() >= top) && !n.stale;
        let Some(longest) = (0..self.nodes.len())
            .filter(|&i| in_line(&self.nodes[i]))
            .max_by_key(|&i| self.nodes[i].server.len())
        else {
            return;
        };
        for i in 0..self.nodes.len() {
            if !in_line(&self.nodes[i]) {
                continue;
            }
            let (l, n) = (&self.nodes[longest], &self.nodes[i]);
            let reference = (l.id, l.checked.restarts);
            let (id, restarts, done) = n.checked.prefix_of;
            let from = if (id, restarts) == reference { done } else { 0 };
            let k = n.server.len();
            assert_eq!(
                n.server[from..k],
                l.server[from..k],
                "applied prefixes differ (nodes {} and {})",
                n.id,
                l.id
            );
            // What it applied at committed seqs is those entries; what it
            // applied past their reach is the serving leader's own (output
            // commit), compared once committed.
            let mut applied = n.checked.applied;
            let mut contiguous = true;
            for (j, &(s, v, val)) in n.server.iter().enumerate().skip(applied) {
                match self.committed.get(s as usize - 1) {
                    Some(&c) => assert_eq!(
                        c,
                        (v, val),
                        "node {} applied seq {s} unlike its committed entry",
                        n.id
                    ),
                    None => contiguous = false,
                }
                if contiguous {
                    applied = j + 1;
                }
            }
            let n = &mut self.nodes[i].checked;
            n.prefix_of = (reference.0, reference.1, k);
            n.applied = applied;
        }
    }

    /// Forgets what the checks covered, so that the next one looks at
    /// everything again (the checker's own tests plant violations below
    /// the marks, where no protocol step writes).
    pub fn forget_checks(&mut self) {
        for n in &mut self.nodes {
            n.checked = Checked::default();
        }
    }

    /// Runs `ms` steps with a client input every `every` ms.
    pub fn run(&mut self, ms: u64, every: u64) {
        for _ in 0..ms {
            if self.now.is_multiple_of(every.max(1)) {
                self.client_input();
            }
            self.step();
        }
    }

    /// The node serving as leader, if exactly one serves.
    pub fn serving(&self) -> Option<u64> {
        let s: Vec<u64> = self
            .nodes
            .iter()
            .filter(|n| n.replica.as_ref().is_some_and(|r| r.serving()) && n.server_alive)
            .map(|n| n.id)
            .collect();
        (s.len() == 1).then(|| s[0])
    }

    /// The highest seq committed so far.
    pub fn commit_point(&self) -> u64 {
        self.committed.len() as u64
    }

    /// Inject a control message, as if `from` sent it.
    pub fn inject(&mut self, from: u64, to: u64, msg: Message) {
        self.step_node(to, Event::Message { from, msg });
    }
}
