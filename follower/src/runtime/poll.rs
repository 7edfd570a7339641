//! The ingest loop: reads the region's ring and hands what it read to the
//! replica ([`crate::protocol::Event::Read`]), which stores and acks it
//! (or drops it: fenced views, a log being rewritten) and decides when a
//! gap needs a catch-up.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use lockstep_common::control::FetchedEntry;
use lockstep_common::idle_spin::{Idle, Next};
use lockstep_common::region::Role;
use lockstep_common::ring::ReadOutcome;

use crate::protocol::{EntryMeta, Event};

use super::carried::Carried;
use super::Node;

/// Entries handed to the replica at once.
const BATCH: usize = 256;

/// `Node::stalled_at` when the last read found entries.
pub(super) const NOT_STALLED: u64 = u64::MAX;

impl Node {
    /// Reads the local ring until `stop`.
    pub(super) fn poll_loop(&self) {
        let ring = self.region.ring();
        let mut reader = self.reader();
        let mut epoch = self.epoch.load(Ordering::Acquire);
        let mut buf = Vec::new();
        let mut batch: Vec<FetchedEntry> = Vec::with_capacity(BATCH);
        let mut metas: Vec<EntryMeta> = Vec::with_capacity(BATCH);
        let mut idle = Idle::new();
        // Entry buffers handed back by the last batch, reused by the next
        // (no allocation per entry read).
        let mut spare: Vec<Vec<u8>> = Vec::with_capacity(BATCH);
        let mut seen_record = (0, 0);
        // A lap is said once per catch-up: the catch-up fetches in steps,
        // and each step's next read laps again until the follower is back
        // on the ring (it was dozens of lines a millisecond).
        let mut lap_said = false;
        while !self.stopping() {
            let now_epoch = self.epoch.load(Ordering::Acquire);
            if now_epoch != epoch {
                // The log was cut or the replica dropped what was read:
                // read again from the log's end.
                epoch = now_epoch;
                reader = self.reader();
            }
            reader.set_min_view(self.region.view());
            // A leader's follower reads only its own writer's entries, which
            // ring the post bell; the backups' acks ring the other one.
            let bell = if self.region.role() == Role::Leader {
                self.region.post_bell()
            } else {
                self.region.bell()
            };
            let seen = bell.value();
            let mut failed = false;
            let mut first_seen = None;
            while batch.len() < BATCH {
                match reader.poll(ring, self.region.tail(), &mut buf) {
                    ReadOutcome::Entry { header, pos, len } => {
                        first_seen.get_or_insert_with(Instant::now);
                        metas.push(EntryMeta {
                            seq: header.seq,
                            view: header.view,
                            last_committed: header.last_committed,
                        });
                        let mut bytes = spare.pop().unwrap_or_default();
                        bytes.clear();
                        bytes.extend_from_slice(&buf[..len]);
                        batch.push(FetchedEntry {
                            seq: header.seq,
                            pos,
                            bytes,
                        });
                    }
                    ReadOutcome::Empty => break,
                    ReadOutcome::Lapped { expected } => {
                        if std::mem::replace(&mut lap_said, true) {
                            log::debug!("still a ring lap behind at seq {expected}");
                        } else {
                            log::warn!(
                                "fell a ring lap behind at seq {expected}: catching up from a peer"
                            );
                        }
                        failed = true;
                        break;
                    }
                    ReadOutcome::Corrupt { expected, error } => {
                        log::error!(
                            "corrupt entry at seq {expected}: {error}; fetching it from a peer"
                        );
                        failed = true;
                        break;
                    }
                }
            }
            if !batch.is_empty() {
                self.stalled_at.store(NOT_STALLED, Ordering::Relaxed);
                let stored = {
                    let mut replica = self.replica();
                    // Under the replica's lock: a reader built before the
                    // log was last cut may not continue it.
                    let current = self.epoch.load(Ordering::Acquire) == epoch;
                    if current {
                        let read =
                            Event::Read(std::mem::replace(&mut metas, Vec::with_capacity(BATCH)));
                        self.step_locked(&mut replica, read, Carried::Ring(&batch));
                    }
                    current && self.epoch.load(Ordering::Acquire) == epoch
                };
                spare.extend(batch.drain(..).map(|e| e.bytes));
                metas.clear();
                if stored {
                    if let Some(f) = first_seen {
                        self.metrics.ack.observe(f.elapsed());
                    }
                    idle.reset();
                    if !failed {
                        // Back on the ring: the next lap is news.
                        lap_said = false;
                    }
                } else {
                    // Dropped (a view change is rewriting the log, or the
                    // entries belong to a fenced view): reading them again
                    // at once would only spin.
                    std::thread::sleep(Duration::from_millis(1));
                }
                continue;
            }
            self.stalled_at.store(reader.pos(), Ordering::Relaxed);
            if failed {
                self.step(Event::ReadFailed, Carried::Nothing);
            }
            let record = self.region.commit_in_view();
            if record != seen_record {
                // A new commit record (it rings the bell): the replica
                // learns it now rather than at the next heartbeat, so
                // that an idle backup applies at once.
                seen_record = record;
                self.step(Event::Tick(self.words()), Carried::Nothing);
            }
            // A moment's spinning (longer only where cores are spare, see
            // `idle_spin`), never a yield, then a park: writers ring after
            // writing, so a write since `seen` makes the wait return at once.
            if idle.idle() == Next::Park {
                bell.wait(seen, Duration::from_millis(5));
            }
        }
    }
}
