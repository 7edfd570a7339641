//! The ingest loop: reads the region's ring and hands what it read to the
//! replica ([`crate::protocol::Event::Read`]), which stores and acks it
//! (or drops it: fenced views, a log being rewritten) and decides when a
//! gap needs a catch-up.
//!
//! One round of reading ([`Node::ingest_round`]) runs on the poll thread,
//! or, over the tcp transport, on the thread that wrote the batch into the
//! region ([`Node::drain_ring`]): whoever holds the [`Ingest`] state reads.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use lockstep_common::control::FetchedEntry;
use lockstep_common::idle_spin::{Idle, Next};
use lockstep_common::region::Role;
use lockstep_common::ring::{ReadOutcome, RingReader};

use crate::protocol::{EntryMeta, Event};

use super::carried::Carried;
use super::Node;

/// Entries handed to the replica at once.
const BATCH: usize = 256;

/// `Node::stalled_at` when the last read found entries.
pub(super) const NOT_STALLED: u64 = u64::MAX;

/// What reading the ring carries from one round to the next.
pub(super) struct Ingest {
    reader: RingReader,
    /// The log epoch the reader was built in (see `Node::epoch`).
    epoch: u64,
    buf: Vec<u8>,
    batch: Vec<FetchedEntry>,
    metas: Vec<EntryMeta>,
    /// Entry buffers handed back by the last batch, reused by the next
    /// (no allocation per entry read).
    spare: Vec<Vec<u8>>,
    seen_record: (u64, u64),
    /// A lap is said once per catch-up: the catch-up fetches in steps,
    /// and each step's next read laps again until the follower is back on
    /// the ring (it was dozens of lines a millisecond).
    lap_said: bool,
}

/// How a round of reading ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Round {
    /// Entries were read and stored: read on.
    Stored,
    /// Entries were read and dropped (a view change is rewriting the log,
    /// or they belong to a fenced view): reading them again at once would
    /// only spin.
    Dropped,
    /// Nothing to read.
    Empty,
}

impl Node {
    /// Reads the local ring until `stop`.
    pub(super) fn poll_loop(&self) {
        *self.ingest_state() = Some(Ingest {
            reader: self.reader(),
            epoch: self.epoch.load(Ordering::Acquire),
            buf: Vec::new(),
            batch: Vec::with_capacity(BATCH),
            metas: Vec::with_capacity(BATCH),
            spare: Vec::with_capacity(BATCH),
            seen_record: (0, 0),
            lap_said: false,
        });
        let mut idle = Idle::new();
        while !self.stopping() {
            // A leader's follower reads only its own writer's entries, which
            // ring the post bell; the backups' acks ring the other one.
            let bell = if self.region.role() == Role::Leader {
                self.region.post_bell()
            } else {
                self.region.bell()
            };
            let seen = bell.value();
            let round = match self.ingest_state().as_mut() {
                Some(st) => self.ingest_round(st),
                None => return,
            };
            match round {
                Round::Stored => idle.reset(),
                Round::Dropped => std::thread::sleep(Duration::from_millis(1)),
                // A moment's spinning (longer only where cores are spare,
                // see `idle_spin`), never a yield, then a park: writers ring
                // after writing, so a write since `seen` makes the wait
                // return at once.
                Round::Empty => {
                    if idle.idle() == Next::Park {
                        bell.wait(seen, Duration::from_millis(5));
                    }
                }
            }
        }
        *self.ingest_state() = None;
    }

    /// On the thread that just wrote a batch of a peer's writes into the
    /// region (tcp): reads the ring here, unless the poll thread is reading
    /// it now or this node leads (a leader's region takes its backups'
    /// acks, and its server's threads wait on the doorbell for them).
    /// True when it read everything; false when the doorbell must ring.
    pub(super) fn drain_ring(&self) -> bool {
        if self.region.role() == Role::Leader || self.stopping() {
            return false;
        }
        let Ok(mut guard) = self.ingest.try_lock() else {
            return false;
        };
        let Some(st) = guard.as_mut() else {
            return false;
        };
        loop {
            match self.ingest_round(st) {
                Round::Stored => {}
                Round::Dropped => return false,
                Round::Empty => return true,
            }
        }
    }

    fn ingest_state(&self) -> std::sync::MutexGuard<'_, Option<Ingest>> {
        self.ingest.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads a batch from the ring and hands it to the replica; with
    /// nothing to read, tells the replica what the read found (a lap, a
    /// corrupt entry, a new commit record).
    fn ingest_round(&self, st: &mut Ingest) -> Round {
        let ring = self.region.ring();
        let now_epoch = self.epoch.load(Ordering::Acquire);
        if now_epoch != st.epoch {
            // The log was cut or the replica dropped what was read: read
            // again from the log's end.
            st.epoch = now_epoch;
            st.reader = self.reader();
        }
        st.reader.set_min_view(self.region.view());
        let mut failed = false;
        let mut first_seen = None;
        while st.batch.len() < BATCH {
            match st.reader.poll(ring, self.region.tail(), &mut st.buf) {
                ReadOutcome::Entry { header, pos, len } => {
                    first_seen.get_or_insert_with(Instant::now);
                    st.metas.push(EntryMeta {
                        seq: header.seq,
                        view: header.view,
                        last_committed: header.last_committed,
                    });
                    let mut bytes = st.spare.pop().unwrap_or_default();
                    bytes.clear();
                    bytes.extend_from_slice(&st.buf[..len]);
                    st.batch.push(FetchedEntry {
                        seq: header.seq,
                        pos,
                        bytes,
                    });
                }
                ReadOutcome::Empty => break,
                ReadOutcome::Lapped { expected } => {
                    if std::mem::replace(&mut st.lap_said, true) {
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
        if !st.batch.is_empty() {
            self.stalled_at.store(NOT_STALLED, Ordering::Relaxed);
            let stored = {
                let mut replica = self.replica();
                // Under the replica's lock: a reader built before the log
                // was last cut may not continue it.
                let current = self.epoch.load(Ordering::Acquire) == st.epoch;
                if current {
                    let read =
                        Event::Read(std::mem::replace(&mut st.metas, Vec::with_capacity(BATCH)));
                    self.step_locked(&mut replica, read, Carried::Ring(&st.batch));
                }
                current && self.epoch.load(Ordering::Acquire) == st.epoch
            };
            st.spare.extend(st.batch.drain(..).map(|e| e.bytes));
            st.metas.clear();
            if !stored {
                return Round::Dropped;
            }
            if let Some(f) = first_seen {
                self.metrics.ack.observe(f.elapsed());
            }
            if !failed {
                // Back on the ring: the next lap is news.
                st.lap_said = false;
            }
            return Round::Stored;
        }
        self.stalled_at.store(st.reader.pos(), Ordering::Relaxed);
        if failed {
            self.step(Event::ReadFailed, Carried::Nothing);
        }
        let record = self.region.commit_in_view();
        if record != st.seen_record {
            // A new commit record (it rings the bell): the replica learns
            // it now rather than at the next heartbeat, so that an idle
            // backup applies at once.
            st.seen_record = record;
            self.step(Event::Tick(self.words()), Carried::Nothing);
        }
        Round::Empty
    }
}
