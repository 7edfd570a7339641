//! The runtime side of election and view change (ZooKeeper mode): the
//! election thread, the candidate's rounds, and a node's answers to them.
//! What to decide lives in [`crate::protocol`]; this module does the
//! RocksDB, socket and region work.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use lockstep_common::control::{self, Request, Response};
use lockstep_common::entry::{self, EntryHeader, Kind};
use lockstep_common::region::Role;
use lockstep_common::transport::TransportError;

use crate::election::{Election, ElectionError, Session};
use crate::membership;
use crate::node::Node;
use crate::protocol::fence::{self, ViewRefusal};
use crate::protocol::stale::{self, ServerFate};
use crate::protocol::sync;
use crate::protocol::viewchange::{self, Candidate, Promise, Views};

/// Connect timeout of a view change's requests: a dead or cut-off peer
/// must not hold the candidate up for long.
const ROUND_CONNECT: Duration = Duration::from_millis(500);
/// Pause between failed attempts.
const RETRY: Duration = Duration::from_millis(200);

impl Node {
    /// The election thread: keeps the ZooKeeper membership, starts a view
    /// when this node is the candidate, joins the announced leader when it
    /// missed a view change, and stops leading when the session is lost.
    pub(crate) fn election_loop(&self) {
        let timeout = Duration::from_millis(self.config.election.session_timeout_ms);
        while !self.stopping() {
            let mut guard = self.election.lock().unwrap_or_else(|p| p.into_inner());
            if self.stale.load(Ordering::Relaxed) {
                // A node whose server must be rebuilt cannot lead: leave the
                // election (closing the session frees the znode at once) so
                // that the lowest znode is never one that cannot serve.
                if guard.take().is_some() {
                    *self.session_watch.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    log::warn!(
                        "node {}: left the election until this node is restarted",
                        self.me
                    );
                }
                drop(guard);
                std::thread::sleep(RETRY);
                continue;
            }
            let session = guard
                .as_ref()
                .map(|e| e.session())
                .unwrap_or(Session::Expired);
            match session {
                Session::Expired => {
                    self.demote_self("the ZooKeeper session expired");
                    *guard = None;
                    match Election::connect(
                        &self.config.election.zookeeper,
                        timeout,
                        &self.config.cluster,
                        self.me,
                    ) {
                        Ok(e) => {
                            *self.session_watch.lock().unwrap_or_else(|p| p.into_inner()) =
                                Some(e.watch());
                            *guard = Some(e);
                        }
                        Err(e) => {
                            log::warn!("node {}: {e}", self.me);
                            drop(guard);
                            std::thread::sleep(RETRY);
                        }
                    }
                    continue;
                }
                // The heartbeat thread demotes a leader that lost its
                // session (this one may be stuck in a request meanwhile).
                Session::Disconnected(_) => {}
                Session::Connected => {
                    let Some(election) = guard.as_ref() else {
                        continue;
                    };
                    if let Err(e) = self.election_step(election) {
                        log::warn!("node {}: {e:#}", self.me);
                        if matches!(
                            e.downcast_ref::<ElectionError>(),
                            Some(ElectionError::SessionLost)
                        ) {
                            // Our znode is gone although the client still
                            // looks connected: start over with a new session.
                            self.demote_self("the ZooKeeper session expired");
                            *guard = None;
                            continue;
                        }
                        drop(guard);
                        std::thread::sleep(RETRY);
                        continue;
                    }
                }
            }
            // Sleep until a watch fires; look again now and then anyway.
            // (Only this thread uses the election: holding the lock is fine.)
            if let Some(election) = guard.as_ref() {
                election.wait(Duration::from_millis(250));
            }
        }
    }

