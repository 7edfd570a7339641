//! Start-up: binds the control address, opens ZooKeeper, the store and
//! the region, starts the replica from the stored views ([`Node::start`]), then runs every
//! thread ([`Node::run`]) and saves the apply and commit points on the way
//! out, then removes the region file (unless told to keep it).

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use lockstep_common::config::{Config, ElectionMode, SnapshotMode};
use lockstep_common::region::Region;
use lockstep_common::transport::{self, tcp::RegionServer};

use crate::io::store::LogStore;
use crate::protocol::replica::Restored;
use crate::protocol::{self, Millis, Replica};
use crate::serve::metrics::{self, Metrics};
use crate::snapshot::catalog::Catalog;

use super::carried::Carried;
use super::control_client::REQUEST_PATIENCE;
use super::heartbeat::now_ms;
use super::poll::NOT_STALLED;
use super::snapshots;
use super::zookeeper::RETRY;
use super::Node;

/// What a clean stop does with the node's region file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegionOnStop {
    /// Removes it, unless a server is attached
    /// ([`Region::remove_unattached`]).
    Remove,
    /// Leaves it for the next start to reuse: for a supervisor that
    /// removes region files itself once the cluster stops (`lockstep up`),
    /// and where a peer's server that dropped its user id writes into it
    /// (shm): that server could not open a new file.
    Keep,
}

impl Node {
    /// Opens the store and the region and takes this node's role; its
    /// server's images are CRIU's.
    pub fn start(config: Config, me: u64, stop: Arc<AtomicBool>) -> anyhow::Result<Arc<Node>> {
        Node::start_with_image(config, me, stop, snapshots::criu_image)
    }

