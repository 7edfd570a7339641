//! Start-up: binds the control address, opens ZooKeeper, the store and
//! the region, takes this node's role ([`Node::start`]), then runs every
//! thread ([`Node::run`]) and saves the apply and commit points on the way
//! out.

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use lockstep_common::config::{Config, ElectionMode};
use lockstep_common::control;
use lockstep_common::region::{Region, Role};
use lockstep_common::transport::{self, tcp::RegionServer};

use crate::metrics::{self, Metrics};
use crate::store::LogStore;

use super::node::now_ms;
use super::Node;

impl Node {
    /// Opens the store and the region and takes this node's role.
    pub fn start(config: Config, me: u64, stop: Arc<AtomicBool>) -> anyhow::Result<Arc<Node>> {
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
            Some(crate::election::Election::connect(
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
        let transport = transport::open(&config, me, region.clone())?;
        let last = store.last();
        let view = store.view()?.max(1);
        store.set_view(view)?;
        // Static: the configured leader leads; it opens a new view first
        // (see `static_loop`), until then it is nobody's leader. ZooKeeper:
        // nobody leads until a view change says so.
        let stored_log_view = store.log_view()?;
        let (leader, log_view) = if zookeeper {
            (0, stored_log_view)
        } else if config.election.leader == me {
            (
                0,
                if stored_log_view == 0 {
                    view
                } else {
                    stored_log_view
                },
            )
        } else {
            (
                config.election.leader,
                if stored_log_view == 0 {
                    view
                } else {
                    stored_log_view
                },
            )
        };
        store.set_log_view(log_view)?;
        region.set_view(view);
        region.set_leader(leader);
        region.clear_acks();
        region.set_heartbeat(now_ms());
        let committed = store.commit()?;
        region.set_commit(committed);
        if zookeeper || config.election.leader == me {
            region.set_role(Role::Joining);
        } else {
            region.set_role(Role::Backup);
        }
        log::info!(
            "node {me}: view {view}, leader {leader}, log ends at seq {} (pos {}), region {}",
            last.seq,
            last.end_pos,
            path.display()
        );
        let region_server = RegionServer::new(region.clone());
        Ok(Arc::new(Node {
            persisted: AtomicU64::new(last.seq),
            committed: AtomicU64::new(committed),
            applied: AtomicU64::new(0),
            apply_rate: AtomicU64::new(0),
            log_view: AtomicU64::new(log_view),
            epoch: AtomicU64::new(0),
            sync_lock: Mutex::new(()),
            view_change: Mutex::new(Default::default()),
            started: Instant::now(),
            stale: AtomicBool::new(false),
            stale_reason: Mutex::new(None),
            session_watch: Mutex::new(election.as_ref().map(|e| e.watch())),
            election: Mutex::new(election),
            config,
            me,
            region,
            transport,
            store: Mutex::new(store),
            metrics: Metrics::default(),
            stop,
            region_server,
            control_listener: Mutex::new(Some(control_listener)),
        }))
    }

    /// Runs every thread; returns when `stop` is set.
    pub fn run(self: &Arc<Self>) -> anyhow::Result<()> {
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
            let source = move || {
                let known = *known.lock().unwrap_or_else(|p| p.into_inner());
                crate::sentinel::Snapshot::of(&n.config, n.me, &n.status(), known)
            };
            crate::sentinel::serve(addr, Arc::new(source), last)
                .with_context(|| format!("cannot listen on sentinel address {addr}"))?;
        }
        let n = self.clone();
        std::thread::Builder::new()
            .name("heartbeat".into())
            .spawn(move || n.heartbeat_loop())?;
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
        // A node that starts behind (or late) asks the leader for what it
        // missed — only when it follows the leader's view already (else the
        // view change or the join does that).
        let leader_view = control::query_status(
            &self.config,
            self.config.election.leader,
            Duration::from_secs(1),
        )
        .map(|s| s.view)
        .unwrap_or(0);
        if !zookeeper
            && self.config.election.leader != self.me
            && leader_view == self.log_view.load(Ordering::Acquire)
        {
            let mut r = self.reader();
            self.catch_up(&mut r);
            self.poll_loop(r);
        } else {
            self.poll_loop(self.reader());
        }
        let _ = applier.join();
        let store = self.store();
        store.set_applied(self.applied.load(Ordering::Acquire))?;
        store.set_commit(self.committed.load(Ordering::Acquire))?;
        store.flush()?;
        log::info!("node {}: stopped cleanly", self.me);
        Ok(())
    }
}
