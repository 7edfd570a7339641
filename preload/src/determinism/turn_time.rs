//! Time inside a turn: the server's clock moves while it works, the same
//! on every replica.
//!
//! `clock` moves the log's time between turns. Inside a turn the leader's
//! server reads its real clock too, so a busy script runs past
//! `busy-reply-threshold` (other clients get `-BUSY`, `SCRIPT KILL` can
//! stop it) and `SLOWLOG`/`LATENCY` see real durations. Each such read
//! must read the same value on every replica, so:
//!
//! - The leader counts its server's clock reads of a turn, from the
//!   turn's start and again from each input it logs (its *window*). A read
//!   that finds the real clock a grain ([`super::clock::GRAIN_US`]) past the
//!   thread's time moves it there and logs a `TIME` record: "read `k` of
//!   this window reads `us`". Most turns log none (they take less than a
//!   grain); a 5 s busy script logs about one a millisecond.
//! - A backup's server counts its reads the same way (windows start where
//!   it consumes the same inputs) and its `k`-th read of a window reads
//!   what the leader logged for it, or the time before it.
//! - A record is in the log before the leader's server can act on what it
//!   read (output commit covers it like an input; input mode commits it
//!   first), and a backup's read waits until the log says what it reads:
//!   a record for it, a later record, a later input, or the end of the
//!   turn. The leader logs that end (`TIME` with `k` 0) when its loop is
//!   about to block with the turn still open, so an idle leader does not
//!   leave a backup's last turn waiting for the next one.
//!
//! Only the clocks a server's logic reads are counted (the wall clock and
//! `CLOCK_MONOTONIC`): the coarse clocks, which allocators read at moments
//! of their own (jemalloc's decay), read the thread's time without
//! counting.
//!
//! When a child process ends is the same kind of fact: a server that polls
//! for its children (`waitpid(-1, …, WNOHANG)`: Redis's cron, which then
//! finishes an AOF rewrite or a save) learns of one at a moment of the
//! machine's. A poll counts as a read of the turn; where the leader's
//! reaped a child, its record names the child and its status, and a
//! backup's poll with that count reaps the same child (waiting for its
//! own copy of it to end) and reads the leader's status, while a poll
//! with no record reaps nothing (`tests/children.rs`).

use crate::determinism::clock::{TurnReads, GRAIN_US};

/// One clock record of a turn: read `k` since input `anchor` (the last
/// entry of that input; 0: since the turn's start) reads `us`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// The input the reads count from (0: the turn's start).
    pub anchor: u64,
    /// The read's index since then (from 1).
    pub k: u32,
    /// What it reads (µs since the epoch).
    pub us: u64,
    /// The child a poll for children reaped at this read, if any.
    pub child: Option<Child>,
}

/// A child process the leader's server reaped: which of its forks made it
/// (a replica's own copy of the child has another pid: see `forks`), its
/// pid on the leader (for a child the fork table forgot) and the status
/// `waitpid` stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Child {
    /// The fork's ordinal (`NO_FORK`: unknown).
    pub fork: u32,
    /// The child's pid on the leader.
    pub pid: i32,
    /// Its wait status.
    pub status: i32,
}

/// A `Child::fork` that names no fork the preload saw.
pub const NO_FORK: u32 = u32::MAX;

impl Child {
    /// The record's payload.
    pub fn encode(&self) -> [u8; 12] {
        let mut b = [0u8; 12];
        b[..4].copy_from_slice(&self.fork.to_le_bytes());
        b[4..8].copy_from_slice(&self.pid.to_le_bytes());
        b[8..].copy_from_slice(&self.status.to_le_bytes());
        b
    }

    /// A record's payload (None: a plain clock record).
    pub fn decode(payload: &[u8]) -> Option<Child> {
        let word = |at: usize| -> Option<[u8; 4]> { payload.get(at..at + 4)?.try_into().ok() };
        Some(Child {
            fork: u32::from_le_bytes(word(0)?),
            pid: i32::from_le_bytes(word(4)?),
            status: i32::from_le_bytes(word(8)?),
        })
    }

    /// This replica's pid of the child.
    pub fn here(&self) -> i32 {
        crate::determinism::forks::pid_of(self.fork).unwrap_or(self.pid)
    }
}

/// The leader's rule: what a read at real time `real` reads, the thread
/// reading `now`, and whether it moves the time (then it is logged).
pub fn leader_value(real: u64, now: u64) -> (u64, bool) {
    if now != 0 && real >= now.saturating_add(GRAIN_US) {
        (real, true)
    } else {
        (now, false)
    }
}

