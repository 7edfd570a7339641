//! The log's time: the wall clock every replica's server reads while it
//! handles an input.
//!
//! A server that reads the clock while it executes a command (Redis for
//! key expiry, `SET … PX`, `TIME`; beanstalkd for delays) must read the
//! same value on every replica, or a key that expired on the leader lives
//! on in a backup. So the leader records, with each input, its wall clock
//! when its server read it (the entry's `time_us`), and from then on its
//! own server's wall-clock reads return that value too, until the next
//! input; a backup's server reads the `time_us` of the entry it is being
//! handed. Between inputs the time stands still, on the leader and on the
//! backups alike: time moves with the log.
//!
//! Only the wall clock (`CLOCK_REALTIME`, its coarse variant,
//! `gettimeofday`, `time`) is the log's; monotonic clocks stay real, so
//! the servers' timers still fire. Before the first input, and in a forked
//! child, every clock is real.

use std::sync::atomic::{AtomicU64, Ordering};

/// µs since the epoch of the input being handled (0: none yet).
static LOG_TIME_US: AtomicU64 = AtomicU64::new(0);

/// The server now handles an input read at `us` (0 is ignored: an entry
/// that carries no time).
pub fn enter_input(us: u64) {
    if us != 0 {
        LOG_TIME_US.store(us, Ordering::Release);
    }
}

/// The wall clock the server should read now, when the log sets it.
pub fn log_time_us() -> Option<u64> {
    match LOG_TIME_US.load(Ordering::Acquire) {
        0 => None,
        t => Some(t),
    }
}

/// `us` as (seconds, microseconds).
pub fn split_us(us: u64) -> (i64, i64) {
    ((us / 1_000_000) as i64, (us % 1_000_000) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_sets_the_time_and_zero_keeps_it() {
        enter_input(1_700_000_000_123_456);
        assert_eq!(log_time_us(), Some(1_700_000_000_123_456));
        enter_input(0);
        assert_eq!(log_time_us(), Some(1_700_000_000_123_456));
        assert_eq!(split_us(1_700_000_000_123_456), (1_700_000_000, 123_456));
    }
}
