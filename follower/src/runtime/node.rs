//! [`Node`]: the handle every thread of the follower shares — its config,
//! region, transport, store, its one [`Replica`] and metrics — and
//! [`Node::step`], the one way a thread hands the protocol an event.

use std::collections::{HashMap, VecDeque};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use lockstep_common::config::Config;
use lockstep_common::region::Region;
use lockstep_common::ring::RingReader;
use lockstep_common::transport::{tcp::RegionServer, Transport};

use crate::io::store::LogStore;
use crate::protocol::{Event, Message, Millis, Replica};
use crate::serve::metrics::Metrics;
use crate::snapshot::catalog::Catalog;

use super::carried::Carried;
use super::host::StoreHost;

/// A ZooKeeper request the replica made, carried out by the election
/// thread (the only one that talks to ZooKeeper).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ZkRequest {
    /// Claim a view above `floor`.
    Claim {
        /// Views up to it are known.
        floor: u64,
    },
    /// Publish this node as the leader of `view`.
    Announce {
        /// The view.
        view: u64,
    },
    /// Register again, behind the others.
    Yield,
}

/// State shared by the follower's threads.
pub struct Node {
    pub(crate) config: Config,
    pub(crate) me: u64,
    pub(crate) region: Arc<Region>,
    pub(crate) transport: Box<dyn Transport>,
    pub(super) store: Mutex<LogStore>,
    /// The protocol: every decision is [`Replica::step`]'s. Stepped (and
    /// its actions carried out) under this lock, so that the log a step
    /// reads through [`crate::protocol::Host`] is the one the previous
    /// step's actions left. Lock order: this, then the store.
    pub(super) replica: Mutex<Replica>,
    /// Entries this node's server applied per second, lately.
    pub(crate) apply_rate: AtomicU64,
    /// Bumped whenever the log is cut or the replica drops what was read
    /// ([`crate::protocol::Action::ResetReader`]): the poll loop then
    /// rebuilds its reader from the log's end and drops its batch.
    pub(super) epoch: AtomicU64,
    /// The ring position where the poll loop last found nothing to read
    /// (`poll::NOT_STALLED` after it read entries): the tick's
    /// `tail_ahead` compares it with the writer's tail.
    pub(super) stalled_at: AtomicU64,
    /// Where the replica asked the server to apply up to.
    pub(super) apply_target: AtomicU64,
    /// The apply thread, unparked when that target moves.
    pub(super) applier: OnceLock<std::thread::Thread>,
    /// The origin of [`Node::clock`].
    pub(super) started: Instant,
    /// ZooKeeper membership (election mode "zookeeper").
    pub(crate) election: Mutex<Option<crate::io::zookeeper::ZkElection>>,
    /// The election's session state, readable while the election thread
    /// waits on ZooKeeper.
    pub(crate) session_watch: Mutex<Option<crate::io::zookeeper::SessionWatch>>,
    /// ZooKeeper requests of the replica, for the election thread.
    pub(super) zk_requests: Mutex<Vec<ZkRequest>>,
    /// Control requests to peers, for the dispatcher thread.
    pub(super) outbox: Mutex<mpsc::Sender<(u64, Message)>>,
    /// Its other end, taken by [`Node::run`].
    pub(super) outbox_rx: Mutex<Option<mpsc::Receiver<(u64, Message)>>>,
    /// Peers' control requests waiting for the replica's answer, by the
    /// peer the answer goes to.
    pub(super) waiting: Mutex<HashMap<u64, mpsc::Sender<Message>>>,
    /// Snapshots: the image taker (or why there is none), triggers, state.
    pub(super) snapshots: super::snapshots::Snapshots,
    /// Counters and histograms.
    pub metrics: Metrics,
    pub(crate) stop: Arc<AtomicBool>,
    pub(super) region_server: RegionServer,
    /// The ring reader's state, held by whichever thread reads the ring
    /// (see `poll`); None until the poll thread starts.
    pub(super) ingest: Mutex<Option<super::poll::Ingest>>,
    /// The control address, bound first thing (see [`Node::start`]);
    /// [`Node::run`] serves it.
    pub(super) control_listener: Mutex<Option<TcpListener>>,
    /// This node's snapshots on disk.
    pub(crate) catalog: Catalog,
    /// Bytes of entries the apply thread fed (the byte measure of
    /// `snapshot_every`).
    pub(super) applied_bytes: AtomicU64,
}

impl Node {
    pub(crate) fn store(&self) -> MutexGuard<'_, LogStore> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The replica, for reading its state (status, metrics).
    pub(crate) fn replica(&self) -> MutexGuard<'_, Replica> {
        self.replica.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Milliseconds since this node started: the protocol's clock.
    pub(crate) fn clock(&self) -> Millis {
        self.started.elapsed().as_millis() as Millis
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Steps the replica with `event` (whose entries' bytes are
    /// `carried`) and carries out what it decides; events that carrying
    /// out produces (a refused write) are stepped next, in order.
    pub(crate) fn step(&self, event: Event, carried: Carried<'_>) {
        let mut replica = self.replica();
        self.step_locked(&mut replica, event, carried);
    }

    /// [`Node::step`] with the replica locked already.
    pub(super) fn step_locked(&self, replica: &mut Replica, event: Event, carried: Carried<'_>) {
        // Allocated only when an action leads to another event.
        let mut queue = VecDeque::new();
        let mut next = Some((event, carried));
        while let Some((event, carried)) = next.take().or_else(|| queue.pop_front()) {
            let actions = replica.step(self.clock(), event, &mut StoreHost::new(self));
            for action in actions {
                if let Some(next) = self.carry_out(action, carried) {
                    queue.push_back((next, Carried::Nothing));
                }
            }
        }
    }

    /// A ring reader from the stored log's end.
    pub(crate) fn reader(&self) -> RingReader {
        let last = self.store().last();
        let mut r = RingReader::new(
            self.config.ring_size,
            last.end_pos,
            last.seq + 1,
            self.config.max_entry,
        );
        r.set_min_view(self.region.view());
        r
    }
}
