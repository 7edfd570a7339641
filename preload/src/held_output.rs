//! Output commit with one wait per event-loop turn, not one per reply.
//!
//! Output mode holds a client's output until every input appended so far
//! is committed. A server that replies as it goes (memcached writes each
//! connection's reply right after reading its request, before it reads
//! the next connection) would wait for a commit round per connection:
//! measured, memcached through lockstep ran at 0.2× plain, one commit
//! round per request. So a reply written before the commit is not waited
//! for: its bytes are *held* here (copied, the write returns as if they
//! went out) and leave when the loop thread's turn ends, before it waits
//! again (`dispatch::before_wait`), with one commit wait for all of them.
//! The client sees nothing earlier than before, and a turn's replies all
//! wait for one round.
//!
//! Rules that keep this invisible to the server and the clients:
//! - Only a loop thread's output is held (its turn ends for sure); a
//!   connection holds at most [`HOLD_MAX`] bytes (a larger reply waits
//!   for the commit and goes out itself, as before).
//! - Bytes of one connection leave in order: while a connection holds
//!   bytes, its next output is held behind them, or (over the bound) the
//!   held bytes go first.
//! - A close or shutdown sends the held bytes first.
//! - When the commit fails (this node stopped leading), the held bytes
//!   never leave and the connection is reset, as a waiting write's would
//!   be.
//! - A client that does not read: what the socket does not take stays
//!   held (sent again at each turn's end); a later write to it is refused
//!   with `EAGAIN` once the bound is reached, so the server buffers it
//!   itself as it would for a slow client. Such a remainder leaves at the
//!   server's next turn at the latest (Redis's timer runs one every
//!   100 ms, memcached's every second).
//!
//! Per thread, allocation-free in the steady state: buffers are reused.

use std::cell::RefCell;

use crate::engine::{Engine, Fail};
use crate::sys;

/// Bytes one connection may hold.
pub const HOLD_MAX: usize = 64 * 1024;

/// Buffers kept for reuse.
const SPARE_MAX: usize = 64;

/// One connection's held output.
struct Held {
    fd: i32,
    conn: u64,
    bytes: Vec<u8>,
    /// Its bytes were committed already (a remainder the socket did not
    /// take): no commit wait for them.
    committed: bool,
}

#[derive(Default)]
struct Holds {
    held: Vec<Held>,
    spare: Vec<Vec<u8>>,
}

impl Holds {
    fn find(&mut self, fd: i32, conn: u64) -> Option<usize> {
        self.held.iter().position(|h| h.fd == fd && h.conn == conn)
    }

    fn recycle(&mut self, mut bytes: Vec<u8>) {
        if self.spare.len() < SPARE_MAX && bytes.capacity() <= HOLD_MAX {
            bytes.clear();
            self.spare.push(bytes);
        }
    }
}

thread_local! {
    static HOLDS: RefCell<Holds> = RefCell::new(Holds::default());
}

fn with<R>(f: impl FnOnce(&mut Holds) -> R) -> Option<R> {
    HOLDS
        .try_with(|h| h.try_borrow_mut().ok().map(|mut h| f(&mut h)))
        .ok()
        .flatten()
}

/// Whether connection `conn` (on `fd`) holds output on this thread.
pub fn holds(fd: i32, conn: u64) -> bool {
    with(|h| h.find(fd, conn).is_some()).unwrap_or(false)
}

/// Whether this thread holds output for any connection.
pub fn any() -> bool {
    with(|h| !h.held.is_empty()).unwrap_or(false)
}

/// Holds `segments` (the server's write on `fd`, connection `conn`)
/// behind what the connection holds already. False when they do not fit
/// in [`HOLD_MAX`]: nothing was held.
pub fn hold(fd: i32, conn: u64, segments: &[&[u8]]) -> bool {
    let total: usize = segments.iter().map(|s| s.len()).sum();
    with(|h| {
        let i = match h.find(fd, conn) {
            Some(i) => i,
            None => {
                if total > HOLD_MAX {
                    return false;
                }
                let bytes = h.spare.pop().unwrap_or_default();
                h.held.push(Held {
                    fd,
                    conn,
                    bytes,
                    committed: false,
                });
                h.held.len() - 1
            }
        };
        let held = &mut h.held[i];
        if held.bytes.len() + total > HOLD_MAX {
            return false;
        }
        for s in segments {
            held.bytes.extend_from_slice(s);
        }
        held.committed = false;
        true
    })
    .unwrap_or(false)
}

