//! The bodies of the epoll hooks: a backup's waits deliver the log's
//! replay connections first; `epoll_ctl` and `epoll_create` are observed.

use std::ffi::c_int;

use super::guards::{caught, KeptErrno};
use super::turn::{event_loop_turn, turn_returned};
use crate::determinism::turns::{Wait, MAX_WIDTH};
use crate::dispatch;
use crate::reentry::{in_hook, Reentry};
use crate::sys::real::real_epoll_ctl;

/// An epoll wait on a backup: the replay connections the log has bytes
/// for are readable (first, in log order) and the wait does not block;
/// the kernel's other events follow. `real(max, timeout)` waits.
///
/// # Safety
/// `ev` must be the caller's buffer of `max` events.
pub(super) unsafe fn epoll_turn(
    epfd: c_int,
    ev: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
    mut real: impl FnMut(c_int, c_int) -> c_int,
) -> c_int {
    // The preload's work below reads real clocks, and its own calls pass.
    let Some(_reentry) = Reentry::enter() else {
        return real(max, timeout);
    };
    let loop_id = crate::determinism::loops::of_epfd(epfd);
    event_loop_turn(Wait::Epoll, max, loop_id != 0, loop_id);
    if !dispatch::passive_hooked() || ev.is_null() || max <= 0 {
        let n = probed(timeout, |t| real(max, t));
        let _errno = KeptErrno::now();
        // SAFETY: `ev` is the caller's buffer of `max` events, of which
        // the kernel filled the first `n`.
        let n = unsafe { without_alarm(epfd, ev, n) };
        turn_returned(loop_id, false);
        return n;
    }
    let (mut keys, mut k) =
        caught(|| crate::backup::region_host::epoll_unread(epfd)).unwrap_or(([0; MAX_WIDTH], 0));
    // A TICK of this loop is due: this wait is its turn.
    let mut tick = caught(|| crate::backup::region_host::must_not_block(loop_id)).unwrap_or(false);
    if k == 0
        && !tick
        && timeout == 0
        && loop_id != 0
        && caught(|| crate::backup::region_host::await_turn(loop_id)) == Some(true)
    {
        // A timer of the server's is due: not before its turn is here.
        (keys, k) = caught(|| crate::backup::region_host::epoll_unread(epfd))
            .unwrap_or(([0; MAX_WIDTH], 0));
        tick = caught(|| crate::backup::region_host::must_not_block(loop_id)).unwrap_or(false);
    }
    let k = k.min(max as usize);
    let n = match k {
        0 => probed(
            caught(|| crate::dispatch::wait_timeout(tick, timeout)).unwrap_or(timeout),
            |t| real(max, t),
        ),
        // No room left for the kernel's events: they wait for the next
        // call (a level-triggered fd is reported again).
        k if k == max as usize => 0,
        k => real(max - k as c_int, 0),
    };
    let _errno = KeptErrno::now();
    // SAFETY: the kernel filled the first `n` events of the caller's
    // buffer.
    let n = unsafe { without_alarm(epfd, ev, n) };
    turn_returned(loop_id, k > 0);
    let bell = caught(|| {
        crate::backup::region_host::after_wait(|fd| {
            crate::fdtable::slot(fd).is_some_and(|s| s.wait_epfd() == epfd)
        })
    })
    .flatten();
    if n < 0 && k == 0 {
        return n;
    }
    let real_n = n.max(0) as usize;
    let bell_key = bell.and_then(crate::fdtable::slot).map(|s| s.wait_key());
    if k == 0 && bell_key.is_none() {
        return n;
    }
    for i in real_n..real_n + k {
        // SAFETY: `i` < real_n + k <= max: inside the caller's buffer.
        unsafe { ev.add(i).write(libc::epoll_event { events: 0, u64: 0 }) };
    }
    // SAFETY: the first `real_n` events were filled by the kernel and the
    // next `k` just now, all inside the caller's buffer of `max`.
    let events = unsafe { std::slice::from_raw_parts_mut(ev, real_n + k) };
    let kernel_first = caught(crate::backup::region_host::kernel_first).unwrap_or(false);
    caught(|| {
        crate::backup::region_host::merge_events(events, real_n, &keys[..k], bell_key, kernel_first)
    })
    .map_or(n, |m| m as c_int)
}

