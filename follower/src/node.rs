//! The follower runtime of one node: polls the region's ring, persists
//! entries to RocksDB, acks them to the leader, applies committed entries
//! to the local server, serves the control channel and metrics.

use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use crossbeam_utils::Backoff;
use lockstep_common::config::{Config, ElectionMode};
use lockstep_common::control::{self, FetchedEntry, NodeStatus, Request, Response};
use lockstep_common::entry::EntryHeader;
use lockstep_common::handshake::{self, Channel};
use lockstep_common::region::{self, Region, Role};
use lockstep_common::ring::{ReadOutcome, RingReader};
use lockstep_common::transport::{self, tcp::RegionServer, Transport};

use crate::feed::Feeder;
use crate::metrics::{self, Metrics};
use crate::protocol::catchup::{self, GapWatch, Stall};
use crate::protocol::sync::PrefixSearch;
use crate::protocol::{commit, fence, Millis};
use crate::store::LogStore;

/// Entries per catch-up batch.
const FETCH_BATCH: usize = 1024;
/// Period of the heartbeat (and of the leader's commit writes when idle).
const HEARTBEAT: Duration = Duration::from_millis(2);
/// How often the heartbeat thread checks that this node's server runs.
const SERVER_CHECK: Duration = Duration::from_millis(100);
/// A backup tells the leader how far it applied at least this often (and
/// whenever it moved): a new leader learns it within this.
const APPLIED_REPORT: Duration = Duration::from_millis(50);
/// Timeout of one control-channel exchange.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// State shared by the follower's threads.
pub struct Node {
    pub(crate) config: Config,
    pub(crate) me: u64,
    pub(crate) region: Arc<Region>,
    pub(crate) transport: Box<dyn Transport>,
    store: Mutex<LogStore>,
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
    /// Set when this node stopped leading: (the view it led, its commit
    /// word then = the last input its server consumed).
    pub(crate) demoted: Mutex<Option<(u64, u64)>>,
    /// When this node last promised a view it has not seen start yet.
    pub(crate) view_change_at: Mutex<Option<Millis>>,
    /// Views newer than this node's that peers were seen in.
    pub(crate) newer_views: Mutex<crate::protocol::viewchange::NewerViews>,
    /// The origin of [`Node::clock`].
    started: Instant,
    /// The server missed committed inputs while this node led: it must be
    /// restarted (fresh) before this node can serve again.
    pub(crate) stale: AtomicBool,
    /// Why it is stale (for `status`).
    stale_reason: Mutex<Option<String>>,
    /// ZooKeeper membership (election mode "zookeeper").
    pub(crate) election: Mutex<Option<crate::election::Election>>,
    /// The election's session state, readable while the election thread
    /// waits on ZooKeeper.
    pub(crate) session_watch: Mutex<Option<crate::election::SessionWatch>>,
    /// Counters and histograms.
    pub metrics: Metrics,
    pub(crate) stop: Arc<AtomicBool>,
    region_server: RegionServer,
    /// The control address, bound first thing (see [`Node::start`]);
    /// [`Node::run`] serves it.
    control_listener: Mutex<Option<TcpListener>>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

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
            demoted: Mutex::new(None),
            view_change_at: Mutex::new(None),
            newer_views: Mutex::new(Default::default()),
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

