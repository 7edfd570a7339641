//! The backup's ingest loop: reads the region's ring, persists entries
//! (fenced: [`crate::protocol::fence`]), acks them, and hands gaps to
//! catch-up ([`crate::protocol::catchup`] decides when).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;
use lockstep_common::entry::EntryHeader;
use lockstep_common::region::Role;
use lockstep_common::ring::{ReadOutcome, RingReader};

use crate::protocol::catchup::{GapWatch, Stall};
use crate::protocol::commit;
use crate::protocol::fence;

use super::Node;

impl Node {
    /// Whether this node may store an entry of `view` now: not from a
    /// fenced view, and only from the leader its log follows.
    pub(super) fn admits(&self, view: u64) -> bool {
        fence::admits(
            self.region.view(),
            self.log_view.load(Ordering::Acquire),
            view,
        )
    }

    /// Persist-and-ack loop over the local ring.
    pub(super) fn poll_loop(&self, mut reader: RingReader) {
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
                        // The epoch before the reader: a rewrite in
                        // between makes the next check fail again.
                        epoch = self.epoch.load(Ordering::Acquire);
                        reader = self.reader();
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
}

fn entry_seq(bytes: &[u8]) -> u64 {
    EntryHeader::parse(bytes).map(|h| h.seq).unwrap_or(0)
}
