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
//! That round is not waited out when the loop has more to do: at the
//! turn's end what is committed leaves, and the rest stays held while
//! the next turn runs (its work overlaps the commit round; measured on 16
//! cores, the leader's loop sat out about 15% of `SET -P 16` in these
//! waits). It leaves as soon as the loop next looks and finds it
//! committed: when the turn reads input, when its clock moves a grain (a
//! long script), when the turn ends, and before the loop blocks (then
//! with a wait). Each entry keeps the mark of what its bytes depend on
//! (the last seq appended when they were written), so a later turn's
//! inputs never delay an earlier turn's replies.
//!
//! Rules that keep this invisible to the server and the clients:
//! - Only a loop thread's output is held (its turn ends for sure); a
//!   connection holds at most [`HOLD_MAX`] bytes over all its turns (a
//!   larger reply waits for the commit and goes out itself, as before).
//! - Bytes of one connection leave in order: while a connection holds
//!   bytes, its next output is held behind them (a later turn's in an
//!   entry of its own), or (over the bound) the held bytes go first.
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

use crate::leader::engine::{Engine, Fail};
use crate::sys;

/// Bytes one connection may hold.
pub const HOLD_MAX: usize = 64 * 1024;

/// Buffers kept for reuse.
const SPARE_MAX: usize = 64;

/// Output a connection wrote in one turn, or the remainder of it.
struct Held {
    fd: i32,
    conn: u64,
    bytes: Vec<u8>,
    /// What its bytes depend on: the last seq appended (and its view)
    /// when the newest of them was written.
    mark: (u64, u64),
    /// Its bytes were committed already (a remainder the socket did not
    /// take): no commit wait for them.
    committed: bool,
    /// Its turn ended: the connection's later output goes behind it, in a
    /// `Held` of its own (its own mark).
    sealed: bool,
}

#[derive(Default)]
struct Holds {
    /// In the order written: a connection's entries leave in this order.
    held: Vec<Held>,
    spare: Vec<Vec<u8>>,
}

impl Holds {
    /// The connection's newest entry and the bytes it holds in all (one
    /// pass: this runs on every held write).
    fn of(&self, fd: i32, conn: u64) -> (Option<usize>, usize) {
        let mut newest = None;
        let mut total = 0;
        for (i, h) in self.held.iter().enumerate() {
            if h.fd == fd && h.conn == conn {
                newest = Some(i);
                total += h.bytes.len();
            }
        }
        (newest, total)
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
    with(|h| h.held.iter().any(|x| x.fd == fd && x.conn == conn)).unwrap_or(false)
}

/// Whether this thread holds output for any connection.
pub fn any() -> bool {
    with(|h| !h.held.is_empty()).unwrap_or(false)
}

/// Holds `segments` (the server's write on `fd`, connection `conn`,
/// depending on what was appended up to `mark`) behind what the
/// connection holds already. False when they do not fit in
/// [`HOLD_MAX`]: nothing was held.
pub fn hold(fd: i32, conn: u64, segments: &[&[u8]], mark: (u64, u64)) -> bool {
    let total: usize = segments.iter().map(|s| s.len()).sum();
    with(|h| {
        let (newest, held) = h.of(fd, conn);
        if held + total > HOLD_MAX {
            return false;
        }
        let i = match newest {
            Some(i) if !h.held[i].sealed => i,
            _ => {
                let bytes = h.spare.pop().unwrap_or_default();
                h.held.push(Held {
                    fd,
                    conn,
                    bytes,
                    mark,
                    committed: false,
                    sealed: false,
                });
                h.held.len() - 1
            }
        };
        let held = &mut h.held[i];
        for s in segments {
            held.bytes.extend_from_slice(s);
        }
        held.mark = mark;
        held.committed = false;
        true
    })
    .unwrap_or(false)
}

/// The turn ends: what its connections wrote so far is closed (see
/// `Held::sealed`).
pub fn seal() {
    let _ = with(|h| h.held.iter_mut().for_each(|held| held.sealed = true));
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
    let mut waited = None;
    release_where(
        &mut |_, _, _| Some(waited.get_or_insert_with(&mut *wait).clone()),
        on_fail,
    );
}

/// Sends, without waiting, what is committed already: each held output
/// whose `committed(mark)` says so (None: not yet; it stays, and so does
/// everything its connection wrote after it). Returns whether output
/// stays held waiting for its commit (a remainder a socket did not take
/// is tried again at the next turn's end, as before).
pub fn release_committed(
    committed: &mut dyn FnMut((u64, u64)) -> Option<Result<(), Fail>>,
    on_fail: &mut dyn FnMut(i32, u64, &Fail),
) -> bool {
    release_where(&mut |_, _, mark| committed(mark), on_fail);
    with(|h| h.held.iter().any(|held| !held.committed)).unwrap_or(false)
}

/// The body of `release_all` and `release_committed`: every held output
/// in the order written, `decided(fd, conn, mark)` being its commit's
/// outcome (None: not known yet, or not asked). A connection's output
/// stays behind any of its earlier output that stays.
fn release_where(
    decided: &mut dyn FnMut(i32, u64, (u64, u64)) -> Option<Result<(), Fail>>,
    on_fail: &mut dyn FnMut(i32, u64, &Fail),
) {
    let Some(mut held) = with(|h| std::mem::take(&mut h.held)) else {
        return;
    };
    // Entries [..kept] stay; the rest up to `i` are done.
    let mut kept = 0;
    for i in 0..held.len() {
        let (fd, conn) = (held[i].fd, held[i].conn);
        let outcome = if held[i].committed {
            Some(Ok(()))
        } else {
            decided(fd, conn, held[i].mark)
        };
        // Looked for only when it could leave: a turn of pending output
        // costs one pass, not one per pair.
        let stays = match outcome {
            None => true,
            Some(_) if held[..kept].iter().any(|k| k.fd == fd && k.conn == conn) => true,
            Some(waited) => send(&mut held[i], &waited, on_fail) == Released::Stuck,
        };
        if stays {
            held.swap(kept, i);
            kept += 1;
        } else {
            let bytes = std::mem::take(&mut held[i].bytes);
            let _ = with(|h| h.recycle(bytes));
        }
    }
    held.truncate(kept);
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
    let mut waited = None;
    release_where(
        &mut |f, c, _| {
            ((f, c) == (fd, conn))
                .then(|| waited.get_or_insert_with(|| engine.wait_output()).clone())
        },
        on_fail,
    );
    let alive = crate::fdtable::slot(fd)
        .is_some_and(|s| s.conn() == conn && s.state() & crate::fdtable::FAILED == 0);
    if !alive || matches!(waited, Some(Err(_))) {
        Released::Failed
    } else if holds(fd, conn) {
        Released::Stuck
    } else {
        Released::Sent
    }
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
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    const M: (u64, u64) = (1, 1);

    #[test]
    fn a_connection_holds_up_to_its_bound_in_order() {
        assert!(!holds(7, 1));
        assert!(hold(7, 1, &[b"ab", b"c"], M));
        assert!(hold(7, 1, &[b"de"], M));
        assert!(holds(7, 1));
        assert!(
            !holds(7, 2),
            "another connection on a reused fd holds nothing"
        );
        let held = with(|h| h.held[0].bytes.clone()).unwrap();
        assert_eq!(held, b"abcde");
        seal();
        let rest = vec![0u8; HOLD_MAX - 6];
        assert!(hold(7, 1, &[&rest], M), "a later turn's output goes behind");
        assert_eq!(with(|h| h.held.len()).unwrap(), 2, "in an entry of its own");
        assert!(hold(7, 1, &[b"x"], M), "exactly the bound fits");
        assert!(!hold(7, 1, &[b"y"], M), "one byte more does not");
        assert_eq!(with(|h| h.held[1].bytes.len()).unwrap(), HOLD_MAX - 5);
        let too_big = vec![0u8; HOLD_MAX + 1];
        assert!(
            !hold(8, 1, &[&too_big], M),
            "a reply over the bound is never held"
        );
        assert!(!holds(8, 1));
    }

    /// A client connection's socket pair, tracked as connection `conn`.
    fn client(conn: u64) -> (UnixStream, UnixStream) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        theirs.set_nonblocking(true).unwrap();
        crate::fdtable::slot(ours.as_raw_fd())
            .unwrap()
            .set_client(conn, 1);
        (ours, theirs)
    }

