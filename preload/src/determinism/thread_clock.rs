//! One server thread's clock, free of I/O and of thread-locals: what its
//! turn's time is, where its counted reads stand, and (on the leader)
//! whether its turn still owes the log a `TICK`.
//!
//! `clock` keeps one per thread and the log's time for the process; the
//! replay simulation keeps one per simulated thread, so both run these
//! rules. See `clock` for why time moves this way.

use std::sync::atomic::{AtomicU64, Ordering};

/// The leader's log time moves in steps of at least this much: a server
/// that spins through its event loop (zero timeouts) does not log a turn
/// per spin, and timers with millisecond resolution lose nothing.
pub const GRAIN_US: u64 = 1_000;

/// Where a thread's clock reads of its turn stand: whether it runs a turn,
/// the input its reads count from (its last entry's seq; 0: the turn's
/// start), and how many reads since.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TurnReads {
    /// The thread runs a turn.
    pub in_turn: bool,
    /// A backup's: the seq the turn it runs begins at (its reads belong to
    /// that turn only).
    pub turn: u64,
    /// The last entry of the input the reads count from (0: the turn's
    /// start; the leader does not track it).
    pub anchor: u64,
    /// Reads counted since.
    pub count: u32,
}

impl TurnReads {
    /// No turn.
    pub const IDLE: TurnReads = TurnReads {
        in_turn: false,
        turn: 0,
        anchor: 0,
        count: 0,
    };

    /// A turn starts (`turn`: where, on a backup).
    fn started(self, turn: u64) -> TurnReads {
        TurnReads {
            in_turn: true,
            turn,
            anchor: 0,
            count: 0,
        }
    }

    /// Input `anchor` was consumed: reads count from it (a second report
    /// of the same input, as its EOF and then its close, changes nothing).
    fn after_input(self, anchor: u64) -> TurnReads {
        if self.anchor == anchor && anchor != 0 {
            return self;
        }
        TurnReads {
            anchor,
            count: 0,
            ..self
        }
    }

    /// One more read.
    fn counted(self) -> TurnReads {
        TurnReads {
            count: self.count.saturating_add(1),
            ..self
        }
    }
}

/// One server thread's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadClock {
    /// The time of the thread's current event-loop turn when it started
    /// (0: none): what its entries carry. A thread's clock moves only in
    /// its own turns, so another loop's turn never fires its timers early.
    turn_time: u64,
    /// What the thread's clocks read now (0: none): the turn's time, moved
    /// on inside the turn by the turn's clock records.
    turn_now: u64,
    /// The clock reads of the thread's turn.
    reads: TurnReads,
    /// The leader's: an entry of the thread's turn carried its time (an
    /// input or the turn's `TICK`).
    turn_logged: bool,
    /// The leader's: the loop of the thread's current turn.
    turn_loop: Option<u64>,
    /// The leader's: no entry carried the thread's turn's time yet.
    owes_tick: bool,
}

impl Default for ThreadClock {
    fn default() -> Self {
        ThreadClock::NEW
    }
}

impl ThreadClock {
    /// A thread that ran no turn yet.
    pub const NEW: ThreadClock = ThreadClock {
        turn_time: 0,
        turn_now: 0,
        reads: TurnReads::IDLE,
        turn_logged: false,
        turn_loop: None,
        owes_tick: false,
    };

    /// What the thread's clocks read now (0: no turn's time yet).
    pub fn now(&self) -> u64 {
        self.turn_now
    }

    /// Where its counted reads stand.
    pub fn reads(&self) -> TurnReads {
        self.reads
    }

    /// The leader's: the loop whose turn the thread runs (None: before its
    /// first turn).
    pub fn turn_loop(&self) -> Option<u64> {
        self.turn_loop
    }

    /// A backup's: the thread starts handling the turn that begins at seq
    /// `turn`, of time `us` (0: the time stays).
    pub fn enter_turn(&mut self, turn: u64, us: u64) {
        if us != 0 {
            self.turn_time = us;
            self.turn_now = self.turn_now.max(us);
        }
        self.reads = self.reads.started(turn);
    }

    /// A backup's: the thread consumed the input whose last entry is
    /// `anchor`, in a turn of time `us`: its reads count from here. Starts
    /// the turn when no wait of its started it.
    pub fn enter_window(&mut self, turn: u64, anchor: u64, us: u64) {
        if !self.reads.in_turn || self.reads.turn != turn {
            self.enter_turn(turn, us);
        }
        self.reads = self.reads.after_input(anchor);
    }

    /// The thread's turn ends (it waits again): its reads no longer count.
    pub fn leave_turn(&mut self) {
        self.reads = TurnReads::IDLE;
    }

    /// The leader's: an input of the thread's turn was logged (its reads
    /// count from here, as a backup's will from where its server consumes
    /// that input).
    pub fn input_logged(&mut self) {
        self.reads = self.reads.after_input(0);
    }

    /// A counted read starts: the reads so far (this one included) and
    /// the thread's time; None outside a turn. The caller decides what it
    /// reads and tells [`ThreadClock::finish_read`].
    pub fn count_read(&mut self) -> Option<(TurnReads, u64)> {
        if !self.reads.in_turn {
            return None;
        }
        self.reads = self.reads.counted();
        Some((self.reads, self.turn_now))
    }

