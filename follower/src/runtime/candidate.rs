//! The candidate's side of a view change: its rounds, adopting the chosen
//! log and appending the view-start entry ([`crate::protocol::viewchange`]
//! decides).

use std::sync::atomic::Ordering;

use anyhow::{bail, Context};
use lockstep_common::control::{Request, Response};
use lockstep_common::entry::{self, EntryHeader, Kind};
use lockstep_common::region::Role;

use crate::protocol::sync;
use crate::protocol::viewchange::{self, Candidate};

use super::Node;

impl Node {
    /// Views above this one are new to this node and to every peer it
    /// saw: the next view it tries is above it.
    pub(super) fn view_floor(&self) -> u64 {
        let own = self
            .region
            .view()
            .max(self.log_view.load(Ordering::Acquire));
        self.view_change().view_floor(own)
    }

    /// The candidate's rounds for `view`. Returns the view started.
    pub(super) fn start_view(&self, view: u64) -> anyhow::Result<u64> {
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
        self.view_change().settled();
        self.region.bell().ring();
        log::info!("view {view} started at seq {view_seq} with nodes {holders:?}");
        Ok(view)
    }

    /// Makes this node's log the adopted one plus a VIEW entry; returns the
    /// VIEW entry's seq.
    pub(super) fn adopt(&self, view: u64, adopt: viewchange::Adoption) -> anyhow::Result<u64> {
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
        // Under the store lock, the epoch before the log view (see
        // `follow`): the poll loop stores nothing it read before.
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.log_view.store(view, Ordering::Release);
        drop(store);
        self.persisted.store(hdr.seq, Ordering::Release);
        drop(_sync);
        self.check_demoted_server(adopt.committed.min(committed))?;
        Ok(hdr.seq)
    }
}
