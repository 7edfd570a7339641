//! The election thread (election mode "zookeeper"): keeps the ZooKeeper
//! membership, starts a view when this node is the candidate, joins the
//! announced leader, and demotes a leader that lost its session.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::bail;
use lockstep_common::region::Role;

use crate::election::{Election, ElectionError, Session};
use crate::protocol::viewchange::{self, SessionLoss};
use crate::protocol::{self, Millis};

use super::Node;

/// Pause between failed attempts.
pub(super) const RETRY: Duration = Duration::from_millis(200);

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
                    self.demote_self(&SessionLoss::Expired.to_string());
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
                            self.demote_self(&SessionLoss::Expired.to_string());
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

    pub(super) fn election_step(&self, election: &Election) -> anyhow::Result<()> {
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

    /// Publishes this node as leader once its preload went active.
    pub(super) fn announce(&self, election: &Election, view: u64) -> anyhow::Result<()> {
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
        let session = match self
            .session_watch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            Some(w) => w.session(),
            None => return,
        };
        // The rule and why: [`viewchange::session_loss`].
        let timeout = self.config.election.session_timeout_ms as Millis;
        if let Some(loss) = viewchange::session_loss(protocol_session(session), timeout) {
            self.demote_self(&loss.to_string());
        }
    }

    /// Takes the next view from ZooKeeper and starts it.
    pub(super) fn lead_new_view(&self, election: &Election) -> anyhow::Result<u64> {
        let view = election.claim_view(self.view_floor())?;
        self.start_view(view)
    }
}

/// The election's session state as the protocol sees it.
fn protocol_session(session: Session) -> protocol::Session {
    match session {
        Session::Connected => protocol::Session::Connected,
        Session::Disconnected(d) => protocol::Session::Disconnected(d.as_millis() as Millis),
        Session::Expired => protocol::Session::Expired,
    }
}
