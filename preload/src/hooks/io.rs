//! The bodies of the data hooks: every recv-type call (`input`) and every
//! send-type call (`output`) on an fd the table tracks.

use std::ffi::c_int;

use libc::ssize_t;

use super::bufs::{fill, with_segments, Bufs};
use super::guards::{caught, finish};
use crate::backup::region_host::Served;
use crate::dispatch::{self, Before};
use crate::reentry::Reentry;
use crate::sys::{errno, set_errno};

/// The filter every data hook starts with: `None` (call the real function
/// at once) for an fd the table does not track, or inside another hook on
/// this thread; else the re-entry guard and the buffers, a msghdr's
/// iovecs read before the real call.
///
/// # Safety
/// A `Bufs::Msg` must point to a valid msghdr.
pub(super) unsafe fn enter_tracked(fd: c_int, bufs: Bufs) -> Option<(Reentry, Bufs)> {
    if !dispatch::tracked(fd) {
        return None;
    }
    let reentry = Reentry::enter()?;
    // SAFETY: per the contract.
    Some((reentry, unsafe { bufs.resolved() }))
}

/// The body of every recv-type hook: an fd the table does not track goes
/// straight to `real` (the cheap filter); otherwise `dispatch` decides
/// before and after the real call.
///
/// # Safety
/// `bufs` must describe the buffers `real` fills (as the caller of the
/// hooked function passed them).
pub(super) unsafe fn input(
    fd: c_int,
    flags: c_int,
    bufs: Bufs,
    real: impl FnOnce() -> ssize_t,
) -> ssize_t {
    // SAFETY: per the contract.
    let Some((_reentry, bufs)) = (unsafe { enter_tracked(fd, bufs) }) else {
        return real();
    };
    let _reading =
        crate::determinism::stack_depth::reading(crate::determinism::stack_depth::here());
    // SAFETY: per the contract.
    let want = unsafe { bufs.total() };
    let before = caught(|| dispatch::before_input(fd, want, flags))
        .unwrap_or_else(|| Before::Return(dispatch::internal_error(fd)));
    let ticket = match before {
        Before::Pass => return real(),
        Before::Return(r) => return finish(r, errno()),
        Before::Serve { conn, peek } => {
            let served = caught(|| {
                // SAFETY: per the contract, `bufs` are the caller's buffers
                // for the bytes a read returns.
                crate::backup::region_host::serve(conn, peek, &mut |src| unsafe { fill(bufs, src) })
            });
            return match served {
                Some(Served::Bytes(n)) => n as ssize_t,
                Some(Served::Eof) => 0,
                Some(Served::Empty) | None => {
                    set_errno(libc::EAGAIN);
                    -1
                }
            };
        }
        Before::Go(t) => t,
    };
    let n = real();
    let e = errno();
    let got = if n > 0 { n as usize } else { 0 };
    let r = caught(|| {
        // SAFETY: the real call filled `got` bytes into `bufs`.
        unsafe { with_segments(bufs, got, |segs| dispatch::after_input(ticket, n, e, segs)) }
    })
    .unwrap_or_else(|| dispatch::internal_error(fd));
    finish(r, e)
}

/// The body of every send-type hook: output to a tracked fd waits for the
/// commit (output mode) and feeds its digest; anything else goes straight
/// to `real`.
///
/// # Safety
/// `bufs` must describe the buffers `real` sends from.
pub(super) unsafe fn output(fd: c_int, bufs: Bufs, real: impl FnOnce() -> ssize_t) -> ssize_t {
    // SAFETY: per the contract.
    let Some((_reentry, bufs)) = (unsafe { enter_tracked(fd, bufs) }) else {
        return real();
    };
    if dispatch::is_replay(fd) {
        // A replay connection's output goes nowhere: only its digest is
        // kept, and the server never blocks on it.
        // SAFETY: per the contract, `bufs` holds the bytes to send.
        let total = unsafe { bufs.total() };
        let sent = caught(|| {
            // SAFETY: the caller's buffers hold `total` bytes to send.
            unsafe { with_segments(bufs, total, |segs| dispatch::replay_output(fd, segs)) }
        });
        if let Some(Some(n)) = sent {
            return n as ssize_t;
        }
    }
    // Output commit: nothing leaves for a client before the inputs it may
    // depend on are committed: held until the turn's end, or waited for.
    // A panic deciding fails the connection rather than release an
    // output unchecked.
    // SAFETY: per the contract, `bufs` holds the bytes to send.
    let total = unsafe { bufs.total() };
    let decided = caught(|| {
        // SAFETY: the caller's buffers hold `total` bytes to send.
        unsafe { with_segments(bufs, total, |segs| dispatch::before_output(fd, segs)) }
    })
    .unwrap_or_else(|| Some(dispatch::internal_error(fd)));
    if let Some(r) = decided {
        return finish(r, errno());
    }
    let n = real();
    let e = errno();
    if n >= 0 || e == libc::EAGAIN || e == libc::EWOULDBLOCK {
        // A panic here only loses digest bytes; the divergence check
        // reports it, the server is unaffected.
        let sent = n.max(0) as usize;
        let _ = caught(|| {
            // SAFETY: the real call sent `sent` bytes from `bufs`.
            unsafe { with_segments(bufs, sent, |segs| dispatch::after_output(fd, segs)) }
        });
        set_errno(e);
    }
    n
}
