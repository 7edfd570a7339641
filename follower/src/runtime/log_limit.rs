//! Repeated warnings, rate limited: the first of a run is logged at once,
//! the same one again at most once per period, with how often it came
//! meanwhile; a different one is logged at once.

use std::time::{Duration, Instant};

/// How often the same warning is logged again at most.
pub const REPEAT_PERIOD: Duration = Duration::from_secs(10);

/// One source of warnings (e.g. the election thread).
#[derive(Debug)]
pub struct Repeats {
    period: Duration,
    last: Option<(String, Instant)>,
    /// Times the last warning came since it was logged.
    hidden: u64,
}

impl Default for Repeats {
    fn default() -> Self {
        Repeats::new(REPEAT_PERIOD)
    }
}

impl Repeats {
    /// Logs the same warning at most once per `period`.
    pub fn new(period: Duration) -> Repeats {
        Repeats {
            period,
            last: None,
            hidden: 0,
        }
    }

    /// The line to log for `what` at `now`, if any.
    pub fn line(&mut self, what: &str, now: Instant) -> Option<String> {
        match &mut self.last {
            Some((last, at)) if last == what => {
                if now.duration_since(*at) < self.period {
                    self.hidden += 1;
                    return None;
                }
                let n = std::mem::take(&mut self.hidden);
                let since = now.duration_since(*at).as_secs();
                *at = now;
                Some(if n == 0 {
                    what.to_string()
                } else {
                    format!("{what} (again {n} times in {since} s)")
                })
            }
            _ => {
                self.last = Some((what.to_string(), now));
                self.hidden = 0;
                Some(what.to_string())
            }
        }
    }

    /// The condition is over: the next warning is logged at once.
    pub fn clear(&mut self) {
        self.last = None;
        self.hidden = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_warning_is_logged_once_per_period_with_a_count() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut r = Repeats::new(Duration::from_secs(10));
        assert_eq!(
            r.line("no ZooKeeper", at(0)).as_deref(),
            Some("no ZooKeeper")
        );
        for ms in (200..10_000).step_by(200) {
            assert_eq!(r.line("no ZooKeeper", at(ms)), None);
        }
        assert_eq!(
            r.line("no ZooKeeper", at(10_000)).as_deref(),
            Some("no ZooKeeper (again 49 times in 10 s)")
        );
        assert_eq!(r.line("other", at(10_100)).as_deref(), Some("other"));
        assert_eq!(
            r.line("no ZooKeeper", at(10_200)).as_deref(),
            Some("no ZooKeeper")
        );
        r.clear();
        assert_eq!(
            r.line("no ZooKeeper", at(10_300)).as_deref(),
            Some("no ZooKeeper")
        );
    }
}
