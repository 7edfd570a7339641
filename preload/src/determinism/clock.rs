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
//! a thread reads its turn's time moved on by those records (see `thread_clock`).
//!
//! A backup's loop thread takes the time of the turns the leader's same
//! loop ran (entries carry their loop, `EntryHeader::turn_loop`); the
//! follower's `VIEW` is no loop's turn. So a loop's timers fire in the
//! same turns everywhere, whatever other loops' waits return meanwhile.
//!
//! Before the log has a time (the server starting up, before the leader's
//! first turn or a backup's first entry) those clocks read the time the
//! cluster's log began ([`origin_us`]: handed over by `lockstep run`), the
//! same instant on every replica, restarted ones included; so do the
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

use crate::determinism::thread_clock::ThreadClock;
pub use crate::determinism::thread_clock::{TurnReads, GRAIN_US};

/// µs since the epoch: the latest time of the log (0: none yet).
static LOG_TIME_US: AtomicU64 = AtomicU64::new(0);

/// What the server's clocks read before the log has a time when no origin
/// was handed to it: 2000-01-01T00:00:00Z, a fixed instant, the same on
/// every replica started that way (and the origin the followers give a
/// log begun before origins were recorded).
pub const ORIGIN_US: u64 = lockstep_common::region::PINNED_ORIGIN_US;

/// What the server's clocks read before the log has a time: the time its
/// cluster's log began (`LOCKSTEP_ORIGIN_US`, handed over by `lockstep
/// run` and read at load: `sys::origin_env_us`), the same instant on every
/// replica and on one rebuilt later, so its start-up is dated then and
/// its uptime counts from then; [`ORIGIN_US`] when none was handed over
/// (a server started without `lockstep run`).
pub fn origin_us() -> u64 {
    match crate::sys::origin_env_us() {
        0 => ORIGIN_US,
        us => us,
    }
}

thread_local! {
    /// This thread's clock (see `thread_clock`).
    static THREAD: Cell<ThreadClock> = const { Cell::new(ThreadClock::NEW) };
    /// This thread runs an event loop of the server's.
    static LOOP_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` on the calling thread's clock (None while the thread ends).
fn with_thread<T>(f: impl FnOnce(&mut ThreadClock) -> T) -> Option<T> {
    THREAD
        .try_with(|c| {
            let mut t = c.get();
            let r = f(&mut t);
            c.set(t);
            r
        })
        .ok()
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
    with_thread(|t| t.enter_turn(turn, us));
}

/// A backup's server thread consumed the input whose last entry is
/// `anchor` (its bytes, its accept or its EOF), in a turn of time `us`:
/// its clock reads count from here. Starts the turn when no wait of its
/// started it (a server that reads without waiting first).
pub fn enter_window(turn: u64, anchor: u64, us: u64) {
    with_thread(|t| t.enter_window(turn, anchor, us));
}

/// The calling thread's turn ends (it waits again): its clock reads no
/// longer count.
pub fn leave_turn() {
    with_thread(ThreadClock::leave_turn);
}

/// The leader's: an input of the calling thread's turn was logged (its
/// reads count from here, as a backup's will from where its server
/// consumes that input).
pub fn input_logged() {
    with_thread(ThreadClock::input_logged);
}

/// A counted clock read of the calling thread's turn: the read is
/// counted and reads `decide(reads, now)`, which becomes the thread's
/// time (never back). None outside a turn.
pub fn counted_read(decide: impl FnOnce(TurnReads, u64) -> u64) -> Option<u64> {
    let (reads, now) = with_thread(ThreadClock::count_read)??;
    // Decided outside the thread's cell: a backup's decision waits for
    // the log and may take a while.
    let us = decide(reads, now);
    with_thread(|t| t.finish_read(&LOG_TIME_US, us))
}

/// The leader's: a clock record was logged in the calling thread's turn;
/// a turn that logged no input owes its `TICK` (a backup runs its
/// records in it).
pub fn record_logged() {
    with_thread(ThreadClock::record_logged);
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
/// main thread) reads its turn's time, else the origin ([`origin_us`]);
/// any other thread the log's latest time, else the origin. Once stopping, that time
/// moving on in real time (`real_mono_us`).
pub fn now_us(turn_thread: bool, real_mono_us: impl FnOnce() -> u64) -> Option<u64> {
    let t = if turn_thread {
        with_thread(|t| t.now()).unwrap_or(0)
    } else {
        LOG_TIME_US.load(Ordering::Acquire)
    };
    let t = if t == 0 { origin_us() } else { t };
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
/// `now` (see [`ThreadClock::turn_starts`]).
pub fn turn_starts(now: u64, loop_id: u64) {
    with_thread(|t| t.turn_starts(&LOG_TIME_US, now, loop_id));
}

/// The leader's: the loop whose turn the calling thread runs (None: not
/// a loop thread, or before its first turn).
pub fn turn_loop() -> Option<u64> {
    with_thread(|t| t.turn_loop()).flatten()
}

/// The time an entry the leader appends now carries (see
/// [`ThreadClock::entry_time`]).
pub fn entry_time(now: u64) -> u64 {
    with_thread(|t| t.entry_time(&LOG_TIME_US, now)).unwrap_or(now)
}

/// The time and loop of this thread's turn when no entry carried them yet
/// (then the caller logs a `TICK`); clears it.
pub fn take_unlogged() -> Option<(u64, u64)> {
    with_thread(ThreadClock::take_unlogged).flatten()
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
    }
}