    fn election_step(&self, election: &Election) -> anyhow::Result<()> {
        if election.is_candidate()? {
            self.step_down_if_superseded();
            if !self.leading() && !self.stale.load(Ordering::Relaxed) {
                let view = self.lead_new_view(election)?;
                self.announce(election, view)?;
            } else {
                // The announcement after the view change may have failed
                // (ZooKeeper unreachable for a moment): publish it again,
                // or nodes that missed the view change never follow.
                let announced = election.leader()?.map(|r| (r.view, r.leader));
                let serving = self.region.role() == Role::Leader;
                if viewchange::announces(self.views(), serving, announced) {
                    let view = self.region.view();
                    let app = self.config.node(self.me)?.app.to_string();
                    election.publish_leader(view, &app)?;
                    log::info!("node {}: announced view {view} again", self.me);
                }
            }
            return Ok(());
        }
        // Not the candidate: follow the announced leader if this node
        // missed its view change (down, cut off, or restarted).
        let Some(rec) = election.leader()? else {
            return Ok(());
        };
        let log_view = self.log_view.load(Ordering::Acquire);
        if viewchange::joins_announced(self.views(), rec.view, rec.leader) {
            log::info!(
                "node {}: joining view {} led by node {} (log follows view {log_view})",
                self.me,
                rec.view,
                rec.leader
            );
            self.follow(rec.view, rec.leader, None)?;
        }
        Ok(())
    }

    /// What this node knows of its views, for the protocol's decisions.
    fn views(&self) -> Views {
        let promised_at = *self
            .view_change_at
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        Views {
            me: self.me,
            promised: self.region.view(),
            log_view: self.log_view.load(Ordering::Acquire),
            leader: self.region.leader(),
            changing: viewchange::changing(promised_at, self.clock()),
        }
    }

    /// Whether this node leads a view that started here.
    fn leading(&self) -> bool {
        viewchange::leading(
            self.me,
            self.region.leader(),
            self.region.view(),
            self.log_view.load(Ordering::Acquire),
        )
    }

    /// Publishes this node as leader once its preload went active.
    fn announce(&self, election: &Election, view: u64) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(600);
        while self.region.role() != Role::Leader {
            // Demoted before serving (the session wavered): not leading,
            // so the election loop goes on and may start a newer view.
            let demoted = self.region.leader() != self.me;
            if self.stopping() || demoted || self.region.view() != view || Instant::now() > deadline
            {
                bail!("view {view} did not start here");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let app = self.config.node(self.me)?.app.to_string();
        election.publish_leader(view, &app)?;
        log::info!(
            "node {}: leading view {view}, clients connect to {app}",
            self.me
        );
        Ok(())
    }

    /// Called often from the heartbeat thread: a leader serves only while
    /// its ZooKeeper session is surely valid. ZooKeeper hands the lead to
    /// another node once the session times out; stop well before that.
    pub(crate) fn check_session(&self) {
        if self.region.role() != Role::Leader {
            return;
        }
        let timeout = Duration::from_millis(self.config.election.session_timeout_ms);
        let session = match self
            .session_watch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            Some(w) => w.session(),
            None => return,
        };
        // A blip shorter than the session timeout changes nothing: the
        // session (and the leader's znode) outlives it, and while the
        // link is down the leader cannot commit anyway (the backups' acks
        // do not reach it). Safety never rests on this demotion: a backup
        // that promised a newer view stores no entry of an older one
        // (`admits`, under the store lock), so a deposed leader reaches no
        // majority. Demoting only makes its clients fail over instead of
        // waiting; it happens once ZooKeeper has surely expired the
        // session (it expires it a timeout after it last heard from us,
        // which is before we noticed the silence).
        match session {
            Session::Connected => {}
            Session::Disconnected(d) if d < timeout => {}
            Session::Disconnected(_) => self.demote_self("lost ZooKeeper for a session timeout"),
            Session::Expired => self.demote_self("the ZooKeeper session expired"),
        }
    }

    /// Stops leading (the preload fails its clients' connections).
    pub(crate) fn demote_self(&self, why: &str) {
        if self.region.role() == Role::Leader {
            log::warn!("node {}: {why}: no longer accepting writes", self.me);
            self.step_down();
            self.region.bell().ring();
        }
    }

    /// Another view is being made: this node neither leads nor is about to
    /// (a view it started but whose preload is not active yet counts too,
    /// or the apply loop would activate it in the newer view).
    fn step_down(&self) {
        if self.region.role() == Role::Leader {
            self.note_demotion();
            self.region.set_role(Role::Joining);
        }
        // Nobody's leader until a view change says so: else the apply loop
        // would take this node for a restarted leader and flip it back.
        if self.region.leader() == self.me {
            self.region.set_leader(0);
        }
    }