    pub(crate) fn store(&self) -> MutexGuard<'_, LogStore> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Milliseconds since this node started: the protocol's clock.
    pub(crate) fn clock(&self) -> Millis {
        self.started.elapsed().as_millis() as Millis
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn is_leader_node(&self) -> bool {
        self.region.leader() == self.me
    }

    /// This node's status.
    pub fn status(&self) -> NodeStatus {
        let role = match self.region.role() {
            _ if self.stale.load(Ordering::Relaxed) => "stale",
            Role::Leader => "leader",
            Role::Backup => "backup",
            Role::Joining => "joining",
        };
        let persisted = self.persisted.load(Ordering::Acquire);
        let applied = if self.region.role() == Role::Leader {
            persisted
        } else {
            self.applied.load(Ordering::Acquire)
        };
        let committed = self.committed.load(Ordering::Acquire);
        NodeStatus {
            node: self.me,
            view: self.region.view(),
            leader: self.region.leader(),
            role: role.into(),
            stale_reason: self
                .stale_reason
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            persisted,
            committed,
            applied,
            divergences: self.metrics.divergences.load(Ordering::Relaxed),
            lag_ms: (self.lag_seconds(committed.saturating_sub(applied)) * 1000.0) as u64,
            server_pid: self.region.preload_pid(),
            follower_pid: std::process::id() as u64,
        }
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

    pub(crate) fn render_metrics(&self) -> String {
        let s = self.status();
        let lag = s.committed.saturating_sub(s.applied);
        let mut text = self.metrics.render(&[
            ("lockstep_view", "Current view", s.view),
            ("lockstep_leader", "Leader of the current view", s.leader),
            ("lockstep_persisted_seq", "Highest seq stored", s.persisted),
            (
                "lockstep_committed_seq",
                "Highest seq known committed",
                s.committed,
            ),
            ("lockstep_applied_seq", "Highest seq applied", s.applied),
        ]);
        let zookeeper_connected = self
            .session_watch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|w| w.session() == crate::election::Session::Connected);
        metrics::NodeGauges {
            role: &s.role,
            server_up: self.region.server_attached(),
            zookeeper_connected,
            apply_lag_entries: lag,
            apply_lag_seconds: self.lag_seconds(lag),
        }
        .render(&mut text);
        text
    }

    /// Seconds the server needs to apply `lag` entries at its recent rate
    /// (with no rate measured yet, a rate of 50k entries/s is assumed).
    pub(crate) fn lag_seconds(&self, lag: u64) -> f64 {
        let rate = self.apply_rate.load(Ordering::Relaxed).max(1);
        let rate = if rate <= 1 { 50_000 } else { rate };
        lag as f64 / rate as f64
    }

    /// Posts `ack[me] = seq` into the leader's region.
    pub(crate) fn ack(&self, seq: u64) {
        let leader = self.region.leader();
        let view = self.region.view();
        if let Err(e) = self.transport.write(
            leader,
            view,
            region::ack_offset(self.me),
            &seq.to_le_bytes(),
        ) {
            log::warn!("ack {seq} to node {leader} failed: {e}");
        }
        self.transport.flush();
        self.metrics.acks.fetch_add(1, Ordering::Relaxed);
    }

    /// Tells the leader how far this node's server applied (the leader
    /// bounds the backups' apply lag with it: `max_apply_lag`).
    fn report_applied(&self, seq: u64) {
        let leader = self.region.leader();
        if leader == 0 || leader == self.me {
            return;
        }
        let view = self.region.view();
        if let Err(e) = self.transport.write(
            leader,
            view,
            region::applied_by_offset(self.me),
            &seq.to_le_bytes(),
        ) {
            log::debug!("applied {seq} to node {leader}: {e}");
        }
        self.transport.flush();
    }

    /// Takes `seq` as committed, unless a view change is under way: a
    /// commit point of another view's leader says nothing about a log that
    /// does not follow that leader yet.
    pub(crate) fn learn_commit(&self, seq: u64) {
        let (log_view, view) = (self.log_view.load(Ordering::Acquire), self.region.view());
        // From 0: what this view's commit point may become.
        self.committed
            .fetch_max(commit::learn(0, seq, log_view, view), Ordering::AcqRel);
    }

    /// Takes the commit point a leader wrote into this region, if that
    /// leader's view is the one this log follows: a newer leader's commit
    /// point arriving before this node joined its view would otherwise
    /// "commit" this log's uncommitted tail of the old view.
    fn learn_remote_commit(&self) {
        let (seq, view) = self.region.commit_in_view();
        if let Some(seq) = commit::learn_record(
            view,
            seq,
            self.log_view.load(Ordering::Acquire),
            self.persisted.load(Ordering::Acquire),
        ) {
            self.learn_commit(seq);
        }
    }

    /// Whether this node may store an entry of `view` now: not from a
    /// fenced view, and only from the leader its log follows.
    fn admits(&self, view: u64) -> bool {
        fence::admits(
            self.region.view(),
            self.log_view.load(Ordering::Acquire),
            view,
        )
    }

    /// Persist-and-ack loop over the local ring.
    fn poll_loop(&self, mut reader: RingReader) {
        let ring = self.region.ring();
        let mut buf = Vec::new();
        let mut batch: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut gap = GapWatch::default();
        let backoff = Backoff::new();
        let mut epoch = self.epoch.load(Ordering::Acquire);
        while !self.stopping() {
            let now_epoch = self.epoch.load(Ordering::Acquire);
            if now_epoch != epoch {
                // Someone rewrote the log: start over from its end.
                epoch = now_epoch;
                reader = self.reader();
                batch.clear();
            }
            reader.set_min_view(self.region.view());
            let seen = self.region.bell().value();
            let mut need_catchup = false;
            let mut first_seen = None;
            let mut lcs = Vec::new();
            while batch.len() < 256 {
                match reader.poll(ring, self.region.tail(), &mut buf) {
                    ReadOutcome::Entry { header, pos, len } => {
                        first_seen.get_or_insert_with(Instant::now);
                        lcs.push(header.last_committed);
                        batch.push((pos, buf[..len].to_vec()));
                    }
                    ReadOutcome::Empty => break,
                    ReadOutcome::Lapped { expected } => {
                        log::warn!(
                            "fell a ring lap behind at seq {expected}: catching up from a peer"
                        );
                        need_catchup = true;
                        break;
                    }
                    ReadOutcome::Corrupt { expected, error } => {
                        log::error!(
                            "corrupt entry at seq {expected}: {error}; fetching it from a peer"
                        );
                        need_catchup = true;
                        break;
                    }
                }
            }
            if !batch.is_empty() {
                let refs: Vec<(u64, &[u8])> =
                    batch.iter().map(|(p, b)| (*p, b.as_slice())).collect();
                let t = Instant::now();
                let res = {
                    let mut store = self.store();
                    // Under the store lock: a promise (which takes it too)
                    // either sees these entries or fences them out.
                    if self.epoch.load(Ordering::Acquire) != epoch
                        || !refs.iter().all(|(_, b)| {
                            self.admits(EntryHeader::parse(b).map(|h| h.view).unwrap_or(0))
                        })
                    {
                        drop(store);
                        batch.clear();
                        reader = self.reader();
                        epoch = self.epoch.load(Ordering::Acquire);
                        continue;
                    }
                    store.append(&refs)
                };
                if let Err(e) = res {
                    log::error!("cannot persist entries: {e}; stopping");
                    self.stop.store(true, Ordering::Relaxed);
                    return;
                }
                self.metrics.persist.observe(t.elapsed());
                let last = entry_seq(&batch[batch.len() - 1].1);
                self.metrics
                    .persisted_entries
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                self.persisted.store(last, Ordering::Release);
                self.ack(last);
                if let Some(f) = first_seen {
                    self.metrics.ack.observe(f.elapsed());
                }
                self.learn_commit(commit::learn_from_batch(lcs, last));
                batch.clear();
                gap.progress();
                backoff.reset();
                continue;
            }
            let stall = Stall {
                tail_ahead: self.region.tail() > reader.pos(),
                leader_node: self.is_leader_node(),
                following: self.region.role() == Role::Backup
                    && self.log_view.load(Ordering::Acquire) == self.region.view(),
            };
            if gap.decide(self.clock(), need_catchup, stall) {
                self.catch_up(&mut reader);
                continue;
            }
            self.learn_remote_commit();
            if backoff.is_completed() {
                // Writers ring after writing: a write since `seen` makes
                // this return at once.
                self.region.bell().wait(seen, Duration::from_millis(5));
            } else {
                backoff.snooze();
            }
        }
    }

    /// Fetches entries from `reader.expected()` on from a peer (the leader
    /// first), stores them, acks, and moves the reader past them.
    fn catch_up(&self, reader: &mut RingReader) {
        self.metrics.catchups.fetch_add(1, Ordering::Relaxed);
        let _sync = self.sync_lock.lock().unwrap_or_else(|p| p.into_inner());
        *reader = self.reader();
        let members: Vec<u64> = self.config.ids().collect();
        let plan = catchup::plan(
            self.me,
            self.region.leader(),
            &members,
            self.committed.load(Ordering::Acquire),
            reader.expected(),
        );
        for catchup::FetchPlan { peer, to } in plan {
            match self.fetch_from(peer, reader.expected(), to) {
                Ok(0) => continue,
                Ok(n) => {
                    let last = self.store().last();
                    log::info!(
                        "caught up {n} entries from node {peer}, now at seq {}",
                        last.seq
                    );
                    reader.reset(last.end_pos, last.seq + 1);
                    self.persisted.store(last.seq, Ordering::Release);
                    self.ack(last.seq);
                    return;
                }
                Err(e) => log::warn!("catch-up from node {peer} failed: {e:#}"),
            }
        }
    }

    pub(crate) fn control_connect(
        &self,
        peer: u64,
        connect_timeout: Duration,
    ) -> anyhow::Result<TcpStream> {
        let addr = self.config.node(peer)?.control;
        let s = handshake::connect(
            addr,
            &self.config.cluster,
            self.config.cluster_key()?,
            self.me,
            Channel::Control,
            connect_timeout,
        )?;
        s.set_read_timeout(Some(CONTROL_TIMEOUT))?;
        s.set_write_timeout(Some(CONTROL_TIMEOUT))?;
        Ok(s)
    }

    /// The view of `peer`'s entry `seq` (None: it has no such entry),
    /// without storing anything.
    pub(crate) fn peek_view(&self, peer: u64, seq: u64) -> anyhow::Result<Option<u64>> {
        let mut s = self.control_connect(peer, CONTROL_TIMEOUT)?;
        control::send_json(&mut s, &Request::Fetch { from: seq, to: seq })?;
        match control::recv_json::<Response>(&mut s)? {
            Response::Entries => {}
            Response::Error(e) => bail!("node {peer} refused: {e}"),
            other => bail!("node {peer} answered {other:?}"),
        }
        let mut view = None;
        loop {
            let batch = control::recv_entries(&mut s)?;
            if batch.is_empty() {
                return Ok(view);
            }
            for e in batch.iter().filter(|e| e.seq == seq) {
                view = EntryHeader::parse(&e.bytes).map(|h| h.view).ok();
            }
        }
    }

    /// How much of this node's log `peer`'s log holds too: the highest seq
    /// up to which both logs are equal, at least `floor` (this node's
    /// commit point, the same everywhere). Entries carry the view of the
    /// leader that wrote them and a view's leader writes each seq once, so
    /// equal (seq, view) means equal logs up to there: the last entry is
    /// probed first (the usual case: this log is a prefix of the peer's),
    /// then the boundary is bisected. Fails, touching nothing, when the
    /// peer does not answer — a sync must never cut entries it cannot
    /// fetch again (a restarted node may not know how much is committed).
    pub(crate) fn common_prefix(&self, peer: u64, floor: u64) -> anyhow::Result<u64> {
        let last = self.store().last().seq;
        let matches = |seq: u64| -> anyhow::Result<bool> {
            let mine = self
                .store()
                .range(seq, 1)?
                .into_iter()
                .find(|(s, _)| *s == seq)
                .map(|(_, e)| e.header().view);
            Ok(mine.is_some() && self.peek_view(peer, seq)? == mine)
        };
        PrefixSearch::new(last, floor).run(matches)
    }

    /// Fetches `from..=to` (to = 0: all) from `peer` into the store.
    /// Callers hold `sync_lock`.
    pub(crate) fn fetch_from(&self, peer: u64, from: u64, to: u64) -> anyhow::Result<u64> {
        let mut s = self.control_connect(peer, CONTROL_TIMEOUT)?;
        control::send_json(&mut s, &Request::Fetch { from, to })?;
        match control::recv_json::<Response>(&mut s)? {
            Response::Entries => {}
            Response::Error(e) => bail!("node {peer} refused: {e}"),
            other => bail!("node {peer} answered {other:?}"),
        }
        let mut n = 0u64;
        loop {
            let batch = control::recv_entries(&mut s)?;
            if batch.is_empty() {
                break;
            }
            for e in &batch {
                if let Err(why) = e.check(self.config.max_entry) {
                    bail!("node {peer} sent a bad entry {}: {why}", e.seq);
                }
            }
            let refs: Vec<(u64, &[u8])> =
                batch.iter().map(|e| (e.pos, e.bytes.as_slice())).collect();
            self.store().append(&refs)?;
            n += batch.len() as u64;
            self.metrics
                .fetched_entries
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
            self.persisted
                .store(batch[batch.len() - 1].seq, Ordering::Release);
        }
        Ok(n)
    }

    /// Leader: keeps backups' commit words fresh, so idle backups apply.
    /// Every node: refreshes its heartbeat for the preload.
    fn heartbeat_loop(&self) {
        let mut sent = 0u64;
        let mut last_send = Instant::now();
        let mut server_checked = Instant::now();
        while !self.stopping() {
            self.region.set_heartbeat(now_ms());
            self.check_session();
            if server_checked.elapsed() >= SERVER_CHECK {
                self.check_server();
                server_checked = Instant::now();
            }
            if self.region.role() == Role::Leader {
                let c = self.raise_leader_commit();
                self.learn_commit(c.min(self.persisted.load(Ordering::Acquire)));
                if c != sent || last_send.elapsed() > Duration::from_millis(100) {
                    let view = self.region.view();
                    for peer in self.config.ids().filter(|&i| i != self.me) {
                        if let Err(e) = self.transport.write(
                            peer,
                            view,
                            region::commit_record_offset(),
                            &region::commit_record(view, c),
                        ) {
                            self.note_refused_write(peer, &e);
                            log::debug!("commit heartbeat to node {peer}: {e}");
                        }
                    }
                    self.transport.flush();
                    sent = c;
                    last_send = Instant::now();
                }
            }
            // A timer, not the doorbell: under load the commit rides on
            // every entry's header, and waking on each entry would cost a
            // context switch here and, through the commit write, in every
            // backup's threads. Short, because when no entry follows, this
            // is how backups learn the commit and apply (bench follower's
            // apply latency: ~10 ms at a 10 ms period).
            std::thread::sleep(HEARTBEAT);
        }
    }

    /// Leader: raises the commit word to what the ack array proves a
    /// majority stored, never past what the server was handed. The preload
    /// raises it when an output waits; this keeps it moving when none does
    /// (a client that only pipelines `noreply` commands), so backups apply.
    fn raise_leader_commit(&self) -> u64 {
        let c = commit::leader_commit(
            self.config.ids(),
            self.config.majority(),
            |id| self.region.ack(id),
            self.region.served(),
        );
        self.region.raise_commit(c);
        self.region.commit()
    }

    /// A node whose server exited can neither serve clients nor apply the
    /// log: it steps down and goes stale (leaving the election, so that
    /// another node leads at once) until its server and follower are
    /// restarted and rebuild the server from the log.
    fn check_server(&self) {
        // A server attached once in this follower's life (its pid word is
        // set), and its lock is gone.
        let pid = self.region.preload_pid();
        if !crate::protocol::stale::server_exited(
            pid,
            self.region.server_attached(),
            self.stale.load(Ordering::Relaxed),
        ) {
            return;
        }
        log::error!(
            "node {}: its server (pid {pid}) exited; this node serves nothing until its server and follower are restarted",
            self.me
        );
        // Stale first: once demoted, the election thread must not find a
        // non-stale candidate that no longer leads and start a view for it.
        self.go_stale(format!("its server (pid {pid}) exited"));
        self.demote_self("its server exited");
    }

    /// Marks this node stale (it leaves the election; `status` says why).
    pub(crate) fn go_stale(&self, why: String) {
        *self.stale_reason.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        self.stale.store(true, Ordering::Relaxed);
    }

    /// Hands committed entries to the local server's passive preload, in
    /// log order, through the apply ring (backups, and a restarted leader
    /// before it serves again); see `feed` for why the preload applies.
    fn apply_loop(&self) {
        let mut feeder: Option<Feeder> = None;
        let mut last_saved = Instant::now();
        let mut reported = (0u64, Instant::now());
        let mut rate = ApplyRate::default();
        while !self.stopping() {
            let role = self.region.role();
            if role == Role::Leader || self.stale.load(Ordering::Relaxed) {
                // The leader's server consumed its inputs itself; a demoted
                // one resumes after what it consumed (a new stream).
                feeder = None;
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            let f = feeder.get_or_insert_with(|| {
                let next = self.applied.load(Ordering::Acquire) + 1;
                log::info!("node {}: applying from seq {next}", self.me);
                Feeder::start(self.region.clone(), next, self.config.max_entry)
            });
            let applied = f.applied();
            if applied != reported.0 || reported.1.elapsed() >= APPLIED_REPORT {
                self.report_applied(applied);
                reported = (applied, Instant::now());
            }
            rate.observe(applied);
            self.apply_rate.store(rate.per_second(), Ordering::Relaxed);
            let before = self.applied.swap(applied, Ordering::AcqRel);
            self.metrics
                .applied_entries
                .fetch_add(applied.saturating_sub(before), Ordering::Relaxed);
            self.metrics
                .divergences
                .store(self.region.apply().diverged(), Ordering::Relaxed);
            let persisted = self.persisted.load(Ordering::Acquire);
            let target = commit::apply_target(
                self.committed.load(Ordering::Acquire),
                persisted,
                role == Role::Joining && self.is_leader_node(),
            );
            let mut full = false;
            if f.next() <= target {
                let want = ((target + 1 - f.next()) as usize).min(256);
                let entries = match self.store().range(f.next(), want) {
                    Ok(e) => e,
                    Err(e) => {
                        log::error!("cannot read the log: {e}; stopping");
                        self.stop.store(true, Ordering::Relaxed);
                        return;
                    }
                };
                for (seq, e) in entries {
                    if seq != f.next() {
                        log::error!("log gap at seq {} while applying; stopping", f.next());
                        self.stop.store(true, Ordering::Relaxed);
                        return;
                    }
                    match f.feed(&e.header(), e.payload()) {
                        Ok(true) => {}
                        Ok(false) => {
                            full = true;
                            break;
                        }
                        Err(err) => {
                            log::error!("cannot hand seq {seq} to the server: {err}; stopping");
                            self.stop.store(true, Ordering::Relaxed);
                            return;
                        }
                    }
                }
                f.publish();
                if !full && f.next() <= target {
                    continue;
                }
            }
            if role == Role::Joining
                && self.is_leader_node()
                && self.log_view.load(Ordering::Acquire) == self.region.view()
                && applied >= target
                && f.next() > target
            {
                log::info!(
                    "node {}: server rebuilt up to seq {applied}; serving as leader",
                    self.me
                );
                self.region.set_role(Role::Leader);
                continue;
            }
            if last_saved.elapsed() > Duration::from_secs(1) {
                let _ = self.store().set_applied(applied);
                let _ = self
                    .store()
                    .set_commit(self.committed.load(Ordering::Acquire));
                last_saved = Instant::now();
            }
            if full || applied + 1 < f.next() {
                // The server is working through what was fed: its progress
                // rings no bell here.
                std::thread::sleep(Duration::from_micros(500));
            } else {
                let bell = self.region.bell();
                let seen = bell.value();
                if self
                    .committed
                    .load(Ordering::Acquire)
                    .min(self.persisted.load(Ordering::Acquire))
                    < f.next()
                {
                    bell.wait(seen, Duration::from_millis(2));
                }
            }
        }
    }

    fn accept_loop(self: Arc<Self>, listener: TcpListener) {
        while !self.stopping() {
            match listener.accept() {
                Ok((stream, from)) => {
                    let n = self.clone();
                    let _ = std::thread::Builder::new()
                        .name("peer".into())
                        .spawn(move || n.serve_peer(stream, from));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    log::warn!("control accept: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    fn serve_peer(&self, mut stream: TcpStream, from: std::net::SocketAddr) {
        let _ = stream.set_nonblocking(false);
        // Resolved at start (see `Node::start`): no I/O here.
        let key = match self.config.cluster_key() {
            Ok(k) => k,
            Err(e) => {
                log::error!("refused a connection from {from}: {e}");
                return;
            }
        };
        let hello = match handshake::accept(&mut stream, &self.config.cluster, key) {
            Ok(h) => h,
            Err(e) => {
                log::warn!("refused a connection from {from}: {e}");
                return;
            }
        };
        match hello.channel {
            Channel::Region => {
                if self.admit_region_writer(hello.node, from) {
                    self.region_server.serve(stream, hello.node)
                }
            }
            Channel::Control => {
                if let Err(e) = self.serve_control(&mut stream, hello.node, from) {
                    if e.kind() != std::io::ErrorKind::UnexpectedEof {
                        log::debug!("control connection from {from}: {e}");
                    }
                }
            }
        }
    }

    /// Serves the requests of a control connection from node `peer` (as
    /// its handshake proved; 0: a CLI client).
    fn serve_control(
        &self,
        s: &mut TcpStream,
        peer: u64,
        from: std::net::SocketAddr,
    ) -> std::io::Result<()> {
        s.set_read_timeout(None)?;
        loop {
            let req: Request = control::recv_json(s)?;
            if let Some(refusal) = self.refuse_request(peer, from, &req) {
                control::send_json(s, &refusal)?;
                continue;
            }
            match req {
                Request::Status => control::send_json(s, &Response::Status(self.status()))?,
                Request::Prepare { view, candidate } => {
                    control::send_json(s, &self.answer_prepare(view, candidate))?
                }
                Request::NewView { view, leader, last } => {
                    control::send_json(s, &self.answer_new_view(view, leader, last))?
                }
                Request::Fetch { from, to } => {
                    control::send_json(s, &Response::Entries)?;
                    let mut next = from.max(1);
                    loop {
                        let batch = match self.store().range(next, FETCH_BATCH) {
                            Ok(b) => b,
                            Err(e) => {
                                log::error!("serving fetch: {e}");
                                break;
                            }
                        };
                        let batch: Vec<FetchedEntry> = batch
                            .into_iter()
                            .take_while(|(seq, _)| to == 0 || *seq <= to)
                            .map(|(seq, e)| FetchedEntry {
                                seq,
                                pos: e.pos,
                                bytes: e.bytes,
                            })
                            .collect();
                        if batch.is_empty() {
                            break;
                        }
                        next = batch[batch.len() - 1].seq + 1;
                        control::send_entries(s, &batch)?;
                    }
                    control::send_entries(s, &[])?;
                }
            }
        }
    }
}

fn entry_seq(bytes: &[u8]) -> u64 {
    EntryHeader::parse(bytes).map(|h| h.seq).unwrap_or(0)
}

/// The apply rate over the last second or so (for lag in seconds).
#[derive(Debug)]
struct ApplyRate {
    since: Instant,
    from: u64,
    per_second: u64,
}

impl Default for ApplyRate {
    fn default() -> Self {
        ApplyRate {
            since: Instant::now(),
            from: 0,
            per_second: 0,
        }
    }
}

impl ApplyRate {
    fn observe(&mut self, applied: u64) {
        let dt = self.since.elapsed();
        if dt >= Duration::from_secs(1) {
            let n = applied.saturating_sub(self.from);
            self.per_second = (n as f64 / dt.as_secs_f64()) as u64;
            self.since = Instant::now();
            self.from = applied;
        }
    }

    fn per_second(&self) -> u64 {
        self.per_second
    }
}
