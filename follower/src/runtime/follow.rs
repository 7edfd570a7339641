//! A node's side of a view change: the promise (phase 1) and making its
//! log equal to the new leader's (phase 2, or a late join).

use std::sync::atomic::Ordering;

use anyhow::Context;
use lockstep_common::region::Role;

use crate::protocol::fence::{self, ViewRefusal};
use crate::protocol::sync;
use crate::protocol::viewchange::{self, Promise, Views};

use super::Node;

impl Node {
    /// What this node knows of its views, for the protocol's decisions.
    pub(super) fn views(&self) -> Views {
        let changing = self.view_change().changing(self.clock());
        Views {
            me: self.me,
            promised: self.region.view(),
            log_view: self.log_view.load(Ordering::Acquire),
            leader: self.region.leader(),
            changing,
        }
    }

    /// Whether this node leads a view that started here.
    pub(super) fn leading(&self) -> bool {
        viewchange::leading(
            self.me,
            self.region.leader(),
            self.region.view(),
            self.log_view.load(Ordering::Acquire),
        )
    }

    /// Checks a view change request for `view` against this node's own
    /// views: not older than its promise, not implausibly far above it.
    pub(super) fn check_requested_view(&self, view: u64) -> Result<(), ViewRefusal> {
        fence::check_requested_view(
            self.me,
            self.region.view(),
            self.log_view.load(Ordering::Acquire),
            view,
        )
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
        let now = self.clock();
        self.view_change().promised(now);
        self.region.bell().ring();
        let p = Promise {
            node: self.me,
            log_view: self.log_view.load(Ordering::Acquire),
            last_seq: store.last().seq,
            committed: self.committed.load(Ordering::Acquire),
            led: self.view_change().led(),
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
        {
            let store = self.store();
            store.set_log_view(view)?;
            // Under the store lock, the epoch before the log view: a poll
            // loop whose reader predates the fetch either still finds the
            // old log view (and stores none of this view's entries) or the
            // new epoch (and reads again from the log's end). Publishing
            // the log view first let it append a ring batch from before
            // the fetch behind the fetched entries (a gap error that
            // stopped the follower).
            self.epoch.fetch_add(1, Ordering::AcqRel);
            self.log_view.store(view, Ordering::Release);
        }
        // The old leader's tail word would look like entries we missed.
        self.region.set_tail(self.store().last().end_pos);
        self.region.set_leader(leader);
        self.region.set_role(Role::Backup);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.view_change().settled();
        self.region.bell().ring();
        self.ack(end);
        log::info!(
            "node {}: following node {leader} in view {view}, log ends at {end}",
            self.me
        );
        Ok(end)
    }
}
