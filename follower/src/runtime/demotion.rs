//! Stopping leading: demotion (session lost, server exited, a newer view
//! seen at peers), remembering what the server consumed, and judging that
//! server once the new view's log is known ([`crate::protocol::stale`]).

use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::bail;
use lockstep_common::region::Role;
use lockstep_common::transport::TransportError;

use crate::protocol::stale::{self, ServerFate};

use super::Node;

impl Node {
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
    pub(super) fn step_down(&self) {
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
    pub(super) fn note_demotion(&self) {
        let log_view = self.log_view.load(Ordering::Acquire);
        let fenced = self
            .view_change()
            .demoted(log_view, || self.region.fence_handover());
        if let Some(served) = fenced {
            // Its server consumed everything up to there: never replay it.
            self.applied.fetch_max(served, Ordering::AcqRel);
        }
    }

    /// Notes that node `node` (0: some peer) is in `view`.
    pub(crate) fn observe_view(&self, node: u64, view: u64) {
        let (own, now) = (self.region.view(), self.clock());
        self.view_change().observe(node, view, own, now);
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
    pub(super) fn step_down_if_superseded(&self) -> bool {
        if self.region.role() != Role::Leader {
            return false;
        }
        self.observe_view(0, self.transport.fenced_by());
        let own = self.region.view();
        let patience = Duration::from_millis(self.config.election.session_timeout_ms);
        let now = self.clock();
        let stalled = self
            .view_change()
            .stalled(own, now, patience.as_millis() as u64);
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

    /// After the log was made equal to the new view's: a node that led
    /// keeps its server only if the server consumed everything of its view
    /// that the new log kept; it then resumes applying from there.
    pub(super) fn check_demoted_server(&self, from: u64) -> anyhow::Result<()> {
        let Some((led_view, served)) = self.view_change().take_led() else {
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
}
