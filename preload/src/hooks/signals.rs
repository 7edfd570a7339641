//! The bodies of the signal hooks: a server's SIGTERM/SIGINT handler is
//! relayed, so the preload notes the stop first (see
//! `crate::determinism::clock`).

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::reentry::in_hook;
use crate::sys::real::{real_sigaction, real_signal};

/// The server's own handlers of the stop signals, by signal number (the
/// preload's relay runs first; see `clock::stop_signalled`).
pub(super) static STOP_HANDLERS: [AtomicUsize; 32] = [const { AtomicUsize::new(0) }; 32];

/// Whether `sig` stops a server (its handler is relayed).
pub(super) fn is_stop_signal(sig: c_int) -> bool {
    sig == libc::SIGTERM || sig == libc::SIGINT
}

/// Whether `h` is a handler function (not SIG_DFL, SIG_IGN or SIG_ERR).
pub(super) fn is_function(h: libc::sighandler_t) -> bool {
    h != libc::SIG_DFL && h != libc::SIG_IGN && h != libc::SIG_ERR
}

extern "C" fn relay_stop(sig: c_int) {
    crate::determinism::clock::stop_signalled();
    let h = STOP_HANDLERS[sig as usize & 31].load(Ordering::Acquire);
    if is_function(h) {
        // SAFETY: `h` is the server's own plain handler for `sig`.
        let f: extern "C" fn(c_int) = unsafe { std::mem::transmute(h) };
        f(sig);
    }
}

extern "C" fn relay_stop_info(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    crate::determinism::clock::stop_signalled();
    let h = STOP_HANDLERS[sig as usize & 31].load(Ordering::Acquire);
    if is_function(h) {
        // SAFETY: `h` is the server's own SA_SIGINFO handler for `sig`,
        // called with the kernel's arguments.
        let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) =
            unsafe { std::mem::transmute(h) };
        f(sig, info, ctx);
    }
}

/// The relay standing in for handler `h`, recorded as the server's.
pub(super) fn relay_for(sig: c_int, h: libc::sighandler_t, siginfo: bool) -> libc::sighandler_t {
    STOP_HANDLERS[sig as usize & 31].store(h, Ordering::Release);
    if siginfo {
        relay_stop_info as *const () as libc::sighandler_t
    } else {
        relay_stop as *const () as libc::sighandler_t
    }
}

/// What the server set as `sig`'s handler, where `h` may be a relay.
pub(super) fn unrelayed(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t {
    if h == relay_stop as *const () as libc::sighandler_t
        || h == relay_stop_info as *const () as libc::sighandler_t
    {
        STOP_HANDLERS[sig as usize & 31].load(Ordering::Acquire)
    } else {
        h
    }
}

/// The body of the interposed `sigaction(2)`: a server's SIGTERM/SIGINT handler runs after
/// the preload notes the stop (its clock then runs free: see `clock`).
///
/// # Safety
/// Same contract as libc's `sigaction`.
pub(super) unsafe fn sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    let mut mine = None;
    if is_stop_signal(sig) && !act.is_null() && !in_hook() {
        // SAFETY: a non-null `act` is the caller's valid sigaction.
        let mut a = unsafe { *act };
        if is_function(a.sa_sigaction) {
            a.sa_sigaction = relay_for(sig, a.sa_sigaction, a.sa_flags & libc::SA_SIGINFO != 0);
            mine = Some(a);
        }
    }
    let act = mine.as_ref().map_or(act, |a| a as *const libc::sigaction);
    // SAFETY: forwarding the caller's arguments (or our copy of `act`).
    let r = unsafe { real_sigaction(sig, act, old) };
    if r == 0 && !old.is_null() && is_stop_signal(sig) {
        // SAFETY: the kernel filled the caller's `old`.
        unsafe { (*old).sa_sigaction = unrelayed(sig, (*old).sa_sigaction) };
    }
    r
}

/// The body of the interposed `signal(3)`: as `sigaction` (glibc's `signal` does not go
/// through the exported `sigaction`).
///
/// # Safety
/// Same contract as libc's `signal`.
pub(super) unsafe fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    let relayed = is_stop_signal(sig) && is_function(handler) && !in_hook();
    let h = if relayed {
        relay_for(sig, handler, false)
    } else {
        handler
    };
    // SAFETY: forwarding the caller's arguments (or the relay).
    let prev = unsafe { real_signal(sig, h) };
    if is_stop_signal(sig) {
        unrelayed(sig, prev)
    } else {
        prev
    }
}
