//! How long a poller that found nothing keeps looking before it parks.
//!
//! A parked poller costs the writer a `futex` wake (a syscall on the
//! leader's server thread) and the poller the wake-up itself: on a
//! virtual machine a halted core takes tens of µs to come back, and that
//! sits on every commit round. Spinning a while keeps both off the path,
//! but only pays where the node has cores to spare: on a 2-core host the
//! spinner takes the core the writer needs. So the window depends on the
//! cores this process may run on: none below [`MIN_CORES`], else
//! [`SPIN`]. `LOCKSTEP_IDLE_SPIN_US` overrides it (0 turns it off).

use std::sync::OnceLock;
use std::time::Duration;

/// Cores below which pollers park at once (after a short backoff).
pub const MIN_CORES: usize = 8;

/// The window where cores are plentiful.
pub const SPIN: Duration = Duration::from_micros(50);

/// The environment variable that overrides the window, in µs.
pub const ENV: &str = "LOCKSTEP_IDLE_SPIN_US";

/// The window for `cores` available cores and an override `env`
/// (the variable's text, if set).
pub fn window_for(cores: usize, env: Option<&str>) -> Duration {
    if let Some(us) = env.and_then(|v| v.trim().parse::<u64>().ok()) {
        return Duration::from_micros(us);
    }
    if cores >= MIN_CORES {
        SPIN
    } else {
        Duration::ZERO
    }
}

/// This process's window (read once).
pub fn window() -> Duration {
    static WINDOW: OnceLock<Duration> = OnceLock::new();
    *WINDOW.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        window_for(cores, std::env::var(ENV).ok().as_deref())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spins_only_with_cores_to_spare_unless_told() {
        assert_eq!(window_for(2, None), Duration::ZERO);
        assert_eq!(window_for(MIN_CORES - 1, None), Duration::ZERO);
        assert_eq!(window_for(MIN_CORES, None), SPIN);
        assert_eq!(window_for(16, Some("0")), Duration::ZERO);
        assert_eq!(window_for(2, Some(" 200 ")), Duration::from_micros(200));
        assert_eq!(
            window_for(16, Some("lots")),
            SPIN,
            "an unreadable override is ignored"
        );
    }
}
