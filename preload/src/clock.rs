//! The log's time: the clock every replica's server reads.
//!
//! A server that reads the clock while it executes a command (Redis for
//! key expiry, `SET … PX`, `TIME`; beanstalkd for delays) or to run its
//! timers (Redis's cron and active expiry) must read the same value on
//! every replica at the same point of the log, or a key that expired on
//! the leader lives on in a backup.
//!
//! So time moves with the log, by event-loop turns. On the leader, the
//! log's time moves to the real wall clock when its server's wait returns
//! (when at least [`GRAIN_US`] passed; never back), and every clock the
//! server reads during that turn reads it. The turn's entries carry it
//! (`time_us`); a turn that read no input but moved the time is logged as
//! a `TICK` (the server's timers may have run in it). A backup's server
//! reads the `time_us` of the entry it is being handed, and runs one turn
//! per `TICK`: its timers fire in the same turns as the leader's.
//!
//! Wall clocks (`CLOCK_REALTIME` and its coarse variant, `gettimeofday`,
//! `time`) read the log's time on every server thread; monotonic clocks
//! read it on event-loop threads and the main thread (they time the
//! timers). In a forked child every clock is real.
//!
//! Inside a turn the time moves too, by clock records the leader logs
//! and every backup reads at the same read of the turn (see `turn_time`):
//! a thread reads `TURN_NOW`, its turn's time moved on by those records.
//!
//! A backup's loop thread takes the time of the turns the leader's same
//! loop ran (entries carry their loop, `EntryHeader::turn_loop`); the
//! follower's `VIEW` is no loop's turn. So a loop's timers fire in the
//! same turns everywhere, whatever other loops' waits return meanwhile.
//!
//! Before the log has a time (the server starting up, before the leader's
//! first turn or a backup's first entry) those clocks read [`ORIGIN_US`],
//! the same instant on every replica, restarted ones included; so do the
//! main and loop threads until their loop's first turn (a backup's pump
//! may have begun entries while its server still starts up: a restarted
//! node replays a whole log). So the
//! timers a server arms at start-up are due at the same point of the log
//! everywhere (at its first turn), and what it derives from its start time
//! agrees on every replica and with the log's time: memcached counts its
//! clock from the monotonic time at start and turns an absolute `exptime`
//! into that clock with the wall time at start, which must be one
//! instant for such items to expire when their Unix time comes. A real
//! start time would differ per replica; a start time on another scale
//! than the log's (the real monotonic one) expired those items at once.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The leader's log time moves in steps of at least this much: a server
/// that spins through its event loop (zero timeouts) does not log a turn
/// per spin, and timers with millisecond resolution lose nothing.
pub const GRAIN_US: u64 = 1_000;

/// µs since the epoch: the latest time of the log (0: none yet).
static LOG_TIME_US: AtomicU64 = AtomicU64::new(0);

/// What the server's clocks read before the log has a time:
/// 2000-01-01T00:00:00Z, on every replica. Its start-up is dated there
/// (its uptime counts from it); a fixed instant, since no real one is
/// known alike to all replicas before the log's first entry.
pub const ORIGIN_US: u64 = 946_684_800_000_000;

