//! The election thread (election mode "zookeeper"): keeps the ZooKeeper
//! membership, tells the replica the election's state
//! ([`crate::protocol::Event::Election`]) and carries out its ZooKeeper
//! requests (claiming a view, announcing the leader).

use std::time::Duration;

use lockstep_common::control;
use lockstep_common::region::Role;

use crate::io::zookeeper::{ElectionError, Session, ZkElection};
use crate::protocol::Event;
use crate::runtime::log_limit::Repeats;

use super::carried::Carried;
use super::heartbeat::protocol_session;
use super::node::ZkRequest;
use super::Node;

/// Pause between failed attempts.
pub(super) const RETRY: Duration = Duration::from_millis(200);
/// How long a candidate waits for the status of the leader it follows.
const STATUS_QUERY: Duration = Duration::from_secs(1);

/// Logs a warning unless the same one was logged within the period.
fn warn_limited(warnings: &mut Repeats, what: String) {
    if let Some(line) = warnings.line(&what, std::time::Instant::now()) {
        log::warn!("{line}");
    }
}

impl Node {
    /// The election thread: until `stop`.
    pub(crate) fn election_loop(&self) {
        let timeout = Duration::from_millis(self.config.election.session_timeout_ms);
        // ZooKeeper away: one warning, then one every 10 s with a count.
        let mut warnings = Repeats::default();
        let mut lost = false;
        while !self.stopping() {
            let mut guard = self.election.lock().unwrap_or_else(|p| p.into_inner());
            if self.replica().stale().is_some() {
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
                    self.election_lost();
                    if guard.take().is_some() && !lost {
                        lost = true;
                        log::warn!(
                            "node {}: ZooKeeper session at {} lost; registering again when it answers",
                            self.me,
                            self.config.election.zookeeper
                        );
                    }
                    match ZkElection::connect(
                        &self.config.election.zookeeper,
                        timeout,
                        &self.config.cluster,
                        self.me,
                    ) {
                        Ok(e) => {
                            *self.session_watch.lock().unwrap_or_else(|p| p.into_inner()) =
                                Some(e.watch());
                            *guard = Some(e);
                            if std::mem::take(&mut lost) {
                                log::info!(
                                    "node {}: ZooKeeper session at {} established again",
                                    self.me,
                                    self.config.election.zookeeper
                                );
                            }
                            warnings.clear();
                        }
                        Err(e) => {
                            lost = true;
                            warn_limited(&mut warnings, format!("node {}: {e}", self.me));
                            drop(guard);
                            std::thread::sleep(RETRY);
                        }
                    }
                    continue;
                }
                // The heartbeat thread tells the replica (this thread may
                // be stuck in a request meanwhile).
                Session::Disconnected(_) => {}
                Session::Connected => {
                    let Some(election) = guard.as_mut() else {
                        continue;
                    };
                    if let Err(e) = self.election_step(election) {
                        warn_limited(&mut warnings, format!("node {}: {e:#}", self.me));
                        if matches!(
                            e,
                            ElectionError::SessionLost | ElectionError::NoAnswer { .. }
                        ) {
                            // Our znode is gone although the client still
                            // looks connected, or the client is wedged:
                            // start over with a new session.
                            self.election_lost();
                            *guard = None;
                            lost = true;
                            continue;
                        }
                        drop(guard);
                        std::thread::sleep(RETRY);
                        continue;
                    }
                }
            }
            // Sleep until a watch fires or the replica has a request;
            // look again now and then anyway. (Only this thread uses the
            // election: holding the lock is fine.)
            if let Some(election) = guard.as_ref() {
                if self.zk_pending() {
                    continue;
                }
                election.wait(Duration::from_millis(250));
            }
        }
    }

    /// The session is gone (expired, or our znode vanished).
    fn election_lost(&self) {
        self.step(
            Event::Election {
                session: protocol_session(Session::Expired),
                candidate: false,
                announced: None,
                followed_serving: false,
            },
            Carried::Nothing,
        );
    }

    /// The replica's oldest ZooKeeper request not carried out yet (one
    /// that fails is not retried: the replica asks again).
    fn next_zk_request(&self) -> Option<ZkRequest> {
        let mut q = self.zk_requests.lock().unwrap_or_else(|p| p.into_inner());
        (!q.is_empty()).then(|| q.remove(0))
    }

    fn zk_pending(&self) -> bool {
        !self
            .zk_requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// Whether the leader this backup follows answers that it leads a
    /// view at least as new as this node's log and its entries commit
    /// (what the replica needs to give way as candidate; see
    /// `viewchange::yields`).
    fn followed_leader_serves(&self) -> bool {
        let (role, leader, log_view) = {
            let r = self.replica();
            (r.role(), r.leader(), r.log_view())
        };
        if role != Role::Backup || leader == 0 || leader == self.me {
            return false;
        }
        control::query_status(&self.config, leader, STATUS_QUERY).is_ok_and(|s| {
            s.role == "leader"
                && s.view >= log_view
                && s.commit_wait_ms < self.config.election.session_timeout_ms
        })
    }

    /// Tells the replica the election's state, then carries out its
    /// ZooKeeper requests.
    fn election_step(&self, election: &mut ZkElection) -> Result<(), ElectionError> {
        let candidate = election.is_candidate()?;
        let announced = election.leader()?.map(|r| (r.view, r.leader));
        let followed_serving = candidate && self.followed_leader_serves();
        self.step(
            Event::Election {
                session: protocol_session(Session::Connected),
                candidate,
                announced,
                followed_serving,
            },
            Carried::Nothing,
        );
        while let Some(req) = self.next_zk_request() {
            match req {
                ZkRequest::Claim { floor } => match election.claim_view(floor) {
                    Ok(view) => self.step(Event::ViewClaimed { view }, Carried::Nothing),
                    Err(e) => {
                        // ZooKeeper's answer is the claim's: none.
                        self.step(Event::Unanswered { to: 0 }, Carried::Nothing);
                        return Err(e);
                    }
                },
                ZkRequest::Yield => election.register_again()?,
                ZkRequest::Announce { view } => {
                    let app = self
                        .config
                        .node(self.me)
                        .map(|n| n.app.to_string())
                        .unwrap_or_default();
                    election.publish_leader(view, &app)?;
                    log::info!(
                        "node {}: leading view {view}, clients connect to {app}",
                        self.me
                    );
                }
            }
        }
        Ok(())
    }
}
