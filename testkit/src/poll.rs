//! Waiting for a condition of a running cluster.

use std::time::{Duration, Instant};

/// Calls `cond` every `every` until it holds; after `limit`, returns the
/// reason it last gave for not holding.
pub fn poll_until(
    limit: Duration,
    every: Duration,
    mut cond: impl FnMut() -> Result<(), String>,
) -> Result<(), String> {
    let start = Instant::now();
    loop {
        let last = match cond() {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if start.elapsed() > limit {
            return Err(last);
        }
        std::thread::sleep(every);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_at_once_or_the_last_reason() {
        let mut n = 0;
        assert_eq!(
            poll_until(Duration::from_secs(5), Duration::ZERO, || {
                n += 1;
                if n == 3 {
                    Ok(())
                } else {
                    Err(format!("try {n}"))
                }
            }),
            Ok(())
        );
        let r = poll_until(Duration::ZERO, Duration::ZERO, || Err("never".into()));
        assert_eq!(r, Err("never".to_string()));
    }
}