    /// [`Node::start`] with the maker of this node's image taker (it needs
    /// the node's region, opened here). With `snapshot = "off"`, or where
    /// it says the machine cannot snapshot (one line), the log is kept and
    /// replayed whole.
    pub fn start_with_image(
        config: Config,
        me: u64,
        stop: Arc<AtomicBool>,
        make_image: snapshots::ImageMaker,
    ) -> anyhow::Result<Arc<Node>> {
        // Before anything is logged or touched (ZooKeeper, the store, the
        // region): a taken control address is the first and only line.
        let control = config.node(me)?.control;
        let control_listener = TcpListener::bind(control)
            .with_context(|| format!("cannot listen on control address {control}"))?;
        // Every control and region handshake proves this key, on shm too:
        // read (or, on a keyless config, generate) it once now, so that a
        // missing or exposed key file stops the node here with one line
        // and every later handshake uses the key the node started with.
        config.cluster_key()?;
        let zookeeper = config.election.mode == ElectionMode::Zookeeper;
        // Before touching anything: no ZooKeeper, no node.
        let election = if zookeeper {
            Some(crate::io::zookeeper::ZkElection::connect(
                &config.election.zookeeper,
                Duration::from_millis(config.election.session_timeout_ms),
                &config.cluster,
                me,
            )?)
        } else {
            None
        };
        let dir = config.node_data_dir(me);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create data directory {}", dir.display()))?;
        let store = LogStore::open(&dir, config.durability)
            .with_context(|| format!("cannot open the log store in {}", dir.display()))?;
        let spec = config.region_spec(me);
        let path = spec.default_path();
        let (region, created) = Region::open_or_create(&path, &spec)?;
        // Before touching it: a second follower of this node must not reset
        // the region under the first. The lock also tells the server's
        // preload that this follower is alive.
        region.claim()?;
        if !created {
            if region.server_attached() {
                let pid = region.preload_pid();
                bail!(
                    "a server (pid {pid}) is still attached to {}: stop it first — a starting follower rebuilds a fresh server from the log",
                    path.display()
                );
            }
            region.reset();
        }
        let region = Arc::new(region);
        let catalog = Catalog::new(crate::snapshot::snapshots_dir(&config, me));
        let image = match config.snapshot {
            SnapshotMode::Off => Err("snapshot = \"off\" in the config".to_string()),
            SnapshotMode::Process => make_image(region.clone(), catalog.root(), config.node(me)?.app).inspect_err(|why| {
                log::warn!(
                    "node {me}: snapshots are off: {why}; the log is kept and a restart replays it whole; fix: {} (`lockstep status` shows it while it lasts)",
                    snapshots::fix_for(why)
                )
            }),
        };
        let transport = transport::open(&config, me, region.clone())?;
        let last = store.last();
        if store.oldest() > 1 && image.is_err() {
            bail!(
                "the log of node {me} starts at seq {} (the entries below were compacted under a snapshot), and this follower cannot restore snapshots: it cannot rebuild its server",
                store.oldest()
            );
        }
        let restored = Restored {
            view: store.view()?,
            log_view: store.log_view()?,
            committed: store.commit()?,
        };
        let election_mode = if zookeeper {
            protocol::LeaderChoice::Zookeeper
        } else {
            protocol::LeaderChoice::Static {
                leader: config.election.leader,
            }
        };
        let cfg = protocol::ReplicaConfig {
            me,
            members: config.ids().collect(),
            election: election_mode,
            session_timeout: config.election.session_timeout_ms,
            request_timeout: REQUEST_PATIENCE.as_millis() as Millis,
            retry: RETRY.as_millis() as Millis,
            // The snapshot rules' thread runs only then (see `snapshots`).
            snapshot_every: (config.snapshot != SnapshotMode::Off && image.is_ok())
                .then_some(config.snapshot_every),
        };
        // Static: the configured leader leads; it opens a new view first
        // (on the replica's ticks), until then it is nobody's leader.
        // ZooKeeper: nobody leads until a view change says so.
        let (replica, actions) = Replica::new(cfg, restored, 0);
        region.clear_acks();
        region.set_heartbeat(now_ms());
        region.set_commit(restored.committed);
        log::info!(
            "node {me}: view {}, leader {}, log ends at seq {} (pos {}), region {}",
            replica.promised(),
            replica.leader(),
            last.seq,
            last.end_pos,
            path.display()
        );
        // Last of what can fail: a follower that stops after this leaves a
        // restored server behind, attached to the region.
        // Leftovers of a taker that died midway, and old snapshots.
        if let Err(e) = catalog.clean(2) {
            log::warn!("node {me}: cleaning the snapshots: {e}");
        }
        let (newest_snapshot, newest_image_bytes) = match catalog.newest() {
            Ok(s) => s.map_or((0, 0), |s| (s.meta.position.seq, s.meta.bytes())),
            Err(e) => {
                log::warn!("node {me}: reading the snapshots: {e}");
                (0, 0)
            }
        };
        // Last of what can fail: a follower that stops after this leaves a
        // restored server behind, attached to the region.
        let server = config.server.as_deref();
        let restored_at = image
            .as_ref()
            .ok()
            .and_then(|image| snapshots::restore_newest(image.as_ref(), &catalog, &store, server));
        let needs_image = restored_at.is_none() && store.oldest() > 1;
        if needs_image {
            log::warn!(
                "node {me}: the log starts at seq {} (the entries below were compacted under a snapshot) and no snapshot of this node reaches it: the server is rebuilt from a peer's snapshot, installed as soon as a peer offers one",
                store.oldest()
            );
        }
        let snapshots_wanted = config.snapshot == SnapshotMode::Process;
        let region_server = RegionServer::new(region.clone());
        let (outbox, outbox_rx) = mpsc::channel();
        let node = Arc::new(Node {
            replica: Mutex::new(replica),
            apply_rate: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            stalled_at: AtomicU64::new(NOT_STALLED),
            apply_target: AtomicU64::new(0),
            applier: OnceLock::new(),
            started: Instant::now(),
            session_watch: Mutex::new(election.as_ref().map(|e| e.watch())),
            election: Mutex::new(election),
            zk_requests: Mutex::new(Vec::new()),
            outbox: Mutex::new(outbox),
            outbox_rx: Mutex::new(Some(outbox_rx)),
            waiting: Mutex::new(HashMap::new()),
            config,
            me,
            region,
            transport,
            store: Mutex::new(store),
            snapshots: snapshots::Snapshots::new(
                image,
                restored_at.is_some(),
                needs_image,
                newest_snapshot,
                newest_image_bytes,
                snapshots_wanted,
            ),
            metrics: Metrics::default(),
            stop,
            region_server,
            ingest: Mutex::new(None),
            control_listener: Mutex::new(Some(control_listener)),
            catalog,
            applied_bytes: AtomicU64::new(0),
        });
        node.learn_origin(&node.store(), restored.committed);
        for a in actions {
            node.carry_out(a, Carried::Nothing);
        }
        if let Some(seq) = restored_at {
            node.step(protocol::Event::Applied { seq }, Carried::Nothing);
        }
        Ok(node)
    }