    /// The counted read reads `us` (never back); the log's time `log` moves
    /// with it. Returns what it reads.
    pub fn finish_read(&mut self, log: &AtomicU64, us: u64) -> u64 {
        let us = us.max(self.turn_now);
        self.turn_now = us;
        log.fetch_max(us, Ordering::AcqRel);
        us
    }

    /// The leader's: a clock record was logged in the thread's turn; a
    /// turn that logged no input owes its `TICK`.
    pub fn record_logged(&mut self) {
        if !self.turn_logged {
            self.owes_tick = true;
        }
    }

    /// The leader's: the thread starts a turn of loop `loop_id` at real
    /// time `now`: the log's time `log` moves there when a grain passed
    /// since it last moved (never back), and the turn reads it. A turn
    /// whose time differs from the thread's last owes a `TICK` until an
    /// entry carries its time.
    pub fn turn_starts(&mut self, log: &AtomicU64, now: u64, loop_id: u64) {
        let v = log.load(Ordering::Acquire);
        if v == 0 || now >= v.saturating_add(GRAIN_US) {
            log.fetch_max(now, Ordering::AcqRel);
        }
        let t = log.load(Ordering::Acquire);
        self.turn_loop = Some(loop_id);
        self.turn_logged = false;
        self.turn_now = self.turn_now.max(t);
        self.reads = self.reads.started(0);
        if std::mem::replace(&mut self.turn_time, t) != t {
            self.owes_tick = true;
        }
    }

    /// The leader's: the time an entry appended now carries: the turn's
    /// (the real time `now` for the very first entry). The entry carries
    /// the turn: it owes no `TICK`.
    pub fn entry_time(&mut self, log: &AtomicU64, now: u64) -> u64 {
        self.owes_tick = false;
        self.turn_logged = true;
        if self.turn_time != 0 {
            return self.turn_time;
        }
        log.fetch_max(now, Ordering::AcqRel);
        log.load(Ordering::Acquire)
    }

    /// The leader's: the time and loop of the thread's turn when no entry
    /// carried them yet (then the caller logs a `TICK`); clears it.
    pub fn take_unlogged(&mut self) -> Option<(u64, u64)> {
        if !std::mem::replace(&mut self.owes_tick, false) {
            return None;
        }
        self.turn_logged = true;
        (self.turn_time != 0).then_some((self.turn_time, self.turn_loop?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_move_the_time_by_grains_and_owe_a_tick() {
        let log = AtomicU64::new(1_700_000_000_000_000);
        let v = log.load(Ordering::Acquire);
        let mut c = ThreadClock::NEW;
        assert_eq!(c.turn_loop(), None);
        c.turn_starts(&log, v + GRAIN_US - 1, 1);
        assert_eq!(c.turn_loop(), Some(1));
        assert_eq!(c.now(), v, "less than a grain: stands");
        assert_eq!(c.take_unlogged(), Some((v, 1)), "the thread's first turn");
        c.turn_starts(&log, v + GRAIN_US - 1, 1);
        assert_eq!(c.take_unlogged(), None, "same time: nothing to log");
        c.turn_starts(&log, v + GRAIN_US, 2);
        assert_eq!(c.turn_loop(), Some(2));
        assert_eq!(c.now(), v + GRAIN_US);
        assert_eq!(c.take_unlogged(), Some((v + GRAIN_US, 2)));
        assert_eq!(c.take_unlogged(), None, "taken once");
        c.turn_starts(&log, v + 5 * GRAIN_US, 1);
        assert_eq!(
            c.entry_time(&log, 0),
            v + 5 * GRAIN_US,
            "an entry carries the turn"
        );
        assert_eq!(c.take_unlogged(), None);
        c.turn_starts(&log, v, 1);
        assert_eq!(c.now(), v + 5 * GRAIN_US, "never back");
        // Another loop's turn moves the log's time, not this thread's.
        log.fetch_max(v + 9 * GRAIN_US, Ordering::AcqRel);
        assert_eq!(c.now(), v + 5 * GRAIN_US);
        c.enter_turn(0, v + 9 * GRAIN_US);
        assert_eq!(c.now(), v + 9 * GRAIN_US);
    }

    #[test]
    fn reads_count_from_the_turn_and_from_each_input() {
        let log = AtomicU64::new(0);
        let mut c = ThreadClock::NEW;
        assert_eq!(c.count_read(), None, "outside a turn");
        c.enter_turn(10, 5_000);
        assert_eq!(
            c.count_read().map(|(r, _)| (r.anchor, r.count)),
            Some((0, 1))
        );
        c.enter_window(10, 11, 5_000);
        let (r, now) = c.count_read().unwrap();
        assert_eq!((r.turn, r.anchor, r.count, now), (10, 11, 1, 5_000));
        c.enter_window(10, 11, 5_000);
        assert_eq!(c.count_read().unwrap().0.count, 2, "the same input again");
        assert_eq!(c.finish_read(&log, 4_000), 5_000, "never back");
        assert_eq!(c.finish_read(&log, 7_000), 7_000);
        assert_eq!(log.load(Ordering::Acquire), 7_000);
        c.enter_window(12, 13, 6_000);
        assert_eq!(
            (c.reads().turn, c.reads().anchor, c.now()),
            (12, 13, 7_000),
            "a read of a new turn starts it; the time never goes back"
        );
        c.leave_turn();
        assert_eq!(c.reads(), TurnReads::IDLE);
    }
}
