//! How a leader waits for its acks: spin with a bounded backoff, then park
//! on its region's doorbell (the local follower rings it when it writes an
//! ack; remote acks arriving through `Region::write` ring it too).

use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;

use crate::region::Region;

/// Where a wait stands when [`wait_until`] shows it to its watcher.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waited {
    /// Before each spin or park.
    Spinning,
    /// After a park on the doorbell: time since the first park ended.
    Parked(Duration),
}

/// Returns once `done()` holds. While it does not, `watch` sees every
/// round ([`Waited::Spinning`] before each, [`Waited::Parked`] after each
/// park of at most `park`) and fails the wait by returning an error.
/// Allocation-free.
pub fn wait_until<E>(
    region: &Region,
    park: Duration,
    mut done: impl FnMut() -> bool,
    mut watch: impl FnMut(Waited) -> Result<(), E>,
) -> Result<(), E> {
    if done() {
        return Ok(());
    }
    let backoff = Backoff::new();
    let spin = crate::idle_spin::window();
    let mut spinning_since: Option<Instant> = None;
    let mut parked_since: Option<Instant> = None;
    loop {
        watch(Waited::Spinning)?;
        if !backoff.is_completed() {
            backoff.snooze();
        } else if parked_since.is_none()
            && spinning_since.get_or_insert_with(Instant::now).elapsed() < spin
        {
            // Cores to spare: the acks are seen without a wake-up (see
            // `idle_spin`).
            std::hint::spin_loop();
        } else {
            let bell = region.bell();
            let seen = bell.value();
            if done() {
                return Ok(());
            }
            bell.wait(seen, park);
            let since = *parked_since.get_or_insert_with(Instant::now);
            watch(Waited::Parked(since.elapsed()))?;
        }
        if done() {
            return Ok(());
        }
    }
}