    /// Remembers what the server consumed while this node led.
    fn note_demotion(&self) {
        let mut d = self.demoted.lock().unwrap_or_else(|p| p.into_inner());
        if d.is_none() {
            let served = self.region.fence_handover();
            *d = Some((self.log_view.load(Ordering::Acquire), served));
            // Its server consumed everything up to there: never replay it.
            self.applied.fetch_max(served, Ordering::AcqRel);
        }
    }

    /// The answer to a control request that node `peer` (as its
    /// handshake proved) may not make, if it may not (see
    /// [`crate::membership`]); the refusal is logged.
    pub(crate) fn refuse_request(
        &self,
        peer: u64,
        from: std::net::SocketAddr,
        req: &Request,
    ) -> Option<Response> {
        let members: Vec<u64> = self.config.ids().collect();
        let why = membership::admit(&members, self.me, peer, req).err()?;
        log::warn!(
            "node {}: refused {} from node {peer} at {from}: {why}",
            self.me,
            membership::describe(req)
        );
        Some(Response::Error(format!("refused: {why}")))
    }

    /// Whether node `peer` may write into this node's region (tcp
    /// transport); a refusal is logged.
    pub(crate) fn admit_region_writer(&self, peer: u64, from: std::net::SocketAddr) -> bool {
        let members: Vec<u64> = self.config.ids().collect();
        match membership::admit_peer(&members, self.me, peer) {
            Ok(()) => true,
            Err(why) => {
                log::warn!(
                    "node {}: refused region writes from node {peer} at {from}: {why}",
                    self.me
                );
                false
            }
        }
    }

    /// Answers a `Prepare` (its sender was admitted).
    pub(crate) fn answer_prepare(&self, view: u64, candidate: u64) -> Response {
        match self.promise(view, candidate) {
            Ok(p) => Response::Promise(p),
            Err(e) => refusal(e),
        }
    }

    /// Answers a `NewView` (its sender was admitted).
    pub(crate) fn answer_new_view(&self, view: u64, leader: u64, last: u64) -> Response {
        match self.follow(view, leader, Some(last)) {
            Ok(last) => Response::Synced { last },
            Err(e) => refusal(e),
        }
    }

    /// Checks a view change request for `view` against this node's own
    /// views: not older than its promise, not implausibly far above it.
    fn check_requested_view(&self, view: u64) -> Result<(), ViewRefusal> {
        fence::check_requested_view(
            self.me,
            self.region.view(),
            self.log_view.load(Ordering::Acquire),
            view,
        )
    }

    /// Notes that node `node` (0: some peer) is in `view`.
    pub(crate) fn observe_view(&self, node: u64, view: u64) {
        let own = self.region.view();
        self.newer_views
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .observe(node, view, own, self.clock());
    }

    /// Notes the view a peer refused a write of this node's with.
    pub(crate) fn note_refused_write(&self, peer: u64, e: &TransportError) {
        if let TransportError::Fenced { theirs, .. } = e {
            self.observe_view(peer, *theirs);
        }
    }

    /// A leader whose peer has been in a newer view for a session timeout
    /// (its preload fails every input meanwhile: a peer fences its writes)
    /// stops leading, so that the election starts a view above that one.
    /// Returns whether it stepped down.
    fn step_down_if_superseded(&self) -> bool {
        if self.region.role() != Role::Leader {
            return false;
        }
        self.observe_view(0, self.transport.fenced_by());
        let own = self.region.view();
        let patience = Duration::from_millis(self.config.election.session_timeout_ms);
        let stalled = self
            .newer_views
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stalled(own, self.clock(), patience.as_millis() as u64);
        let Some((node, view)) = stalled else {
            return false;
        };
        let who = if node == 0 {
            "a peer".to_string()
        } else {
            format!("node {node}")
        };
        self.demote_self(&format!(
            "{who} has been in view {view} for {patience:?}, which did not replace view {own} led here: \
             starting a view above it"
        ));
        true
    }

