//! Carries out the replica's [`Action`]s: the store, the region, the
//! transport's one-sided writes, and (handed to other threads, which step
//! the replica with the outcome) control requests and ZooKeeper requests.

use std::sync::atomic::Ordering;
use std::time::Instant;

use lockstep_common::entry::{self, EntryHeader, Kind};
use lockstep_common::region::{self, Role};
use lockstep_common::transport::TransportError;

use crate::protocol::{Action, Event, Message};

use super::carried::Carried;
use super::node::ZkRequest;
use super::Node;

impl Node {
    /// Carries out one action of a step whose event carried `carried`; an
    /// event it produced (a write a peer refused), to step next.
    pub(super) fn carry_out(&self, action: Action, carried: Carried<'_>) -> Option<Event> {
        match action {
            Action::Persist { last } => self.persist(last, carried),
            Action::ResetReader => {
                self.epoch.fetch_add(1, Ordering::AcqRel);
            }
            Action::Truncate { after } => {
                let cut = {
                    let mut store = self.store();
                    if store.last().seq > after {
                        store.truncate_after(after)
                    } else {
                        Ok(())
                    }
                };
                if let Err(e) = cut {
                    self.fail(&format!("cannot cut the log after seq {after}: {e}"));
                }
                self.epoch.fetch_add(1, Ordering::AcqRel);
            }
            Action::AppendView {
                view,
                seq,
                last_committed,
            } => {
                let mut store = self.store();
                let end = store.last().end_pos;
                let mut hdr = EntryHeader::new(Kind::View, view, seq, 0, 0);
                hdr.last_committed = last_committed;
                // The log's first entry says when it began (see `origin`).
                let payload = super::origin::view_payload(seq, super::origin::now_us());
                hdr.len = payload.len() as u32;
                let bytes = entry::encode(&hdr, &payload);
                if let Err(e) = store.append(&[(end, &bytes)]) {
                    drop(store);
                    self.fail(&format!("cannot append view {view}'s entry {seq}: {e}"));
                }
            }
            Action::SaveViews { promised, log_view } => {
                let store = self.store();
                if let Err(e) = store
                    .set_view(promised)
                    .and_then(|()| store.set_log_view(log_view))
                {
                    drop(store);
                    self.fail(&format!("cannot save views {promised}/{log_view}: {e}"));
                }
            }
            Action::SaveCommit { committed } => {
                if let Err(e) = self.store().set_commit(committed) {
                    log::warn!("cannot save the commit point {committed}: {e}");
                }
            }
            Action::Ack { leader, view, seq } => {
                if leader != 0 {
                    let ack = region::ack_offset(self.me);
                    if let Err(e) = self.write_now(leader, view, ack, &seq.to_le_bytes()) {
                        log::warn!("ack {seq} to node {leader} failed: {e}");
                    }
                    self.metrics.acks.fetch_add(1, Ordering::Relaxed);
                }
            }
            Action::RaiseCommit { seq } => self.region.raise_commit(seq),
            Action::CommitRecord { to, view, seq } => {
                let record = region::commit_record(view, seq);
                let written =
                    self.transport
                        .write(to, view, region::commit_record_offset(), &record);
                if let Err(e) = written {
                    log::debug!("commit record to node {to}: {e}");
                    if let TransportError::Fenced { theirs, .. } = e {
                        return Some(Event::WriteRefused { peer: to, theirs });
                    }
                }
                // The ring's tail with it: a backup that missed the
                // writer's last writes (a broken connection) sees its tail
                // ahead and catches up, even while the writer appends
                // nothing (waiting for that backup's ack to reuse space).
                // One flush for both: one send, one ring of the backup's
                // doorbell.
                let tail = self.region.tail().to_le_bytes();
                if let Err(e) = self.write_now(to, view, region::tail_offset(), &tail) {
                    log::debug!("tail to node {to}: {e}");
                }
            }
            Action::ApplyUpTo { seq } => {
                if self.apply_target.swap(seq, Ordering::AcqRel) != seq {
                    if let Some(t) = self.applier.get() {
                        t.unpark();
                    }
                }
            }
            Action::Send { to, msg } => self.send(to, msg),
            Action::SetView { view } => {
                self.region.raise_view(view);
                // A poll loop parked on a bell re-reads the fence.
                self.region.ring_all();
            }
            Action::SetLeader { leader } => self.region.set_leader(leader),
            Action::SetRole { role } => {
                if role == Role::Backup {
                    // A former leader's tail word would look like entries
                    // this node missed.
                    self.region.set_tail(self.store().last().end_pos);
                }
                if role != self.region.role() {
                    log::info!(
                        "node {}: {} in view {}",
                        self.me,
                        role_name(role),
                        self.region.view()
                    );
                }
                self.region.set_role(role);
            }
            Action::StartView { view, seq, holders } => {
                let end = self.store().last().end_pos;
                self.region.clear_acks();
                for &h in &holders {
                    self.region.set_ack(h, seq);
                }
                self.region.set_commit(seq);
                self.region.open_handover(seq);
                self.region.set_writer_start(seq + 1, end);
                self.region.set_tail(end);
                self.region.ring_all();
                log::info!("view {view} started at seq {seq} with nodes {holders:?}");
            }
            Action::ClaimView { floor } => self.zookeeper(ZkRequest::Claim { floor }),
            Action::Announce { view } => self.zookeeper(ZkRequest::Announce { view }),
            Action::Yield => self.zookeeper(ZkRequest::Yield),
            Action::Note { what } => log::info!("node {}: {what}", self.me),
            // Carried out by the snapshot rules' thread, which stepped the
            // round that decided them (see `snapshots`).
            Action::TakeSnapshot | Action::Compact { .. } | Action::Install { .. } => {
                self.snapshots.order(action)
            }
            Action::GoStale { why } => {
                log::error!(
                    "node {}: {why}; this node serves nothing until its server and follower are restarted",
                    self.me
                );
            }
        }
        None
    }