    /// Runs every thread; returns when `stop` is set, having stored the
    /// apply and commit points and flushed the store, then done `on_stop`
    /// with the region file.
    pub fn run(self: &Arc<Self>, on_stop: RegionOnStop) -> anyhow::Result<()> {
        let me = self.config.node(self.me)?.clone();
        let listener = self
            .control_listener
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .context("the node runs already")?;
        listener.set_nonblocking(true)?;
        let n = self.clone();
        std::thread::Builder::new()
            .name("control".into())
            .spawn(move || n.accept_loop(listener))?;
        if let Some(addr) = me.metrics {
            let n = self.clone();
            metrics::serve(addr, Arc::new(move |path: &str| n.http(path)))
                .with_context(|| format!("cannot listen on metrics address {addr}"))?;
        }
        if let Some(addr) = me.sentinel {
            let n = self.clone();
            let last = Arc::new(Mutex::new(None));
            let known = last.clone();
            let peers =
                crate::serve::sentinel::PeerStatuses::new(crate::serve::sentinel::PEERS_FRESH_FOR);
            let source = move || {
                let own = n.status();
                // Whether the leader can commit needs the others' word;
                // with no leader known there is nothing to check.
                let peers = if own.leader == 0 {
                    Vec::new()
                } else {
                    peers.get(|| n.peer_statuses())
                };
                let known = *known.lock().unwrap_or_else(|p| p.into_inner());
                crate::serve::sentinel::SentinelView::of(&n.config, n.me, &own, &peers, known)
            };
            crate::serve::sentinel::serve(addr, Arc::new(source), last)
                .with_context(|| format!("cannot listen on sentinel address {addr}"))?;
        }
        let n = self.clone();
        std::thread::Builder::new()
            .name("heartbeat".into())
            .spawn(move || n.heartbeat_loop())?;
        let n = self.clone();
        std::thread::Builder::new()
            .name("snapshots".into())
            .spawn(move || n.snapshot_loop())?;
        let n = self.clone();
        let applier = std::thread::Builder::new()
            .name("apply".into())
            .spawn(move || n.apply_loop())?;
        let zookeeper = self.config.election.mode == ElectionMode::Zookeeper;
        let n = self.clone();
        if zookeeper {
            std::thread::Builder::new()
                .name("election".into())
                .spawn(move || n.election_loop())?;
        } else {
            std::thread::Builder::new()
                .name("static".into())
                .spawn(move || n.static_loop())?;
        }
        let requests = self
            .outbox_rx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .context("the node runs already")?;
        let n = self.clone();
        std::thread::Builder::new()
            .name("dispatch".into())
            .spawn(move || n.dispatch_loop(requests))?;
        self.poll_loop();
        let _ = applier.join();
        let (applied, committed) = {
            let r = self.replica();
            (r.applied(), r.committed())
        };
        let store = self.store();
        store.set_applied(applied)?;
        store.set_commit(committed)?;
        store.flush()?;
        drop(store);
        if on_stop == RegionOnStop::Keep {
            log::info!("node {}: stopped cleanly", self.me);
            return Ok(());
        }
        // Everything read from the ring is in the store now, so the region
        // holds nothing a restart needs: its file (ring_size and more, in
        // /dev/shm) goes. A crash leaves it, for the next start to reuse.
        let path = self.region.path().display();
        match self.region.remove_unattached() {
            Ok(true) => log::info!("node {}: removed region file {path}", self.me),
            Ok(false) => log::info!(
                "node {}: left region file {path}: a server (pid {}) is attached to it; stop the server, then remove it or start this follower again",
                self.me,
                self.region.preload_pid()
            ),
            Err(e) => log::warn!("node {}: {e}", self.me),
        }
        log::info!("node {}: stopped cleanly", self.me);
        Ok(())
    }
}
