//! How long a poller that found nothing keeps looking before it parks.
//!
//! A parked poller costs the writer a `futex` wake (a syscall on the
//! leader's server thread) and the poller the wake-up itself: on a
//! virtual machine a halted core takes tens of µs to come back, and that
//! sits on every commit round. Spinning a while keeps both off the path,
//! but only where the node has whole cores to spare. Measured on a shared
//! 16-vCPU host running all three nodes (`lockstep bench redis`, three
//! alternating rounds), 50 µs of spinning tripled the followers' CPU per
//! request and lowered output commit on most loads (`SET -P 16` 770k ->
//! 570k/s); on 2 cores it was neutral to 5% worse. So it is off unless
//! `LOCKSTEP_IDLE_SPIN_US` asks for it (µs; for nodes with dedicated
//! cores).

use std::sync::OnceLock;
use std::time::Duration;

/// The environment variable that sets the window, in µs.
pub const ENV: &str = "LOCKSTEP_IDLE_SPIN_US";

/// The window an override `env` (the variable's text, if set) asks for.
pub fn window_for(env: Option<&str>) -> Duration {
    env.and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(Duration::ZERO, Duration::from_micros)
}

/// This process's window (read once).
pub fn window() -> Duration {
    static WINDOW: OnceLock<Duration> = OnceLock::new();
    *WINDOW.get_or_init(|| window_for(std::env::var(ENV).ok().as_deref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_unless_asked_for() {
        assert_eq!(window_for(None), Duration::ZERO);
        assert_eq!(window_for(Some("0")), Duration::ZERO);
        assert_eq!(window_for(Some(" 200 ")), Duration::from_micros(200));
        assert_eq!(
            window_for(Some("lots")),
            Duration::ZERO,
            "an unreadable value is ignored"
        );
    }
}