    /// Stores the carried entries up to `last` that continue the log.
    fn persist(&self, last: u64, carried: Carried<'_>) {
        let mut store = self.store();
        let from = store.last().seq + 1;
        let entries = carried
            .entries()
            .iter()
            .filter(|e| e.seq >= from && e.seq <= last)
            .map(|e| (e.pos, e.bytes.as_slice()));
        let t = Instant::now();
        let n = match store.append_from(entries) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) => {
                drop(store);
                self.fail(&format!("cannot persist entries: {e}"));
                return;
            }
        };
        match carried {
            Carried::Ring(_) => {
                self.metrics.persist.observe(t.elapsed());
                self.metrics
                    .persisted_entries
                    .fetch_add(n, Ordering::Relaxed);
            }
            Carried::Fetched { peer, .. } => {
                self.metrics.fetched_entries.fetch_add(n, Ordering::Relaxed);
                log::debug!("stored {n} entries fetched from node {peer}, now at seq {last}");
            }
            Carried::Nothing => {}
        }
    }

    /// A control message to `to`: an answer goes to the peer's request
    /// that waits for it, a request to the dispatcher.
    fn send(&self, to: u64, msg: Message) {
        let request = matches!(
            msg,
            Message::Prepare { .. }
                | Message::NewView { .. }
                | Message::Peek { .. }
                | Message::Fetch { .. }
        );
        if request {
            let _ = self
                .outbox
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .send((to, msg));
            return;
        }
        let waiter = self
            .waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&to);
        match waiter {
            Some(tx) => {
                let _ = tx.send(msg);
            }
            None => log::debug!(
                "node {}: no request of node {to} waits for {msg:?}",
                self.me
            ),
        }
    }

    fn zookeeper(&self, req: ZkRequest) {
        {
            let mut q = self.zk_requests.lock().unwrap_or_else(|p| p.into_inner());
            // The same request asked again before the election thread got
            // to it (an announcement, by two steps): once is enough.
            if q.contains(&req) {
                return;
            }
            q.push(req);
        }
        if let Some(w) = self
            .session_watch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            w.wake();
        }
    }

    /// A one-sided write of `bytes` at `offset` of node `to`'s region (as
    /// a writer of `view`), flushed: acks, commit records and the applied
    /// mark must not wait for a later write.
    pub(super) fn write_now(
        &self,
        to: u64,
        view: u64,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), TransportError> {
        let res = self.transport.write(to, view, offset, bytes);
        self.transport.flush();
        res
    }

    /// The store failed: the follower cannot go on.
    pub(super) fn fail(&self, why: &str) {
        log::error!("{why}; stopping");
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Leader => "serving as leader",
        Role::Backup => "following",
        Role::Joining => "joining",
    }
}