/// What became of a connection's held output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// Nothing is held any more.
    Sent,
    /// The socket took only part: the rest stays held.
    Stuck,
    /// The commit failed: the bytes were dropped (`on_fail` ran).
    Failed,
}

/// Sends what every connection of this thread holds, once the commit
/// allows (one wait for all). `on_fail(fd, conn, why)` resets a
/// connection whose output can never leave.
///
/// `wait` is the commit wait: `Engine::wait_output`, or a wait for what
/// was appended when the turn ended (`Engine::wait_output_upto`) once the
/// turn lock is let go.
pub fn release_all(
    wait: &mut dyn FnMut() -> Result<(), Fail>,
    on_fail: &mut dyn FnMut(i32, u64, &Fail),
) {
    let Some(mut held) = with(|h| std::mem::take(&mut h.held)) else {
        return;
    };
    if held.is_empty() {
        let _ = with(|h| h.held = held);
        return;
    }
    let waited = if held.iter().all(|h| h.committed) {
        Ok(())
    } else {
        wait()
    };
    let mut i = 0;
    while i < held.len() {
        if send(&mut held[i], &waited, on_fail) == Released::Stuck {
            i += 1;
        } else {
            let done = held.swap_remove(i);
            let _ = with(|h| h.recycle(done.bytes));
        }
    }
    let _ = with(|h| {
        // Nothing is held meanwhile (hooks do not re-enter); should
        // something be, it stays behind the remainders.
        held.append(&mut h.held);
        h.held = held;
    });
}

/// Sends what connection `conn` on `fd` holds once the commit allows
/// (before its close, or before a write that does not fit behind it).
pub fn release(
    engine: &Engine,
    fd: i32,
    conn: u64,
    on_fail: &mut dyn FnMut(i32, u64, &Fail),
) -> Released {
    let Some(Some(mut h)) = with(|hs| hs.find(fd, conn).map(|i| hs.held.swap_remove(i))) else {
        return Released::Sent;
    };
    let waited = if h.committed {
        Ok(())
    } else {
        engine.wait_output()
    };
    let outcome = send(&mut h, &waited, on_fail);
    let _ = with(|hs| match outcome {
        Released::Stuck => hs.held.push(h),
        _ => hs.recycle(h.bytes),
    });
    outcome
}

/// Sends one connection's held bytes, the commit wait having given
/// `waited`; what the socket does not take stays in `h`.
fn send(
    h: &mut Held,
    waited: &Result<(), Fail>,
    on_fail: &mut dyn FnMut(i32, u64, &Fail),
) -> Released {
    let alive = crate::fdtable::slot(h.fd)
        .is_some_and(|s| s.conn() == h.conn && s.state() & crate::fdtable::FAILED == 0);
    if !alive {
        // Reset or closed meanwhile: its output goes nowhere.
        h.bytes.clear();
        return Released::Failed;
    }
    if let Err(f) = waited {
        on_fail(h.fd, h.conn, f);
        h.bytes.clear();
        return Released::Failed;
    }
    h.committed = true;
    let n = sys::send_nonblocking(h.fd, &h.bytes);
    if n == h.bytes.len() {
        h.bytes.clear();
        Released::Sent
    } else {
        h.bytes.drain(..n);
        Released::Stuck
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_holds_up_to_its_bound_in_order() {
        assert!(!holds(7, 1));
        assert!(hold(7, 1, &[b"ab", b"c"]));
        assert!(hold(7, 1, &[b"de"]));
        assert!(holds(7, 1));
        assert!(
            !holds(7, 2),
            "another connection on a reused fd holds nothing"
        );
        let held = with(|h| h.held[0].bytes.clone()).unwrap();
        assert_eq!(held, b"abcde");
        let rest = vec![0u8; HOLD_MAX - 5];
        assert!(hold(7, 1, &[&rest]), "exactly the bound fits");
        assert!(!hold(7, 1, &[b"x"]), "one byte more does not");
        assert_eq!(with(|h| h.held[0].bytes.len()).unwrap(), HOLD_MAX);
        let too_big = vec![0u8; HOLD_MAX + 1];
        assert!(
            !hold(8, 1, &[&too_big]),
            "a reply over the bound is never held"
        );
        assert!(!holds(8, 1));
    }
}
