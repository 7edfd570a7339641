//! The follower's protocol as a pure state machine: what a replica stores,
//! acks, commits, fetches, truncates and fences, decided without any I/O.
//!
//! No sockets, files, threads, clocks, RocksDB, ZooKeeper or libc here:
//! time comes in as [`Millis`] (monotonic, from the caller), the stored log
//! is read through [`Host`], and everything the replica wants done comes
//! out as an [`Action`]. The follower process runs one [`Replica`]: the
//! runtime ([`crate::runtime`]) feeds it what its threads observe and
//! carries its actions out, deciding nothing itself; the simulated cluster
//! (`follower/tests/sim`) feeds the same `Replica`s and carries their
//! actions out over a deterministic network.
//!
//! # Parts, one file each (tests beside them)
//!
//! - [`commit`]: the leader's commit point (majority of the ack array,
//!   never past what its server was handed) and what a backup learns from
//!   entry headers and commit records (only for a log of that view).
//! - [`fence`]: which views a replica takes entries, writes and requests of.
//! - [`catchup`]: when a backup fetches from a peer instead of its ring,
//!   and from whom.
//! - [`sync`]: making a log equal to a leader's, keeping the shared prefix.
//! - [`viewchange`]: the candidate's decision (with how much of the
//!   adopted log a new view keeps), stray views, joining.
//! - [`session`]: when a leader that lost its ZooKeeper session stops
//!   serving (only once a majority stops acknowledging).
//! - [`stale`]: when a node's server no longer matches the log.
//! - [`snapshot`]: who images its server next, how much log every node
//!   deletes, when a node installs a peer's snapshot (the replica applies
//!   them on each [`Event::SnapshotRound`]).
//! - [`replica`]: [`Replica`], which ties them together.
//!
//! # State a replica keeps
//!
//! Durable (RocksDB meta keys in the runtime): the promised view (the
//! region's view word, raised by every promise: the fence), the log view
//! (the view whose leader the log follows), the commit point (saved
//! lazily: after a restart it may be behind), and the log itself (the
//! caller's; the replica reads it through [`Host`]). Volatile: the leader
//! it follows, its role (leader, backup, joining), how far its server
//! applied, the view it led and what its server consumed when it stopped
//! leading, when it last promised a view that has not started, newer views
//! seen at peers, whether it is stale (and why), catch-up timers, and the
//! view change it is running (as candidate, or as a node syncing with a
//! new leader).
//!
//! # Events
//!
//! [`Event`]: entries read from the ring, an empty or failed read, a tick
//! (with the region words others write: acks, the served mark, the commit
//! record), a control message or answer from a peer, a write a peer
//! refused, the election's view of who is candidate and who leads, a view
//! claimed for a candidacy, the server's progress, the server exiting, a
//! round of the snapshot rules (the members' snapshot states), an
//! installed image or a failed install.
//!
//! # Actions
//!
//! [`Action`]: persist the batch read, ack, raise the commit point, write
//! a commit record to a peer, apply up to a seq, truncate, append the
//! view-start entry, send a control message (fetch and probe included),
//! set the region's view, leader, role and writer start, open the
//! hand-over to the server, go stale, claim a view, take a snapshot,
//! compact the log, install a peer's snapshot, note something for the
//! log.

pub mod catchup;
pub mod commit;
pub mod fence;
pub mod membership;
pub mod replica;
pub mod session;
pub mod snapshot;
pub mod stale;
pub mod sync;
pub mod viewchange;

pub use lockstep_common::region::Role;
pub use replica::{LeaderChoice, Replica, ReplicaConfig};

/// Milliseconds on the caller's monotonic clock.
pub type Millis = u64;

/// What the replica needs to know of one entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryMeta {
    /// Its seq.
    pub seq: u64,
    /// The view of the leader that wrote it.
    pub view: u64,
    /// The commit point its header carries.
    pub last_committed: u64,
}

/// What the replica reads of its surroundings synchronously.
///
/// The stored log (the caller applies [`Action::Persist`],
/// [`Action::Truncate`] and [`Action::AppendView`] before the next step),
/// and the one read-modify-write of the region a step needs: fencing the
/// hand-over of inputs to the leader's server, which must be exact (an
/// input is either handed over before the fence or never).
pub trait Host {
    /// The last stored entry: (seq, view); (0, 0) when the log is empty.
    fn last(&self) -> (u64, u64);
    /// The view of stored entry `seq` (None: no such entry).
    fn view_at(&self, seq: u64) -> Option<u64>;
    /// Stops every further hand-over to the server; the highest seq it
    /// was given.
    fn fence_handover(&mut self) -> u64;
}

