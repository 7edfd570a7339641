//! How a leader waits for its acks: spin a moment (longer only where cores
//! are spare, see `idle_spin`), then park on its region's doorbell (the local follower rings it when it writes an
//! ack; remote acks arriving through `Region::write` ring it too).

use std::time::{Duration, Instant};

use crate::idle_spin::{Idle, Next};

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
    // A few short spins, more only where cores are spare (see
    // `idle_spin`), then parks: no yields.
    let mut idle = Idle::new();
    let mut parked_since: Option<Instant> = None;
    loop {
        watch(Waited::Spinning)?;
        if parked_since.is_some() || idle.idle() == Next::Park {
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
