//! Event-loop turns: how many times each server thread entered a wait
//! (`epoll_wait`, `poll`, `select` and their variants) so far.
//!
//! Both roles count. The leader tags each entry with whether its server
//! read it in the same turn, on the same thread, as the entry before
//! (`entry::SAME_TURN`): a backup may hand such entries to its server in
//! one turn. A backup's pump compares a thread's count with the one taken
//! at a read to know the server finished handling what it read.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, AtomicUsize, Ordering};

/// Threads with a counter of their own (more share the last one, whose
/// count proves nothing about a single thread).
const THREADS: usize = 32;
const SHARED: usize = THREADS - 1;

static COUNTS: [AtomicU64; THREADS] = [const { AtomicU64::new(0) }; THREADS];
/// Whether each thread runs between a wait's return and its next wait.
static RUNNING: [AtomicBool; THREADS] = [const { AtomicBool::new(false) }; THREADS];
static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
    static MARKS: Cell<TurnMarks> = const { Cell::new(TurnMarks::NEW) };
}

/// Where one thread's waits stood at its last turn in the log: the
/// leader's last logged turn, a backup's last turn handed. Pure: the
/// thread-local wrappers below and the replay simulation use it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TurnMarks {
    /// The leader's: (view, waits entered) at the thread's last logged
    /// turn.
    logged: (u64, u64),
    /// A backup's: (view, waits entered) at the last turn the thread was
    /// handed.
    handed: (u64, u64),
}

impl TurnMarks {
    /// A thread with no turn yet.
    pub const NEW: TurnMarks = TurnMarks {
        logged: (0, 0),
        handed: (0, 0),
    };

    /// The leader's: the thread, having entered `waits` waits, logs a turn
    /// in `view`. Returns the waits since its last logged turn of that
    /// view (0: none logged yet).
    pub fn log_turn(&mut self, view: u64, waits: u64) -> u32 {
        let (v, prev) = std::mem::replace(&mut self.logged, (view, waits));
        if v != view || prev == 0 {
            return 0;
        }
        u32::try_from(waits.saturating_sub(prev)).unwrap_or(u32::MAX)
    }

    /// A backup's: whether the thread, having entered `entered` waits,
    /// entered `waits` since the last turn it was handed in `view`. True
    /// when either is not known.
    pub fn due(&self, view: u64, waits: u32, entered: u64) -> bool {
        let (v, at) = self.handed;
        waits == 0 || v != view || at == 0 || entered >= at + u64::from(waits)
    }

    /// A backup's: the thread, having entered `entered` waits, starts a
    /// turn of `view` it was handed.
    pub fn handed(&mut self, view: u64, entered: u64) {
        self.handed = (view, entered);
    }
}

fn with_marks<T>(f: impl FnOnce(&mut TurnMarks) -> T) -> Option<T> {
    MARKS
        .try_with(|c| {
            let mut m = c.get();
            let r = f(&mut m);
            c.set(m);
            r
        })
        .ok()
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
    let s = slot();
    RUNNING[s].store(false, Ordering::Release);
    COUNTS[s].fetch_add(1, Ordering::AcqRel);
    WAITS_SEEN.fetch_or(w as u8, Ordering::Relaxed);
    if w == Wait::Epoll {
        MIN_EVENTS.fetch_min(max.max(1), Ordering::Relaxed);
    }
}

/// The calling thread's wait returned: it runs (a turn) until it waits
/// again.
pub fn wait_returned() {
    let s = slot();
    if s != SHARED {
        RUNNING[s].store(true, Ordering::Release);
    }
}

/// Whether the thread of `slot` runs between a wait's return and its next
/// wait (false for threads whose waits the hooks never saw).
pub fn running(slot: usize) -> bool {
    slot != SHARED && RUNNING[slot].load(Ordering::Acquire)
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

/// The leader's: the calling thread's current turn is logged in `view`
/// (its first entry). Returns how many waits it entered since its last
/// logged turn of that view (`EntryHeader::waits`; 0: none logged yet).
pub fn log_turn(view: u64) -> u32 {
    let n = count(slot());
    with_marks(|m| m.log_turn(view, n)).unwrap_or(0)
}

/// A backup's: whether the calling thread entered `waits` waits since the
/// last turn it was handed in `view` (the leader's thread did as many
/// between its two logged turns). True when either is not known.
pub fn due(view: u64, waits: u32) -> bool {
    let n = count(slot());
    with_marks(|m| m.due(view, waits, n)).unwrap_or(true)
}

/// A backup's: the calling thread starts a turn of `view` it was handed.
pub fn handed(view: u64) {
    let n = count(slot());
    with_marks(|m| m.handed(view, n));
}

/// How many distinct connections a backup may hand its server in one
/// turn: one when the server scans (`poll`/`select`: it handles what a
/// wait reports in an order of its own — Perl's `IO::Poll` in hash order —
/// and a read out of the log's order would get EAGAIN, which simple
/// servers take for an error); else its smallest epoll `maxevents` (the
/// leader's server got no more from one wait; the log's connections go
/// first and a wait they fill polls nothing else, so no other ready fd
/// pushes one out).
pub fn batch_width() -> usize {
    if WAITS_SEEN.load(Ordering::Relaxed) & Wait::Scan as u8 != 0 {
        return 1;
    }
    let max = MIN_EVENTS.load(Ordering::Relaxed).max(1) as usize;
    max.clamp(1, MAX_WIDTH)
}

/// The most connections one turn hands over.
pub const MAX_WIDTH: usize = 64;

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

    #[test]
    fn a_backup_runs_as_many_waits_between_turns_as_the_leader() {
        std::thread::spawn(|| {
            // The leader: turns logged at waits 1 and 4 of view 3.
            enter_wait(Wait::Epoll, 64);
            assert_eq!(log_turn(3), 0, "the first logged turn");
            for _ in 0..3 {
                enter_wait(Wait::Epoll, 64);
            }
            assert_eq!(log_turn(3), 3);
            enter_wait(Wait::Epoll, 64);
            assert_eq!(log_turn(4), 0, "a new view counts anew");
        })
        .join()
        .unwrap();
        std::thread::spawn(|| {
            // A backup handed a turn at its wait 1 of view 3.
            enter_wait(Wait::Epoll, 64);
            assert!(due(3, 5), "nothing handed yet");
            handed(3);
            enter_wait(Wait::Epoll, 64);
            assert!(!due(3, 3), "one wait of three");
            assert!(due(3, 0), "waits not known");
            assert!(due(2, 3), "another view");
            enter_wait(Wait::Epoll, 64);
            enter_wait(Wait::Epoll, 64);
            assert!(due(3, 3));
        })
        .join()
        .unwrap();
    }
}