/// A control message between replicas (requests and their answers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// View change phase 1: fence the views below `view`, report the log.
    Prepare {
        /// The view.
        view: u64,
        /// Its candidate.
        candidate: u64,
    },
    /// The answer to `Prepare`.
    Promise(viewchange::Promise),
    /// View change phase 2: take `leader`'s log, follow it in `view`.
    NewView {
        /// The view.
        view: u64,
        /// Its leader.
        leader: u64,
        /// Its log ends here (the view-start entry).
        last: u64,
    },
    /// The answer to `NewView`: the log ends at `last`.
    Synced {
        /// The last stored seq.
        last: u64,
    },
    /// A refusal: this node promised `promised` already.
    Outdated {
        /// The promised view.
        promised: u64,
    },
    /// Any other refusal or failure (the request did nothing).
    Refused,
    /// Asks for the view of the peer's entry `seq`.
    Peek {
        /// The seq.
        seq: u64,
    },
    /// The answer to `Peek`.
    PeekAnswer {
        /// The seq asked.
        seq: u64,
        /// Its view (None: no such entry).
        view: Option<u64>,
    },
    /// Asks for entries `from..=to` (to = 0: all).
    Fetch {
        /// First seq wanted.
        from: u64,
        /// Last seq wanted (0: all).
        to: u64,
    },
    /// One chunk of the answer to `Fetch`, in order: the entries that
    /// follow the previous chunk's (the caller keeps their bytes and
    /// stores them on [`Action::Persist`]). A fetch is answered by chunks
    /// of bounded size, each stored as it arrives (see [`catchup`]), never
    /// by the whole range at once.
    Entries {
        /// The chunk's entries (may be empty).
        entries: Vec<EntryMeta>,
        /// Whether more chunks of this answer follow; the last chunk says
        /// false (a broken stream ends in [`Event::Unanswered`] instead).
        more: bool,
    },
}

/// The ZooKeeper session, as the election sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Session {
    /// Connected.
    Connected,
    /// Disconnected for this long.
    Disconnected(Millis),
    /// Expired (or the node left the election).
    Expired,
}

/// Region words other processes write, read by the caller at a tick.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Words {
    /// `(node, ack)` of every member (the leader's ack array).
    pub acks: Vec<(u64, u64)>,
    /// The highest seq the leader's server was handed.
    pub served: u64,
    /// The region's commit word and the view word beside it: (view, seq).
    /// A leader's preload raises the seq (when an output waits for the
    /// commit) and leaves the view; a commit record sets both.
    pub commit: (u64, u64),
    /// The commit record a leader wrote here: (view, seq).
    pub commit_record: (u64, u64),
    /// The highest view a peer refused one of this node's writes with.
    pub fenced_by: u64,
    /// Whether the writer's tail is past the reader's position.
    pub tail_ahead: bool,
}

/// Something that happened to a replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The ring gave these entries, in order, starting at the seq after
    /// the stored log's last.
    Read(Vec<EntryMeta>),
    /// The ring has a lapped or corrupt entry at the expected seq.
    ReadFailed,
    /// Time passed; the region words now.
    Tick(Words),
    /// A control message from `from`.
    Message {
        /// The sender.
        from: u64,
        /// The message.
        msg: Message,
    },
    /// A control request to `to` got no answer (timeout, refused
    /// connection); `to` 0: ZooKeeper did not answer a view claim.
    Unanswered {
        /// The peer.
        to: u64,
    },
    /// A one-sided write to `peer` was refused: it is in view `theirs`.
    WriteRefused {
        /// The peer.
        peer: u64,
        /// Its view.
        theirs: u64,
    },
    /// ZooKeeper mode: the election's state.
    Election {
        /// The session.
        session: Session,
        /// This node's znode is the lowest.
        candidate: bool,
        /// The announced leader: (view, leader).
        announced: Option<(u64, u64)>,
        /// The leader this node follows answered (just now) that it
        /// serves a view at least as new as this node's log view (asked
        /// only of a candidate that follows a leader; false otherwise).
        followed_serving: bool,
    },
    /// Static mode, a backup: the configured leader's status.
    LeaderStatus {
        /// Its view.
        view: u64,
        /// Whether it serves as leader.
        serving: bool,
    },
    /// A view was claimed for this node's candidacy (ZooKeeper's counter).
    ViewClaimed {
        /// The view.
        view: u64,
    },
    /// The server applied the log up to `seq`.
    Applied {
        /// The seq.
        seq: u64,
    },
    /// The server (attached once) exited.
    ServerExited,
    /// A peer's snapshot at `seq` replaced the server, and the log now
    /// starts after it (or continues it): everything up to `seq` is
    /// committed and applied, and a sync or catch-up planned on the log
    /// before it is void.
    Installed {
        /// The snapshot's seq.
        seq: u64,
    },
    /// A round of the snapshot rules: every member's snapshot state, as
    /// the runtime gathered it just now (this node's own included).
    /// Answered by [`Action::TakeSnapshot`], [`Action::Compact`] and
    /// [`Action::Install`], in that order, as the rules say.
    SnapshotRound(SnapshotRound),
    /// Installing a peer's snapshot ([`Action::Install`]) failed: the next
    /// try waits longer.
    InstallFailed,
}