    /// Phase 1 on this node: fence every view below `view`, report the log.
    pub(crate) fn promise(&self, view: u64, candidate: u64) -> anyhow::Result<Promise> {
        let _sync = self.sync_lock.lock().unwrap_or_else(|p| p.into_inner());
        // The poll loop appends under the store lock and checks the fence
        // there: after this block it appends nothing of an older view.
        let store = self.store();
        self.check_requested_view(view)?;
        store.set_view(view)?;
        self.region.raise_view(view);
        self.step_down();
        *self
            .view_change_at
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(self.clock());
        self.region.bell().ring();
        let p = Promise {
            node: self.me,
            log_view: self.log_view.load(Ordering::Acquire),
            last_seq: store.last().seq,
            committed: self.committed.load(Ordering::Acquire),
            led: *self.demoted.lock().unwrap_or_else(|p| p.into_inner()),
        };
        log::info!(
            "node {}: promised view {view} to node {candidate}: {p:?}",
            self.me
        );
        Ok(p)
    }

    /// Phase 2 on this node (and a late join): make the log equal to
    /// `leader`'s, follow it in `view`, ack. Returns the last stored seq.
    pub(crate) fn follow(&self, view: u64, leader: u64, last: Option<u64>) -> anyhow::Result<u64> {
        let _sync = self.sync_lock.lock().unwrap_or_else(|p| p.into_inner());
        self.check_requested_view(view)?;
        self.store().set_view(view)?;
        self.region.raise_view(view);
        self.step_down();
        let floor = sync::sync_point(
            self.store().last().seq,
            self.committed.load(Ordering::Acquire),
        );
        // Keep what the leader's log holds too; fail before cutting
        // anything when the leader does not answer.
        let cut = self
            .common_prefix(leader, floor)
            .with_context(|| format!("comparing the log with node {leader}'s"))?;
        {
            self.store().truncate_after(cut)?;
            self.epoch.fetch_add(1, Ordering::AcqRel);
        }
        self.persisted.store(cut, Ordering::Release);
        self.fetch_from(leader, cut + 1, 0)
            .with_context(|| format!("fetching view {view}'s log from node {leader}"))?;
        let end = self.store().last().seq;
        sync::check_synced(leader, end, last)?;
        self.check_demoted_server(cut)?;
        self.store().set_log_view(view)?;
        self.log_view.store(view, Ordering::Release);
        // The old leader's tail word would look like entries we missed.
        self.region.set_tail(self.store().last().end_pos);
        self.region.set_leader(leader);
        self.region.set_role(Role::Backup);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        *self
            .view_change_at
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
        self.region.bell().ring();
        self.ack(end);
        log::info!(
            "node {}: following node {leader} in view {view}, log ends at {end}",
            self.me
        );
        Ok(end)
    }

    /// After the log was made equal to the new view's: a node that led
    /// keeps its server only if the server consumed everything of its view
    /// that the new log kept; it then resumes applying from there.
    fn check_demoted_server(&self, from: u64) -> anyhow::Result<()> {
        let Some((led_view, served)) = self
            .demoted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        else {
            return Ok(());
        };
        let mut next = from.min(served) + 1;
        let mut kept = Vec::new();
        loop {
            let batch = self.store().range(next, 1024)?;
            if batch.is_empty() {
                break;
            }
            next = batch[batch.len() - 1].0 + 1;
            kept.extend(batch.into_iter().map(|(seq, e)| (seq, e.header().view)));
        }
        let why = match stale::demoted_server_fate(led_view, served, from, kept) {
            ServerFate::InLine => None,
            ServerFate::Missed(seq) => Some(format!(
                "its server consumed view {led_view} up to seq {served}, but the new view kept seq {seq} \
                 of that view, which the server never saw"
            )),
            ServerFate::Dropped(seq) => Some(format!(
                "its server executed seq {seq} of view {led_view}, which the new view dropped \
                 (output commit: it was never acknowledged to a client)"
            )),
        };
        if let Some(why) = why {
            self.go_stale(why.clone());
            bail!(
                "node {}: {why}; restart this node's server and follower to rebuild it from the log",
                self.me
            );
        }
        self.applied.fetch_max(served, Ordering::AcqRel);
        Ok(())
    }

