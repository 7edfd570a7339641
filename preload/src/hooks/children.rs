//! The bodies of the interposed `fork` and `waitpid`: forks are counted
//! ([`crate::determinism::forks`]); a poll for ended children (`WNOHANG`)
//! inside a server's turn is one of the turn's counted reads, logged by
//! the leader when it reaped a child and reaped alike on every backup
//! ([`crate::dispatch::poll_children`]). Blocking waits, and polls
//! outside a turn, are the real call.

use std::ffi::c_int;

use std::cell::Cell;

use super::guards::caught;
use crate::reentry::Reentry;
use crate::sys::{errno, set_errno};

/// `fork()`, `real` being libc's: the parent counts the child.
pub(super) fn fork(real: impl Fn() -> libc::pid_t) -> libc::pid_t {
    let pid = real();
    if pid > 0 {
        crate::determinism::forks::forked(pid);
    }
    pid
}

/// `waitpid(pid, status, options)`, `real` being libc's.
pub(super) fn waitpid(
    pid: libc::pid_t,
    status: *mut c_int,
    options: c_int,
    real: impl Fn(libc::pid_t, *mut c_int, c_int) -> libc::pid_t,
) -> libc::pid_t {
    if options & libc::WNOHANG == 0 || !crate::dispatch::passive_hooked() {
        return real(pid, status, options);
    }
    let Some(_reentry) = Reentry::enter() else {
        return real(pid, status, options);
    };
    // The errno the server sees is the real call's (the preload's own
    // work after it may change it).
    let saved = Cell::new(0);
    let mut call = |p: libc::pid_t, o: c_int| {
        let mut st: c_int = 0;
        let r = real(p, &mut st, o);
        saved.set(errno());
        (r, st)
    };
    let polled = caught(|| crate::dispatch::poll_children(pid, options, &mut call)).flatten();
    match polled {
        Some((r, st)) => {
            set_errno(saved.get());
            if r > 0 && !status.is_null() {
                // SAFETY: the caller passed `status` for waitpid to store
                // the child's status in (checked non-null).
                unsafe { *status = st };
            }
            r
        }
        None => real(pid, status, options),
    }
}
