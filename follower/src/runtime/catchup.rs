//! Fetching entries from peers over the control channel: catch-up after a
//! gap, and the probes and fetches of a log sync.

use std::sync::atomic::Ordering;

use anyhow::bail;
use lockstep_common::control::{self, Request, Response};
use lockstep_common::entry::EntryHeader;
use lockstep_common::ring::RingReader;

use crate::protocol::catchup;
use crate::protocol::sync::PrefixSearch;

use super::control_client::CONTROL_TIMEOUT;
use super::Node;

impl Node {
    /// Fetches entries from `reader.expected()` on from a peer (the leader
    /// first), stores them, acks, and moves the reader past them.
    pub(super) fn catch_up(&self, reader: &mut RingReader) {
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
}