    fn received(s: &mut UnixStream) -> Vec<u8> {
        let mut buf = [0u8; 256];
        match s.read(&mut buf) {
            Ok(n) => buf[..n].to_vec(),
            Err(_) => Vec::new(),
        }
    }

    #[test]
    fn committed_output_leaves_without_a_wait_and_never_ahead_of_its_connection() {
        let (a, mut a_peer) = client(11);
        let (b, mut b_peer) = client(12);
        let (fa, fb) = (a.as_raw_fd(), b.as_raw_fd());
        assert!(hold(fa, 11, &[b"a1"], (5, 1)));
        assert!(hold(fb, 12, &[b"b1"], (6, 1)));
        seal();
        assert!(hold(fa, 11, &[b"a2"], (9, 1)));
        let mut fails = 0;
        let mut on_fail = |_: i32, _: u64, _: &Fail| fails += 1;

        // Only seq 9 is decided: a2 must not pass a1, b1 waits.
        let stays = release_committed(&mut |m| (m.0 == 9).then_some(Ok(())), &mut on_fail);
        assert!(stays);
        assert!(received(&mut a_peer).is_empty(), "a2 went out ahead of a1");
        assert!(received(&mut b_peer).is_empty());

        // Up to seq 6 committed: a1 and b1 leave, a2 stays.
        let stays = release_committed(&mut |m| (m.0 <= 6).then_some(Ok(())), &mut on_fail);
        assert!(stays);
        assert_eq!(received(&mut a_peer), b"a1");
        assert_eq!(received(&mut b_peer), b"b1");
        assert!(holds(fa, 11) && !holds(fb, 12));

        // One wait for the rest.
        let mut waits = 0;
        release_all(
            &mut || {
                waits += 1;
                Ok(())
            },
            &mut on_fail,
        );
        assert_eq!(waits, 1);
        assert_eq!(received(&mut a_peer), b"a2");
        assert!(!any());
        assert_eq!(fails, 0);
        crate::fdtable::slot(fa).unwrap().clear();
        crate::fdtable::slot(fb).unwrap().clear();
    }

    #[test]
    fn a_failed_commit_drops_the_output_and_resets_its_connection() {
        let (a, mut a_peer) = client(21);
        let fa = a.as_raw_fd();
        assert!(hold(fa, 21, &[b"lost"], (3, 2)));
        let mut failed = Vec::new();
        let mut on_fail = |fd: i32, conn: u64, _: &Fail| failed.push((fd, conn));
        let stays = release_committed(
            &mut |_| Some(Err(Fail::Lost("this node is no longer the leader"))),
            &mut on_fail,
        );
        assert!(!stays);
        assert_eq!(failed, vec![(fa, 21)]);
        assert!(received(&mut a_peer).is_empty());
        crate::fdtable::slot(fa).unwrap().clear();
    }
}
