//! The bodies of the hooks that make, end or replace a client's fd:
//! accept, listen, close, shutdown, dup2/dup3.

use std::ffi::c_int;

use libc::{sockaddr, socklen_t};

use super::guards::{caught, finish};
use crate::dispatch;
use crate::reentry::Reentry;
use crate::sys::real::{real_close, real_listen, real_shutdown};
use crate::sys::{errno, set_errno};

/// The common body of accept and accept4: `real(fd, addr, len)` accepts
/// (possibly several times, with `*len` restored each time).
///
/// # Safety
/// `addr`/`len` as for accept(2).
pub(super) unsafe fn accept(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    real: impl Fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int,
) -> c_int {
    if !dispatch::accept_hooked() {
        return real(fd, addr, len);
    }
    let Some(_reentry) = Reentry::enter() else {
        return real(fd, addr, len);
    };
    let orig_len = if len.is_null() {
        0
    } else {
        // SAFETY: the caller passed a valid socklen_t pointer.
        unsafe { *len }
    };
    let mut call = || {
        if !len.is_null() {
            // SAFETY: as above; a retried accept gets the caller's size
            // back, as if it were the first call.
            unsafe { *len = orig_len };
        }
        let c = real(fd, addr, len);
        (c, errno())
    };
    match caught(|| dispatch::accept(fd, &mut call)) {
        Some(r) => finish(r, errno()) as c_int,
        None => {
            set_errno(libc::ECONNABORTED);
            -1
        }
    }
}

/// `fd` is about to be closed (by close, or replaced by dup2/dup3): a
/// client's close is its CLOSE entry.
pub(super) fn before_close(fd: c_int) {
    if dispatch::known(fd) {
        if let Some(_reentry) = Reentry::enter() {
            if caught(|| dispatch::before_close(fd)).is_none() {
                dispatch::forget(fd);
            }
        }
    }
}

/// The body of the interposed `listen(2)`: a listener on the app address attaches the
/// preload to its region early (so the follower sees the server's pid).
///
/// # Safety
/// Same contract as libc's `listen`.
pub(super) unsafe fn listen(fd: c_int, backlog: c_int) -> c_int {
    // SAFETY: forwarding the caller's arguments.
    let r = unsafe { real_listen(fd, backlog) };
    if r == 0 && dispatch::accept_hooked() {
        if let Some(_reentry) = Reentry::enter() {
            let e = errno();
            let _ = caught(|| dispatch::after_listen(fd));
            set_errno(e);
        }
    }
    r
}

/// The body of the interposed `close(2)`: a client's close is its CLOSE entry.
///
/// # Safety
/// Same contract as libc's `close`.
pub(super) unsafe fn close(fd: c_int) -> c_int {
    before_close(fd);
    // SAFETY: forwarding the caller's argument.
    unsafe { real_close(fd) }
}

/// The body of the interposed `shutdown(2)`: SHUT_RD and SHUT_RDWR of a client end its
/// input, which is its CLOSE entry.
///
/// # Safety
/// Same contract as libc's `shutdown`.
pub(super) unsafe fn shutdown(fd: c_int, how: c_int) -> c_int {
    if dispatch::tracked(fd) {
        if let Some(_reentry) = Reentry::enter() {
            let _ = caught(|| dispatch::before_shutdown(fd, how));
        }
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real_shutdown(fd, how) }
}

/// The common body of dup2 and dup3: replacing a tracked fd closes it.
/// `real()` duplicates `old` onto `new`.
pub(super) fn replace(old: c_int, new: c_int, real: impl FnOnce() -> c_int) -> c_int {
    if old != new {
        before_close(new);
    }
    real()
}