/// What a backup's read learns from the records of its turn not consumed
/// yet (`records`, log order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settled {
    /// The time the read reads as far as the records go.
    pub us: u64,
    /// Records the read passed (consumed, front first).
    pub passed: usize,
    /// A later record exists: no record still to come can be this read's.
    pub decided: bool,
    /// The child of the record of exactly this read, if it passed it.
    pub child: Option<Child>,
}

/// A backup's read `at` (its window and count), the thread reading `now`:
/// the records it passed (earlier windows, or this one up to its count)
/// set its time, in log order.
pub fn settle(records: &[Record], at: TurnReads, now: u64) -> Settled {
    let mut us = now;
    let mut child = None;
    for (i, r) in records.iter().enumerate() {
        let passed = r.anchor < at.anchor || (r.anchor == at.anchor && r.k <= at.count);
        if !passed {
            return Settled {
                us,
                passed: i,
                decided: true,
                child,
            };
        }
        us = us.max(r.us);
        if r.anchor == at.anchor && r.k == at.count {
            child = r.child;
        }
    }
    Settled {
        us,
        passed: records.len(),
        decided: false,
        child,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(anchor: u64, count: u32) -> TurnReads {
        TurnReads {
            in_turn: true,
            turn: 1,
            anchor,
            count,
        }
    }

    #[test]
    fn the_leader_moves_the_time_by_grains() {
        assert_eq!(leader_value(1_000 + GRAIN_US - 1, 1_000), (1_000, false));
        assert_eq!(
            leader_value(1_000 + GRAIN_US, 1_000),
            (1_000 + GRAIN_US, true)
        );
        assert_eq!(leader_value(500, 1_000), (1_000, false), "never back");
        assert_eq!(
            leader_value(5_000, 0),
            (0, false),
            "no turn time: no record"
        );
    }

    #[test]
    fn a_read_takes_the_records_up_to_it() {
        let r = |anchor, k, us| Record {
            anchor,
            k,
            us,
            child: None,
        };
        let records = [r(0, 2, 20), r(7, 1, 30), r(7, 4, 40), r(9, 1, 50)];
        // Read 1 of the turn's start: before the first record.
        assert_eq!(
            settle(&records, at(0, 1), 10),
            Settled {
                us: 10,
                passed: 0,
                decided: true,
                child: None,
            }
        );
        // Read 3 of the start: the record of read 2 holds.
        assert_eq!(settle(&records, at(0, 3), 10).us, 20);
        // Read 2 after input 7: the start's record and read 1's.
        let s = settle(&records, at(7, 2), 10);
        assert_eq!((s.us, s.passed, s.decided), (30, 2, true));
        // Read 9 after input 7: everything of that window, decided by 9's.
        let s = settle(&records, at(7, 9), 10);
        assert_eq!((s.us, s.passed, s.decided), (40, 3, true));
        // After input 9, beyond its last record: not decided yet.
        let s = settle(&records, at(9, 2), 10);
        assert_eq!((s.us, s.passed, s.decided), (50, 4, false));
        assert_eq!(
            settle(&[], at(0, 1), 10),
            Settled {
                us: 10,
                passed: 0,
                decided: false,
                child: None,
            }
        );
    }

    #[test]
    fn a_later_window_counts_from_zero() {
        // The same count in a later window is another read.
        let records = [Record {
            anchor: 12,
            k: 1,
            us: 99,
            child: None,
        }];
        assert_eq!(settle(&records, at(11, 5), 10).us, 10);
        assert!(settle(&records, at(11, 5), 10).decided);
        assert_eq!(settle(&records, at(12, 1), 10).us, 99);
    }

    #[test]
    fn a_poll_finds_the_child_of_its_own_read_only() {
        let reaped = Child {
            fork: 3,
            pid: 7,
            status: 256,
        };
        let child = Some(reaped);
        let records = [
            Record {
                anchor: 0,
                k: 2,
                us: 20,
                child,
            },
            Record {
                anchor: 0,
                k: 3,
                us: 20,
                child: None,
            },
        ];
        assert_eq!(settle(&records, at(0, 1), 10).child, None);
        let s = settle(&records, at(0, 2), 10);
        assert_eq!((s.child, s.decided), (child, true));
        assert_eq!(settle(&records, at(0, 3), 10).child, None);
        assert_eq!(Child::decode(&reaped.encode()), child);
        assert_eq!(Child::decode(&[]), None);
        assert_eq!(Child::decode(&[0; 8]), None);
    }
}
