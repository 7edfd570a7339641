//! When the cluster's log began: its origin time, what a fresh server's
//! clocks read on every replica until its first turn (its start-up
//! banner, Redis's `LASTSAVE` and uptime, memcached's start time).
//!
//! The first leader's follower writes it into the log's first entry, its
//! `VIEW` at seq 1, as an 8-byte payload (its wall clock then); every node
//! learns it from that entry once it is committed, or, when its log starts past seq 1, from a
//! snapshot's `meta.json`; keeps it in its store (compaction cuts the
//! entry); and shows it in its region, where `lockstep run` reads it for
//! the server it starts (`LOCKSTEP_ORIGIN_US`). A server rebuilt later
//! from the log reads the same instant.

use lockstep_common::entry::{EntryHeader, Kind};
use lockstep_common::region::PINNED_ORIGIN_US;

use crate::io::store::LogStore;

use super::Node;

/// The payload of the `VIEW` entry at `seq`: the origin `now_us` at seq
/// 1, nothing later.
pub fn view_payload(seq: u64, now_us: u64) -> Vec<u8> {
    if seq == 1 {
        now_us.to_le_bytes().to_vec()
    } else {
        Vec::new()
    }
}

/// The origin an entry carries: the log's first entry, a `VIEW` with an
/// 8-byte payload (None for any other, and for logs begun before the
/// origin was written).
pub fn carried(h: &EntryHeader, payload: &[u8]) -> Option<u64> {
    if h.seq != 1 || h.kind != Kind::View {
        return None;
    }
    let us = u64::from_le_bytes(payload.try_into().ok()?);
    (us != 0).then_some(us)
}

/// Wall clock, µs since the epoch.
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl Node {
    /// Learns the origin where this node can (its store, the log's first
    /// entry once `committed` covers it, its newest snapshot) unless its
    /// region shows it already; keeps it in the store and shows it in the
    /// region. Never from an uncommitted first entry: a candidate that
    /// wrote its own seq 1 and lost the view would keep a time the
    /// cluster's log does not hold.
    pub(super) fn learn_origin(&self, store: &LogStore, committed: u64) {
        if self.region.origin_us() != 0 {
            return;
        }
        let stored = store.origin().unwrap_or(0);
        let us = if stored != 0 {
            stored
        } else {
            let first = match store.oldest() {
                1 if committed >= 1 => store.get(1).ok().flatten(),
                _ => None,
            };
            // A log or snapshot from before origins were recorded: the
            // fixed instant servers read then (see `PINNED_ORIGIN_US`).
            let from_log =
                first.map(|e| carried(&e.header(), e.payload()).unwrap_or(PINNED_ORIGIN_US));
            let from_snapshot = || {
                self.catalog
                    .newest()
                    .ok()
                    .flatten()
                    .map(|s| match s.meta.origin_us {
                        0 => PINNED_ORIGIN_US,
                        us => us,
                    })
            };
            match from_log.or_else(from_snapshot) {
                Some(us) => us,
                None => return,
            }
        };
        if stored == 0 {
            if let Err(e) = store.set_origin(us) {
                log::warn!("node {}: cannot store the log's origin time: {e}", self.me);
            }
        }
        self.region.set_origin_us(us);
        log::info!(
            "node {}: the cluster's log began at {} µs since the epoch (a fresh server's start-up time)",
            self.me,
            us
        );
    }
}

impl Node {
    /// The heartbeat's look (every `SERVER_CHECK`, off the entries' path)
    /// while the origin is not known here: once the replica's commit point
    /// covers seq 1 of its log, the first entry is the cluster's.
    pub(super) fn learn_committed_origin(&self) {
        if self.region.origin_us() != 0 {
            return;
        }
        let committed = self.replica().committed();
        if committed >= 1 {
            self.learn_origin(&self.store(), committed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_first_view_carries_the_origin() {
        let us = 1_764_000_000_123_456;
        let first = EntryHeader::new(Kind::View, 1, 1, 0, 0);
        assert_eq!(carried(&first, &view_payload(1, us)), Some(us));
        assert!(view_payload(2, us).is_empty());
        // A log begun before the origin was written: an empty VIEW.
        assert_eq!(carried(&first, &[]), None);
        let later = EntryHeader::new(Kind::View, 2, 7, 0, 0);
        assert_eq!(carried(&later, &us.to_le_bytes()), None);
        let data = EntryHeader::new(Kind::Data, 1, 1, 3, 8);
        assert_eq!(carried(&data, &us.to_le_bytes()), None);
        assert_eq!(carried(&first, &0u64.to_le_bytes()), None);
    }
}