    /// Takes the next view from ZooKeeper and starts it.
    fn lead_new_view(&self, election: &Election) -> anyhow::Result<u64> {
        let view = election.claim_view(self.view_floor())?;
        self.start_view(view)
    }

    /// Views above this one are new to this node and to every peer it
    /// saw: the next view it tries is above it.
    fn view_floor(&self) -> u64 {
        let own = self
            .region
            .view()
            .max(self.log_view.load(Ordering::Acquire));
        self.newer_views
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .next_view(own)
            - 1
    }

    /// Static election: the configured leader opens every run with a view
    /// change of its own (it alone starts views, so no ZooKeeper is needed):
    /// a restarted leader thereby adopts entries the backups stored and
    /// acked that its own log lacks, instead of reusing their seqs. A backup
    /// that missed such a view change follows the leader's view when it
    /// sees it.
    pub(crate) fn static_loop(&self) {
        let leader = self.config.election.leader;
        while !self.stopping() {
            if leader == self.me {
                self.step_down_if_superseded();
                if !self.leading() && !self.stale.load(Ordering::Relaxed) {
                    match self.start_view(self.view_floor() + 1) {
                        Ok(v) => log::info!("node {}: leading view {v} (static election)", self.me),
                        Err(e) => log::warn!("node {}: {e:#}; retrying", self.me),
                    }
                }
            } else if let Ok(s) =
                control::query_status(&self.config, leader, Duration::from_secs(1))
            {
                if viewchange::follows_static(self.views(), s.view, s.role == "leader") {
                    if let Err(e) = self.follow(s.view, leader, None) {
                        log::warn!(
                            "node {}: following node {leader} in view {}: {e:#}",
                            self.me,
                            s.view
                        );
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// The candidate's rounds for `view`. Returns the view started.
    fn start_view(&self, view: u64) -> anyhow::Result<u64> {
        log::info!("node {}: candidate for view {view}", self.me);
        let members: Vec<u64> = self.config.ids().collect();
        let mut cand = Candidate::new(view, self.me, &members);
        cand.promise(self.promise(view, self.me)?);
        let mut outdated = Vec::new();
        for (peer, r) in self.round(&Request::Prepare {
            view,
            candidate: self.me,
        }) {
            match r {
                Ok(Response::Promise(p)) if p.node == peer => cand.promise(p),
                Ok(Response::Outdated { promised }) => {
                    log::info!("view {view}: node {peer} promised view {promised} already");
                    self.observe_view(peer, promised);
                    outdated.push(promised);
                }
                Ok(other) => log::info!("view {view}: node {peer} answered {other:?}"),
                Err(e) => log::info!("view {view}: no promise from node {peer}: {e:#}"),
            }
        }
        // A peer fenced above this view would refuse its leader's writes
        // (the preload fails every input then): try above it at once.
        if let Some(p) = viewchange::superseded(view, outdated.iter().copied()) {
            bail!("view {view}: a peer promised view {p} already; trying a view above it");
        }
        let Some(adopt) = cand.decide() else {
            bail!("view {view}: no majority promised");
        };
        log::info!(
            "view {view}: adopting node {}'s log of view {} up to seq {}",
            adopt.source,
            adopt.log_view,
            adopt.last_seq
        );
        let view_seq = self.adopt(view, adopt)?;
        let mut holders = vec![self.me];
        for (peer, r) in self.round(&Request::NewView {
            view,
            leader: self.me,
            last: view_seq,
        }) {
            match r {
                Ok(Response::Synced { last }) if last >= view_seq => holders.push(peer),
                Ok(Response::Outdated { promised }) => {
                    log::info!("view {view}: node {peer} promised view {promised} meanwhile");
                    self.observe_view(peer, promised);
                    outdated.push(promised);
                }
                Ok(other) => log::info!("view {view}: node {peer} answered {other:?}"),
                Err(e) => log::info!("view {view}: node {peer} did not sync: {e:#}"),
            }
        }
        if let Some(p) = viewchange::superseded(view, outdated.iter().copied()) {
            bail!("view {view}: a peer promised view {p} meanwhile; trying a view above it");
        }
        if holders.len() < viewchange::majority(members.len()) {
            bail!("view {view}: only nodes {holders:?} hold its log, no majority");
        }
        // Started: everything up to the VIEW entry is committed.
        let last = self.store().last();
        self.region.clear_acks();
        for &h in &holders {
            self.region.set_ack(h, view_seq);
        }
        self.committed.fetch_max(view_seq, Ordering::AcqRel);
        self.region.set_commit(view_seq);
        self.region.open_handover(view_seq);
        self.store().set_commit(view_seq)?;
        self.region.set_writer_start(view_seq + 1, last.end_pos);
        self.region.set_tail(last.end_pos);
        self.region.set_leader(self.me);
        // The apply loop replays up to the VIEW entry (closing every replay
        // connection), then flips the preload to active.
        self.region.set_role(Role::Joining);
        *self
            .view_change_at
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
        self.region.bell().ring();
        log::info!("view {view} started at seq {view_seq} with nodes {holders:?}");
        Ok(view)
    }

    /// Makes this node's log the adopted one plus a VIEW entry; returns the
    /// VIEW entry's seq.
    fn adopt(&self, view: u64, adopt: viewchange::Adoption) -> anyhow::Result<u64> {
        let _sync = self.sync_lock.lock().unwrap_or_else(|p| p.into_inner());
        let committed = self.committed.load(Ordering::Acquire);
        if adopt.source != self.me {
            let floor = sync::sync_point(self.store().last().seq, committed);
            let shared = self
                .common_prefix(adopt.source, floor)
                .with_context(|| format!("comparing the log with node {}'s", adopt.source))?;
            let cut = sync::adopt_cut(shared, adopt.last_seq, floor);
            self.store().truncate_after(cut)?;
            self.epoch.fetch_add(1, Ordering::AcqRel);
            if adopt.last_seq > cut {
                self.fetch_from(adopt.source, cut + 1, adopt.last_seq)
                    .with_context(|| {
                        format!("fetching the adopted log from node {}", adopt.source)
                    })?;
            }
        }
        let mut store = self.store();
        store.truncate_after(adopt.last_seq)?;
        let last = store.last();
        if last.seq != adopt.last_seq {
            return Err(sync::SyncError::Adopted {
                end: last.seq,
                want: adopt.last_seq,
            }
            .into());
        }
        let mut hdr = EntryHeader::new(Kind::View, view, last.seq + 1, 0, 0);
        hdr.last_committed = adopt.committed.max(committed);
        let bytes = entry::encode(&hdr, &[]);
        store.append(&[(last.end_pos, &bytes)])?;
        store.set_log_view(view)?;
        drop(store);
        self.log_view.store(view, Ordering::Release);
        self.persisted.store(hdr.seq, Ordering::Release);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        drop(_sync);
        self.check_demoted_server(adopt.committed.min(committed))?;
        Ok(hdr.seq)
    }

    /// Sends `req` to every other node at once; their answers.
    fn round(&self, req: &Request) -> Vec<(u64, anyhow::Result<Response>)> {
        let peers: Vec<u64> = self.config.ids().filter(|&i| i != self.me).collect();
        std::thread::scope(|s| {
            let handles: Vec<_> = peers
                .iter()
                .map(|&peer| {
                    (
                        peer,
                        s.spawn(move || -> anyhow::Result<Response> {
                            let mut c = self.control_connect(peer, ROUND_CONNECT)?;
                            control::send_json(&mut c, req)?;
                            Ok(control::recv_json::<Response>(&mut c)?)
                        }),
                    )
                })
                .collect();
            handles
                .into_iter()
                .map(|(peer, h)| {
                    (
                        peer,
                        h.join()
                            .unwrap_or_else(|_| Err(anyhow::anyhow!("request thread panicked"))),
                    )
                })
                .collect()
        })
    }
}

/// The answer to a view change request this node refused: `Outdated`
/// when it promised a newer view (the candidate then tries above it).
fn refusal(e: anyhow::Error) -> Response {
    match e.downcast_ref::<ViewRefusal>() {
        Some(ViewRefusal::Outdated { promised, .. }) => Response::Outdated {
            promised: *promised,
        },
        _ => Response::Error(format!("{e:#}")),
    }
}