thread_local! {
    /// The time of this thread's current event-loop turn when it started
    /// (0: none): what its entries carry. A thread's clock moves only in
    /// its own turns, so another loop's turn never fires its timers early.
    static TURN_TIME: Cell<u64> = const { Cell::new(0) };
    /// What this thread's clocks read now (0: none): the turn's time,
    /// moved on inside the turn by the turn's clock records (see
    /// `turn_time`).
    static TURN_NOW: Cell<u64> = const { Cell::new(0) };
    /// The clock reads of this thread's turn (see `turn_time`).
    static READS: Cell<TurnReads> = const { Cell::new(TurnReads::IDLE) };
    /// The leader's: an entry of this thread's turn carried its time (an
    /// input or the turn's `TICK`).
    static TURN_LOGGED: Cell<bool> = const { Cell::new(false) };
    /// The leader's: the loop of this thread's current turn.
    static TURN_LOOP: Cell<Option<u64>> = const { Cell::new(None) };
    /// The leader's: no entry carried this thread's turn's time yet.
    static OWES_TICK: Cell<bool> = const { Cell::new(false) };
    /// This thread runs an event loop of the server's.
    static LOOP_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// The calling thread waits in an event loop of the server's: its clocks
/// read its turn's time, and its monotonic clocks too.
pub fn on_loop_thread() {
    let _ = LOOP_THREAD.try_with(|c| c.set(true));
}

/// Whether the calling thread runs an event loop of the server's.
pub fn is_loop_thread() -> bool {
    LOOP_THREAD.try_with(|c| c.get()).unwrap_or(false)
}

/// A backup's log reached an entry of time `us` (0 is ignored: an entry
/// that carries no time).
pub fn enter_input(us: u64) {
    if us != 0 {
        LOG_TIME_US.store(us, Ordering::Release);
    }
}

/// A backup's server thread starts handling the turn that begins at seq
/// `turn`, of time `us` (0: the time stays): its clock reads count from
/// here (see `turn_time`).
pub fn enter_turn(turn: u64, us: u64) {
    if us != 0 {
        let _ = TURN_TIME.try_with(|c| c.set(us));
        let _ = TURN_NOW.try_with(|c| c.set(c.get().max(us)));
    }
    let _ = READS.try_with(|c| c.set(c.get().started(turn)));
}

/// A backup's server thread consumed the input whose last entry is
/// `anchor` (its bytes, its accept or its EOF), in a turn of time `us`:
/// its clock reads count from here. Starts the turn when no wait of its
/// started it (a server that reads without waiting first).
pub fn enter_window(turn: u64, anchor: u64, us: u64) {
    let reads = READS.try_with(|c| c.get()).unwrap_or(TurnReads::IDLE);
    if !reads.in_turn || reads.turn != turn {
        enter_turn(turn, us);
    }
    let _ = READS.try_with(|c| c.set(c.get().after_input(anchor)));
}

/// The calling thread's turn ends (it waits again): its clock reads no
/// longer count.
pub fn leave_turn() {
    let _ = READS.try_with(|c| c.set(TurnReads::IDLE));
}

/// The leader's: an input of the calling thread's turn was logged (its
/// reads count from here, as a backup's will from where its server
/// consumes it).
pub fn input_logged() {
    let _ = READS.try_with(|c| c.set(c.get().after_input(0)));
}

/// A counted clock read of the calling thread's turn: the read is
/// counted and reads `decide(reads, now)`, which becomes the thread's
/// time (never back). None outside a turn.
pub fn counted_read(decide: impl FnOnce(TurnReads, u64) -> u64) -> Option<u64> {
    let reads = READS.try_with(|c| c.get()).ok()?;
    if !reads.in_turn {
        return None;
    }
    let reads = reads.counted();
    let _ = READS.try_with(|c| c.set(reads));
    let now = TURN_NOW.try_with(|c| c.get()).ok()?;
    let us = decide(reads, now).max(now);
    let _ = TURN_NOW.try_with(|c| c.set(us));
    LOG_TIME_US.fetch_max(us, Ordering::AcqRel);
    Some(us)
}

/// The leader's: a clock record was logged in the calling thread's turn;
/// a turn that logged no input owes its `TICK` (a backup runs its
/// records in it).
pub fn record_logged() {
    if !TURN_LOGGED.try_with(|c| c.get()).unwrap_or(true) {
        let _ = OWES_TICK.try_with(|o| o.set(true));
    }
}

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

/// The server was told to stop (SIGTERM/SIGINT): from then on its clock
/// runs free. A stop is not in the log, and a server notices it from a
/// timer (Redis's cron, memcached's clock event) that a backup's stilled
/// clock, with no leader logging turns, would never fire.
static STOPPING: AtomicBool = AtomicBool::new(false);
/// Once stopping: the real monotonic time (µs) and the log's time when
/// the clock started running free.
static FREE_AT: AtomicU64 = AtomicU64::new(0);
static FREE_FROM: AtomicU64 = AtomicU64::new(0);

/// A stop signal arrived (async-signal-safe: one atomic store).
pub fn stop_signalled() {
    STOPPING.store(true, Ordering::Release);
}

/// The clock the calling server thread should read now: a thread whose
/// clocks move by turns (`turn_thread`: the server's loop threads and its
/// main thread) reads its turn's time, else `ORIGIN_US`; any other thread
/// the log's latest time, else `ORIGIN_US`. Once stopping, that time
/// moving on in real time (`real_mono_us`).
pub fn now_us(turn_thread: bool, real_mono_us: impl FnOnce() -> u64) -> Option<u64> {
    let t = if turn_thread {
        TURN_NOW.try_with(|c| c.get()).unwrap_or(0)
    } else {
        LOG_TIME_US.load(Ordering::Acquire)
    };
    let t = if t == 0 { ORIGIN_US } else { t };
    if !STOPPING.load(Ordering::Acquire) {
        return Some(t);
    }
    let now = real_mono_us();
    if FREE_AT.load(Ordering::Acquire) == 0
        && FREE_AT
            .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    {
        FREE_FROM.store(t, Ordering::Release);
    }
    match FREE_FROM.load(Ordering::Acquire) {
        0 => Some(t),
        from => Some(from + now.saturating_sub(FREE_AT.load(Ordering::Acquire))),
    }
}

/// The leader's server starts a turn of event loop `loop_id` at real time
/// `now`: the log's time moves there when a grain passed since it last
/// moved (never back), and this thread's turn reads it. A turn whose time
/// differs from the thread's last owes the log a `TICK` until an entry
/// carries its time.
pub fn turn_starts(now: u64, loop_id: u64) {
    let v = LOG_TIME_US.load(Ordering::Acquire);
    if v == 0 || now >= v.saturating_add(GRAIN_US) {
        LOG_TIME_US.fetch_max(now, Ordering::AcqRel);
    }
    let t = LOG_TIME_US.load(Ordering::Acquire);
    let _ = TURN_LOOP.try_with(|c| c.set(Some(loop_id)));
    let _ = TURN_LOGGED.try_with(|c| c.set(false));
    let _ = TURN_NOW.try_with(|c| c.set(c.get().max(t)));
    let _ = READS.try_with(|c| c.set(c.get().started(0)));
    let _ = TURN_TIME.try_with(|c| {
        if c.replace(t) != t {
            let _ = OWES_TICK.try_with(|o| o.set(true));
        }
    });
}

/// The leader's: the loop whose turn the calling thread runs (None: not
/// a loop thread, or before its first turn).
pub fn turn_loop() -> Option<u64> {
    TURN_LOOP.try_with(|c| c.get()).ok().flatten()
}

/// The time an entry the leader appends now carries: the thread's turn's
/// (the real time `now` for the very first entry). The entry carries the
/// turn: it owes no `TICK`.
pub fn entry_time(now: u64) -> u64 {
    let _ = OWES_TICK.try_with(|o| o.set(false));
    let _ = TURN_LOGGED.try_with(|c| c.set(true));
    let mine = TURN_TIME.try_with(|c| c.get()).unwrap_or(0);
    if mine != 0 {
        return mine;
    }
    LOG_TIME_US.fetch_max(now, Ordering::AcqRel);
    LOG_TIME_US.load(Ordering::Acquire)
}

/// The time and loop of this thread's turn when no entry carried them yet
/// (then the caller logs a `TICK`); clears it.
pub fn take_unlogged() -> Option<(u64, u64)> {
    if !OWES_TICK.try_with(|o| o.replace(false)).unwrap_or(false) {
        return None;
    }
    let t = TURN_TIME.try_with(|c| c.get()).unwrap_or(0);
    let _ = TURN_LOGGED.try_with(|c| c.set(true));
    (t != 0).then_some((t, turn_loop()?))
}

/// Whether the server was told to stop (its clock runs free).
pub fn stopping() -> bool {
    STOPPING.load(Ordering::Acquire)
}

/// Whether the log has no time yet (the server reads `ORIGIN_US`) and
/// the server is not stopping: a backup's timers cannot come due before
/// its first entry, so its waits need no timeout.
pub fn stilled() -> bool {
    LOG_TIME_US.load(Ordering::Acquire) == 0 && !STOPPING.load(Ordering::Acquire)
}

/// `us` as (seconds, microseconds).
pub fn split_us(us: u64) -> (i64, i64) {
    ((us / 1_000_000) as i64, (us % 1_000_000) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the log's time is process-wide.
    #[test]
    fn the_log_sets_the_time_and_zero_keeps_it() {
        assert!(stilled(), "no time yet");
        assert_eq!(
            now_us(false, || 0),
            Some(ORIGIN_US),
            "before the log's first time"
        );
        enter_input(1_700_000_000_123_456);
        assert!(!stilled());
        assert_eq!(now_us(false, || 0), Some(1_700_000_000_123_456));
        assert_eq!(
            now_us(true, || 0),
            Some(ORIGIN_US),
            "a loop or main thread reads the origin until its loop's first turn"
        );
        enter_input(0);
        assert_eq!(now_us(false, || 0), Some(1_700_000_000_123_456));
        assert_eq!(split_us(1_700_000_000_123_456), (1_700_000_000, 123_456));
        std::thread::spawn(turns_move_the_time_by_grains_and_owe_a_tick)
            .join()
            .unwrap();
    }

    fn turns_move_the_time_by_grains_and_owe_a_tick() {
        on_loop_thread();
        let v = LOG_TIME_US.load(Ordering::Acquire);
        assert_eq!(turn_loop(), None);
        turn_starts(v + GRAIN_US - 1, 1);
        assert_eq!(turn_loop(), Some(1));
        assert_eq!(now_us(true, || 0), Some(v), "less than a grain: stands");
        assert_eq!(take_unlogged(), Some((v, 1)), "the thread's first turn");
        turn_starts(v + GRAIN_US - 1, 1);
        assert_eq!(take_unlogged(), None, "same time: nothing to log");
        turn_starts(v + GRAIN_US, 2);
        assert_eq!(turn_loop(), Some(2));
        assert_eq!(now_us(true, || 0), Some(v + GRAIN_US));
        assert_eq!(take_unlogged(), Some((v + GRAIN_US, 2)));
        assert_eq!(take_unlogged(), None, "taken once");
        turn_starts(v + 5 * GRAIN_US, 1);
        assert_eq!(entry_time(0), v + 5 * GRAIN_US, "an entry carries the turn");
        assert_eq!(take_unlogged(), None);
        turn_starts(v, 1);
        assert_eq!(now_us(true, || 0), Some(v + 5 * GRAIN_US), "never back");
        // Another loop's turn moves the log's time, not this thread's.
        enter_input(v + 9 * GRAIN_US);
        assert_eq!(now_us(true, || 0), Some(v + 5 * GRAIN_US));
        enter_turn(0, v + 9 * GRAIN_US);
        assert_eq!(now_us(true, || 0), Some(v + 9 * GRAIN_US));
    }
}