/// What a round of the snapshot rules decides on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotRound {
    /// Every member once, this node too (see [`snapshot::Member`]).
    pub members: Vec<snapshot::Member>,
    /// Whether this node's own log and snapshots can rebuild its server
    /// (false: it deleted its log past its own newest snapshot and
    /// restarted; only a peer's image will do).
    pub can_rebuild: bool,
}

/// Something the replica wants done, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Store the entries of the last [`Event::Read`] or fetched batch.
    Persist {
        /// The last seq stored.
        last: u64,
    },
    /// Drop what was read and read again from the stored log's end.
    ResetReader,
    /// Cut the stored log after `after`.
    Truncate {
        /// The last seq kept.
        after: u64,
    },
    /// Append the entry that starts view `view` at `seq`.
    AppendView {
        /// The view.
        view: u64,
        /// Its seq.
        seq: u64,
        /// The commit point its header carries.
        last_committed: u64,
    },
    /// Save the promised view and the log view (durably).
    SaveViews {
        /// The promised view.
        promised: u64,
        /// The log view.
        log_view: u64,
    },
    /// Save the commit point (view start: durably).
    SaveCommit {
        /// The commit point.
        committed: u64,
    },
    /// Write `ack[me] = seq` into `leader`'s region.
    Ack {
        /// The leader.
        leader: u64,
        /// The writer's view.
        view: u64,
        /// The acked seq.
        seq: u64,
    },
    /// Leader: raise the local commit word.
    RaiseCommit {
        /// The commit point.
        seq: u64,
    },
    /// Leader: write a commit record into `to`'s region.
    CommitRecord {
        /// The peer.
        to: u64,
        /// The leader's view.
        view: u64,
        /// The commit point.
        seq: u64,
    },
    /// Hand committed entries to the server up to `seq`.
    ApplyUpTo {
        /// The last seq to apply.
        seq: u64,
    },
    /// Send a control message.
    Send {
        /// The peer.
        to: u64,
        /// The message.
        msg: Message,
    },
    /// Set the region's view word (raise only).
    SetView {
        /// The view.
        view: u64,
    },
    /// Set the region's leader word.
    SetLeader {
        /// The leader (0: none).
        leader: u64,
    },
    /// Set the region's role word.
    SetRole {
        /// The role.
        role: Role,
    },
    /// Start the view here: the ack array holds `holders` at `seq`, the
    /// commit word is `seq`, the next entry is `seq + 1`, hand-overs to the
    /// server open after `seq`.
    StartView {
        /// The view.
        view: u64,
        /// Its start entry's seq.
        seq: u64,
        /// The nodes that hold the log up to it.
        holders: Vec<u64>,
    },
    /// ZooKeeper: claim a view above `floor` (answered by
    /// [`Event::ViewClaimed`]).
    ClaimView {
        /// Views up to it are known.
        floor: u64,
    },
    /// ZooKeeper: publish this node as the leader of `view`.
    Announce {
        /// The view.
        view: u64,
    },
    /// ZooKeeper: give up the candidacy (the leader this node follows
    /// serves): register again, behind the others.
    Yield,
    /// This node's server must be rebuilt: leave the election, serve
    /// nothing until restarted.
    GoStale {
        /// Why.
        why: String,
    },
    /// This backup's turn to image its server: take a snapshot at its next
    /// idle turn boundary.
    TakeSnapshot,
    /// Delete the stored log up to `through` (a majority's snapshots
    /// cover it; nothing at or below it is needed by a live peer).
    Compact {
        /// The last seq deleted.
        through: u64,
    },
    /// Install peer `from`'s newest snapshot in place of the server
    /// (answered by [`Event::Installed`] or [`Event::InstallFailed`]).
    Install {
        /// The peer.
        from: u64,
    },
    /// Something an operator reads in the log: why a view change failed,
    /// why leading stopped. Changes nothing.
    Note {
        /// What happened.
        what: String,
    },
}