/// The `n` events a real wait put into `ev`, less the preload's alarm
/// (spent here): returns how many are left. Every path that hands the
/// kernel's events to the server goes through this, attached or not: a
/// wait that began before the preload attached (a server started before
/// its follower) can return an alarm rung just after, and the server
/// would take its key for one of its own (Redis indexed its fd table with
/// it and crashed).
///
/// # Safety
/// When `n > 0`, `ev` must point to at least `n` initialised events.
unsafe fn without_alarm(epfd: c_int, ev: *mut libc::epoll_event, n: c_int) -> c_int {
    if n <= 0 || ev.is_null() {
        return n;
    }
    // SAFETY: the caller's contract: `n` initialised events at `ev`.
    let got = unsafe { std::slice::from_raw_parts_mut(ev, n as usize) };
    let kept = crate::determinism::loops::without_alarm(got);
    if kept < got.len() {
        crate::determinism::loops::silence(epfd);
    }
    kept as c_int
}

/// Waits `timeout` with `wait(timeout)`, a leader's loop looking without
/// blocking first when its last turn's end is not logged yet (see
/// `dispatch::closing_probe`).
fn probed(timeout: c_int, mut wait: impl FnMut(c_int) -> c_int) -> c_int {
    match caught(|| dispatch::closing_probe(timeout, || wait(0))).flatten() {
        Some(n) => n,
        None => wait(timeout),
    }
}

/// The body of the interposed `epoll_ctl(2)`: observed, not changed —
/// whether the server wants to write more to a replay connection (a reply
/// it sends in several turns) tells a backup's pump that the reply is not
/// complete; to a leader's client, that its digest may cover less than a
/// backup's server writes (see `Slot::note_write_interest`).
///
/// # Safety
/// Same contract as libc's `epoll_ctl`.
pub(super) unsafe fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: *mut libc::epoll_event,
) -> c_int {
    if dispatch::tracked(fd) {
        // Whether the server waits to write more to it (a reply it sends
        // over several turns, or holds back).
        let wants = op != libc::EPOLL_CTL_DEL
            && !ev.is_null()
            // SAFETY: a non-null event of EPOLL_CTL_ADD/MOD is the caller's
            // valid epoll_event.
            && unsafe { (*ev).events } & libc::EPOLLOUT as u32 != 0;
        if dispatch::is_replay(fd) {
            if op != libc::EPOLL_CTL_DEL && !ev.is_null() {
                // SAFETY: a non-null event of EPOLL_CTL_ADD/MOD is the
                // caller's valid epoll_event; packed fields are read by
                // copy.
                let (key, events) = unsafe { ((*ev).u64, (*ev).events) };
                let reads = events & libc::EPOLLIN as u32 != 0;
                let _ = caught(|| dispatch::wait_key(fd, epfd, key, reads));
            } else if op == libc::EPOLL_CTL_DEL {
                let _ = caught(|| dispatch::wait_key(fd, -1, 0, false));
            }
        }
        let _ = caught(|| dispatch::write_interest(fd, wants));
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real_epoll_ctl(epfd, op, fd, ev) }
}

/// Names the server's new epoll instance `fd` (not the preload's own).
pub(super) fn epoll_created(fd: c_int) {
    if fd >= 0 && !in_hook() {
        crate::determinism::loops::created(fd);
    }
}

/// The common body of epoll_create and epoll_create1: `real()` creates
/// the instance, which names an event loop of the server's.
pub(super) fn create(real: impl FnOnce() -> c_int) -> c_int {
    let fd = real();
    epoll_created(fd);
    fd
}
