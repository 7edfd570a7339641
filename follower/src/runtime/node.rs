//! [`Node`]: the handle every thread of the follower shares — its config,
//! region, transport, store, protocol words and metrics.

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use lockstep_common::config::Config;
use lockstep_common::region::Region;
use lockstep_common::ring::RingReader;
use lockstep_common::transport::{tcp::RegionServer, Transport};

use crate::metrics::Metrics;
use crate::protocol::viewchange::ViewChangeState;
use crate::protocol::Millis;
use crate::store::LogStore;

/// State shared by the follower's threads.
pub struct Node {
    pub(crate) config: Config,
    pub(crate) me: u64,
    pub(crate) region: Arc<Region>,
    pub(crate) transport: Box<dyn Transport>,
    pub(super) store: Mutex<LogStore>,
    pub(crate) persisted: AtomicU64,
    pub(crate) committed: AtomicU64,
    pub(crate) applied: AtomicU64,
    /// Entries this node's server applied per second, lately.
    pub(crate) apply_rate: AtomicU64,
    /// The view whose leader the stored log follows.
    pub(crate) log_view: AtomicU64,
    /// Bumped whenever another thread rewrites the log (view change sync):
    /// the poll loop then rebuilds its reader and drops what it read.
    pub(crate) epoch: AtomicU64,
    /// Serialises log rewrites (catch-up, view change sync).
    pub(crate) sync_lock: Mutex<()>,
    /// What this node remembers across view changes (the view it led and
    /// what its server consumed then, a promise not started yet, newer
    /// views seen at peers): the protocol's own state, taken briefly and
    /// never while another lock is taken.
    pub(super) view_change: Mutex<ViewChangeState>,
    /// The origin of [`Node::clock`].
    pub(super) started: Instant,
    /// The server missed committed inputs while this node led: it must be
    /// restarted (fresh) before this node can serve again.
    pub(crate) stale: AtomicBool,
    /// Why it is stale (for `status`).
    pub(super) stale_reason: Mutex<Option<String>>,
    /// ZooKeeper membership (election mode "zookeeper").
    pub(crate) election: Mutex<Option<crate::election::Election>>,
    /// The election's session state, readable while the election thread
    /// waits on ZooKeeper.
    pub(crate) session_watch: Mutex<Option<crate::election::SessionWatch>>,
    /// Counters and histograms.
    pub metrics: Metrics,
    pub(crate) stop: Arc<AtomicBool>,
    pub(super) region_server: RegionServer,
    /// The control address, bound first thing (see [`Node::start`]);
    /// [`Node::run`] serves it.
    pub(super) control_listener: Mutex<Option<TcpListener>>,
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Node {
    pub(crate) fn store(&self) -> MutexGuard<'_, LogStore> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Milliseconds since this node started: the protocol's clock.
    pub(crate) fn clock(&self) -> Millis {
        self.started.elapsed().as_millis() as Millis
    }

    /// The view change state ([`ViewChangeState`]); hold it briefly.
    pub(super) fn view_change(&self) -> MutexGuard<'_, ViewChangeState> {
        self.view_change.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    pub(super) fn is_leader_node(&self) -> bool {
        self.region.leader() == self.me
    }

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

    /// Marks this node stale (it leaves the election; `status` says why).
    pub(crate) fn go_stale(&self, why: String) {
        *self.stale_reason.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        self.stale.store(true, Ordering::Relaxed);
    }
}
