//! The bodies of the clock hooks: the server's clock reads get the log's
//! time (see `crate::determinism::clock`). Nothing here allocates:
//! jemalloc reads the monotonic clock under its own lock at start-up.

use std::ffi::{c_int, c_void};

use super::guards::caught;
use crate::dispatch;
use crate::reentry::in_hook;
use crate::sys;
use crate::sys::real::{real_clock_gettime, real_gettimeofday, real_time};

/// The log's time for a clock read of the server (see `clock`): None
/// for the preload's own calls, a forked child, or a process that is not
/// a lockstep server (no usable config).
///
/// `counted`: a clock the server's logic reads (not a coarse one): inside
/// a turn of a loop thread it is one of the turn's counted reads (see
/// `turn_time`).
pub(super) fn log_time(counted: bool) -> Option<u64> {
    if in_hook() {
        return None;
    }
    if !dispatch::passive_hooked() && !starting_up() {
        return None;
    }
    let turn_thread = monotonic_is_logged();
    if counted && turn_thread {
        if let Some(us) = caught(dispatch::turn_clock_read).flatten() {
            return Some(us);
        }
    }
    crate::determinism::clock::now_us(turn_thread, sys::monotonic_us)
}

/// Whether this process is a lockstep server that did not attach yet (its
/// start-up: it reads the log's origin). Allocates nothing: jemalloc
/// reads the monotonic clock under its own lock at start-up.
pub(super) fn starting_up() -> bool {
    !crate::setup::inert() && crate::setup::engine().is_none() && crate::setup::may_serve()
}

/// Whether the calling thread's monotonic clocks read the log's time: the
/// server's event loops and its main thread (its start-up arms the
/// timers). Other threads read real monotonic time, which their deadlines
/// and futex waits rely on.
pub(super) fn monotonic_is_logged() -> bool {
    crate::determinism::clock::is_loop_thread() || sys::is_main_thread()
}

/// The body of the interposed `clock_gettime(2)`: the wall clocks read the log's time,
/// and so do the monotonic ones on the server's event-loop and main
/// threads (see `monotonic_is_logged`).
///
/// # Safety
/// Same contract as libc's `clock_gettime`.
pub(super) unsafe fn clock_gettime(clk: libc::clockid_t, ts: *mut libc::timespec) -> c_int {
    let logged = match clk {
        libc::CLOCK_REALTIME => log_time(true),
        libc::CLOCK_REALTIME_COARSE => log_time(false),
        libc::CLOCK_MONOTONIC | libc::CLOCK_MONOTONIC_RAW | libc::CLOCK_BOOTTIME => {
            log_time(true).filter(|_| monotonic_is_logged())
        }
        libc::CLOCK_MONOTONIC_COARSE => log_time(false).filter(|_| monotonic_is_logged()),
        _ => None,
    };
    if !ts.is_null() {
        if let Some(us) = logged {
            let (s, u) = crate::determinism::clock::split_us(us);
            // SAFETY: `ts` is the caller's non-null timespec.
            unsafe {
                (*ts).tv_sec = s as libc::time_t;
                (*ts).tv_nsec = (u * 1000) as libc::c_long;
            }
            return 0;
        }
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real_clock_gettime(clk, ts) }
}

/// The body of the interposed `gettimeofday(2)`: reads the log's time.
///
/// # Safety
/// Same contract as libc's `gettimeofday`.
pub(super) unsafe fn gettimeofday(tv: *mut libc::timeval, tz: *mut c_void) -> c_int {
    // The log's time needs no real read (a leader's turn reads the real
    // clock itself, a backup's reads the log): Redis reads the clock a few
    // times per command, and this second read was 4-5% of a 16-core
    // leader's CPU under `SET -P 16` (perf). Only a time zone asked for
    // needs the real call first.
    if !tv.is_null() && tz.is_null() {
        if let Some(us) = log_time(true) {
            // SAFETY: `tv` is the caller's non-null timeval.
            unsafe { set_timeval(tv, us) };
            return 0;
        }
    }
    // SAFETY: forwarding the caller's arguments (the time zone, if asked).
    let r = unsafe { real_gettimeofday(tv, tz) };
    if r == 0 && !tv.is_null() && !tz.is_null() {
        if let Some(us) = log_time(true) {
            // SAFETY: `tv` is the caller's non-null timeval.
            unsafe { set_timeval(tv, us) };
        }
    }
    r
}

/// Writes `us` (µs since the epoch) into `tv`.
///
/// # Safety
/// `tv` points to a writable timeval.
unsafe fn set_timeval(tv: *mut libc::timeval, us: u64) {
    let (s, u) = crate::determinism::clock::split_us(us);
    // SAFETY: the caller's contract.
    unsafe {
        (*tv).tv_sec = s as libc::time_t;
        (*tv).tv_usec = u as libc::suseconds_t;
    }
}

/// The body of the interposed `time(2)`: reads the log's time.
///
/// # Safety
/// Same contract as libc's `time`.
pub(super) unsafe fn time(t: *mut libc::time_t) -> libc::time_t {
    let Some(us) = log_time(true) else {
        // SAFETY: forwarding the caller's argument.
        return unsafe { real_time(t) };
    };
    let s = crate::determinism::clock::split_us(us).0 as libc::time_t;
    if !t.is_null() {
        // SAFETY: a non-null `t` is the caller's time_t.
        unsafe { *t = s };
    }
    s
}
