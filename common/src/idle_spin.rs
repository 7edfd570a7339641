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

/// Spin rounds (each twice as long as the one before, from one
/// `spin_loop` hint) a poller makes before it parks when no window is set:
/// about a microsecond in all, never a `sched_yield`. A yield on a host
/// without an idle core hands the core to another runnable thread for a
/// whole slice, or (nothing else runnable) returns at once: either way it
/// costs a syscall and catches nothing a park would miss (the
/// followers' `sched_yield` rounds were 17% of their CPU on 2 cores).
pub const SPIN_ROUNDS: u32 = 6;

/// What a poller that found nothing does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Looks again (it spun a moment).
    Look,
    /// Parks on its doorbell.
    Park,
}

/// A poller's idle rounds since it last found something: a few short spins
/// (no yields), then, within the [`window`], more spinning, then parking.
/// Allocation-free.
#[derive(Debug)]
pub struct Idle {
    window: Duration,
    rounds: u32,
    since: Option<std::time::Instant>,
}

impl Idle {
    /// A poller with this process's [`window`].
    pub fn new() -> Idle {
        Idle::with_window(window())
    }

    /// A poller with the spin window `window`.
    pub fn with_window(window: Duration) -> Idle {
        Idle {
            window,
            rounds: 0,
            since: None,
        }
    }

    /// The poller found something: the next idle round starts over.
    pub fn reset(&mut self) {
        self.rounds = 0;
        self.since = None;
    }

    /// The poller found nothing: spins a moment and says to look again, or
    /// says to park.
    pub fn idle(&mut self) -> Next {
        if self.rounds < SPIN_ROUNDS {
            for _ in 0..1u32 << self.rounds {
                std::hint::spin_loop();
            }
            self.rounds += 1;
            return Next::Look;
        }
        if !self.window.is_zero()
            && self
                .since
                .get_or_insert_with(std::time::Instant::now)
                .elapsed()
                < self.window
        {
            std::hint::spin_loop();
            return Next::Look;
        }
        Next::Park
    }
}

impl Default for Idle {
    fn default() -> Idle {
        Idle::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_window_a_poller_parks_after_a_few_spins_and_never_yields() {
        let mut idle = Idle::with_window(Duration::ZERO);
        for _ in 0..SPIN_ROUNDS {
            assert_eq!(idle.idle(), Next::Look);
        }
        assert_eq!(idle.idle(), Next::Park);
        assert_eq!(idle.idle(), Next::Park, "parks until it finds something");
        idle.reset();
        assert_eq!(idle.idle(), Next::Look);
    }

    #[test]
    fn with_a_window_a_poller_spins_through_it_then_parks() {
        let mut idle = Idle::with_window(Duration::from_millis(20));
        let start = std::time::Instant::now();
        let mut looks = 0u64;
        while idle.idle() == Next::Look {
            looks += 1;
        }
        assert!(start.elapsed() >= Duration::from_millis(20));
        assert!(looks > u64::from(SPIN_ROUNDS));
    }

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
