//! The leader's event-loop turns run one at a time.
//!
//! A server with several event loops (memcached runs its clock timer on a
//! listener loop beside its workers) runs their turns at once, but the log
//! orders them: a backup runs each turn alone, in log order. So the leader
//! must not let two turns overlap either, or a worker's command may see
//! the listener's clock move on the leader (the listener's turn ran while
//! the worker waited for its input's commit) while the log has that
//! turn's `TICK` after the command, and every backup answers otherwise.
//!
//! A loop thread takes the lock when its wait returns and holds it until
//! it waits again: its reads, its commit waits and its output all lie in
//! one turn no other thread's turn overlaps. Only the leader's threads
//! take it; a wait hook always lets it go (a thread never waits in its
//! event loop holding it, so a turn that ends cannot block another for
//! good). Waiting for the lock is waiting for another turn's commit,
//! which fails by itself when the cluster can no longer commit.
//!
//! The lock is fair (first come, first served): with std's mutex a worker
//! that ended its turn and found more input at once took the lock again
//! ahead of the threads already waiting for it, and memcached `-t 4` kept
//! one worker's clients waiting for whole seconds while the other workers
//! took turn after turn.

use std::cell::Cell;
use std::sync::{Condvar, Mutex, MutexGuard};

/// The tickets: the next one to hand out, the one whose turn runs, and how
/// many threads wait (so that ending a turn nobody waits for wakes none).
struct Tickets {
    next: u64,
    serving: u64,
    waiting: u32,
}

static TICKETS: Mutex<Tickets> = Mutex::new(Tickets {
    next: 0,
    serving: 0,
    waiting: 0,
});
static CALLED: Condvar = Condvar::new();

fn tickets() -> MutexGuard<'static, Tickets> {
    // Nothing panics while the mutex is held; a poisoned one still counts.
    TICKETS.lock().unwrap_or_else(|p| p.into_inner())
}

/// A thread's hold on the lock; a thread that exits in its turn lets the
/// next one run.
struct Hold(Cell<bool>);

impl Drop for Hold {
    fn drop(&mut self) {
        if self.0.get() {
            release();
        }
    }
}

thread_local! {
    /// Whether this thread's turn runs (it holds the serving ticket).
    static HELD: Hold = const { Hold(Cell::new(false)) };
}

/// The calling loop thread's turn starts: waits until every thread that
/// asked before it had its turn. Nothing when it holds the lock already.
pub fn begin() {
    if HELD.try_with(|h| h.0.get()).unwrap_or(true) {
        return;
    }
    let mut t = tickets();
    let mine = t.next;
    t.next += 1;
    if t.serving != mine {
        t.waiting += 1;
        while t.serving != mine {
            t = CALLED.wait(t).unwrap_or_else(|p| p.into_inner());
        }
        t.waiting -= 1;
    }
    drop(t);
    let _ = HELD.try_with(|h| h.0.set(true));
}

/// The calling thread's turn ends (it is about to wait): the next thread
/// in line may start its turn.
pub fn end() {
    if HELD.try_with(|h| h.0.replace(false)).unwrap_or(false) {
        release();
    }
}

/// Serves the next ticket.
fn release() {
    let mut t = tickets();
    t.serving += 1;
    let wake = t.waiting > 0;
    drop(t);
    if wake {
        CALLED.notify_all();
    }
}

/// Whether another thread waits for its turn.
pub fn others_wait() -> bool {
    tickets().waiting > 0
}

/// Whether the calling thread's turn holds the lock.
pub fn held() -> bool {
    HELD.try_with(|h| h.0.get()).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::Arc;

    /// The lock is one per process: its tests take turns.
    static ONE_TEST: Mutex<()> = Mutex::new(());

    fn one_test() -> MutexGuard<'static, ()> {
        ONE_TEST.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[test]
    fn turns_of_two_threads_never_overlap() {
        let _one = one_test();
        let inside = Arc::new(AtomicU32::new(0));
        let overlapped = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let inside = inside.clone();
                let overlapped = overlapped.clone();
                std::thread::spawn(move || {
                    for _ in 0..2_000 {
                        begin();
                        begin(); // a second begin in the same turn is a no-op
                        assert!(held());
                        if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                            overlapped.store(true, Ordering::SeqCst);
                        }
                        std::thread::yield_now();
                        inside.fetch_sub(1, Ordering::SeqCst);
                        end();
                        assert!(!held());
                        end(); // ending a turn not held is a no-op
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(!overlapped.load(Ordering::SeqCst));
    }

    #[test]
    fn a_thread_waiting_for_the_lock_runs_before_one_that_asks_again() {
        let _one = one_test();
        // A thread that ends its turn and begins the next at once queues
        // behind the thread already waiting.
        begin();
        let asked = Arc::new(AtomicBool::new(false));
        let ran = Arc::new(AtomicU32::new(0));
        let other = {
            let (asked, ran) = (asked.clone(), ran.clone());
            std::thread::spawn(move || {
                asked.store(true, Ordering::SeqCst);
                begin();
                ran.store(1, Ordering::SeqCst);
                end();
            })
        };
        while !asked.load(Ordering::SeqCst) || tickets().waiting == 0 {
            std::thread::yield_now();
        }
        end();
        begin();
        assert_eq!(
            ran.load(Ordering::SeqCst),
            1,
            "the waiting thread's turn came first"
        );
        end();
        other.join().unwrap();
    }

    #[test]
    fn a_thread_that_exits_in_its_turn_lets_the_next_one_run() {
        let _one = one_test();
        std::thread::spawn(begin).join().unwrap();
        let t = std::thread::spawn(|| {
            begin();
            end();
        });
        t.join().unwrap();
    }
}
