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

use std::cell::RefCell;
use std::sync::{Mutex, MutexGuard};

/// Held by the thread whose turn runs.
static TURN: Mutex<()> = Mutex::new(());

thread_local! {
    /// This thread's hold on `TURN`, while its turn runs.
    static HELD: RefCell<Option<MutexGuard<'static, ()>>> = const { RefCell::new(None) };
}

/// The calling loop thread's turn starts: waits until no other thread's
/// turn runs. Nothing when it holds the lock already.
pub fn begin() {
    let _ = HELD.try_with(|h| {
        if let Ok(mut h) = h.try_borrow_mut() {
            if h.is_none() {
                // A panic never happens while the lock is held (the guard
                // only lives in this cell), but a poisoned lock still
                // orders turns.
                *h = Some(TURN.lock().unwrap_or_else(|p| p.into_inner()));
            }
        }
    });
}

/// The calling thread's turn ends (it is about to wait): another thread's
/// turn may start.
pub fn end() {
    let _ = HELD.try_with(|h| {
        if let Ok(mut h) = h.try_borrow_mut() {
            h.take();
        }
    });
}

/// Whether the calling thread's turn holds the lock.
pub fn held() -> bool {
    HELD.try_with(|h| h.borrow().is_some()).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::Arc;

    #[test]
    fn turns_of_two_threads_never_overlap() {
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
    fn a_thread_that_exits_in_its_turn_lets_the_next_one_run() {
        std::thread::spawn(begin).join().unwrap();
        let t = std::thread::spawn(|| {
            begin();
            end();
        });
        t.join().unwrap();
    }
}
