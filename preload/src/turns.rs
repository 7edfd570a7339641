//! Event-loop turns: how many times each server thread entered a wait
//! (`epoll_wait`, `poll`, `select` and their variants) so far.
//!
//! Both roles count. The leader tags each entry with whether its server
//! read it in the same turn, on the same thread, as the entry before
//! (`entry::SAME_TURN`): a backup may hand such entries to its server in
//! one turn. A backup's pump compares a thread's count with the one taken
//! at a read to know the server finished handling what it read.

use std::cell::Cell;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicU8, AtomicUsize, Ordering};

/// Threads with a counter of their own (more share the last one, whose
/// count proves nothing about a single thread).
const THREADS: usize = 32;
const SHARED: usize = THREADS - 1;

static COUNTS: [AtomicU64; THREADS] = [const { AtomicU64::new(0) }; THREADS];
static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// Which call a server thread waits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Wait {
    /// `epoll_wait`/`epoll_pwait`: events come back in an order the
    /// preload can set.
    Epoll = 1,
    /// `poll`/`select` and variants: the server scans in its own order.
    Scan = 2,
}

/// The kinds of wait seen so far (bits of `Wait`).
static WAITS_SEEN: AtomicU8 = AtomicU8::new(0);
/// The smallest `maxevents` an `epoll_wait` was called with.
static MIN_EVENTS: AtomicI32 = AtomicI32::new(i32::MAX);

/// This thread's counter slot.
pub fn slot() -> usize {
    SLOT.try_with(|c| {
        if c.get() == usize::MAX {
            let n = NEXT_SLOT.fetch_add(1, Ordering::Relaxed);
            c.set(n.min(SHARED));
        }
        c.get()
    })
    .unwrap_or(SHARED)
}

/// The calling thread enters a wait of kind `w` (`max`: epoll's maxevents).
pub fn enter_wait(w: Wait, max: i32) {
    COUNTS[slot()].fetch_add(1, Ordering::AcqRel);
    WAITS_SEEN.fetch_or(w as u8, Ordering::Relaxed);
    if w == Wait::Epoll {
        MIN_EVENTS.fetch_min(max.max(1), Ordering::Relaxed);
    }
}

/// Waits entered by the thread of `slot`.
pub fn count(slot: usize) -> u64 {
    COUNTS[slot.min(SHARED)].load(Ordering::Acquire)
}

/// The calling thread's turn, when it names one: (slot, waits entered).
/// None for a thread that never waited in its event loop, or one past
/// the counted threads.
pub fn current() -> Option<(usize, u64)> {
    let s = slot();
    let n = count(s);
    (s != SHARED && n > 0).then_some((s, n))
}

/// How many distinct connections a backup may hand its server in one
/// turn: one when the server scans its own fd order (`poll`/`select`),
/// else a part of its smallest `maxevents`, so that other ready fds
/// cannot push one of them out of the wait's result.
pub fn batch_width() -> usize {
    if WAITS_SEEN.load(Ordering::Relaxed) & Wait::Scan as u8 != 0 {
        return 1;
    }
    let max = MIN_EVENTS.load(Ordering::Relaxed).max(1) as usize;
    (max / 2).clamp(1, MAX_WIDTH)
}

/// The most connections one turn hands over.
pub const MAX_WIDTH: usize = 32;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_names_a_turn_only_once_it_waited() {
        std::thread::spawn(|| {
            assert_eq!(current(), None);
            enter_wait(Wait::Epoll, 64);
            let (s, n) = current().expect("a turn");
            assert_eq!(n, 1);
            enter_wait(Wait::Epoll, 64);
            assert_eq!(current(), Some((s, 2)));
        })
        .join()
        .unwrap();
    }
}
