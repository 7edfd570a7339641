//! The bodies of the poll and select hooks (waits that scan a set of
//! fds): as an epoll wait, a backup's replay connections are readable
//! exactly when the log has bytes for them.

use std::ffi::c_int;

use super::guards::{caught, KeptErrno};
use super::turn::{event_loop_turn, turn_returned, unread_fds};
use crate::determinism::turns::Wait;
use crate::dispatch;
use crate::reentry::Reentry;

/// Whether a `ppoll`/`pselect` timeout asks not to block (null: block).
///
/// # Safety
/// `t` must be null or point to a valid timespec.
pub(super) unsafe fn is_zero_timespec(t: *const libc::timespec) -> bool {
    // SAFETY: per the contract.
    !t.is_null() && unsafe { (*t).tv_sec == 0 && (*t).tv_nsec == 0 }
}

/// Whether a `select` timeout asks not to block (null: block).
///
/// # Safety
/// `t` must be null or point to a valid timeval.
pub(super) unsafe fn is_zero_timeval(t: *const libc::timeval) -> bool {
    // SAFETY: per the contract.
    !t.is_null() && unsafe { (*t).tv_sec == 0 && (*t).tv_usec == 0 }
}

/// The log's readiness over a poll set (see `epoll_turn`): whether any
/// entry waits to read a replay connection the log has bytes for.
///
/// # Safety
/// `fds` must point to `n` valid pollfds (or be null with `n` 0).
pub(super) unsafe fn poll_unread(
    fds: *const libc::pollfd,
    n: libc::nfds_t,
    unread: &[i32],
) -> bool {
    if fds.is_null() || n == 0 || unread.is_empty() {
        return false;
    }
    // SAFETY: per the contract.
    let set = unsafe { std::slice::from_raw_parts(fds, n as usize) };
    set.iter()
        .any(|p| p.events & libc::POLLIN != 0 && unread.contains(&p.fd))
}

/// After a poll on a backup: replay connections are readable exactly when
/// the log has bytes for them (the bell's readiness is dropped). Returns
/// the new count.
///
/// # Safety
/// As `poll_unread`, writable.
pub(super) unsafe fn poll_merge(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    r: c_int,
    unread: &[i32],
    bell: Option<i32>,
) -> c_int {
    if fds.is_null() || n == 0 || (unread.is_empty() && bell.is_none()) {
        return r;
    }
    // SAFETY: per the contract.
    let set = unsafe { std::slice::from_raw_parts_mut(fds, n as usize) };
    if r < 0 {
        for p in set.iter_mut() {
            p.revents = 0;
        }
    }
    for p in set.iter_mut() {
        if Some(p.fd) == bell {
            p.revents &= !(libc::POLLIN | libc::POLLRDNORM);
        }
        if p.events & libc::POLLIN != 0 && unread.contains(&p.fd) {
            p.revents |= libc::POLLIN;
        }
    }
    let ready = set.iter().filter(|p| p.revents != 0).count() as c_int;
    if r < 0 && ready == 0 {
        r
    } else {
        ready
    }
}

/// Takes the bell out when it rang on an fd of this poll set.
///
/// # Safety
/// `fds` must point to `n` valid pollfds (or be null with `n` 0).
pub(super) unsafe fn poll_bell(fds: *const libc::pollfd, n: libc::nfds_t) -> Option<i32> {
    if fds.is_null() || n == 0 {
        return None;
    }
    // SAFETY: per the contract.
    let set = unsafe { std::slice::from_raw_parts(fds, n as usize) };
    caught(|| crate::backup::region_host::after_wait(|fd| set.iter().any(|p| p.fd == fd))).flatten()
}

/// Whether a poll set watches a connection or listener of the server's
/// (then the thread runs the server's event loop; the preload's own
/// threads poll only sockets of their own).
///
/// # Safety
/// `fds` must point to `n` valid pollfds (or be null with `n` 0).
pub(super) unsafe fn poll_serves(fds: *const libc::pollfd, n: libc::nfds_t) -> bool {
    if fds.is_null() || n == 0 {
        return false;
    }
    // SAFETY: per the contract.
    let set = unsafe { std::slice::from_raw_parts(fds, n as usize) };
    set.iter().any(|p| dispatch::known(p.fd))
}

/// As `poll_serves`, for a select read set.
///
/// # Safety
/// `r` must be null or a valid fd_set covering fds below `n`.
pub(super) unsafe fn select_serves(n: c_int, r: *const libc::fd_set) -> bool {
    // SAFETY: per the contract; FD_ISSET only reads.
    !r.is_null()
        && (0..n.min(libc::FD_SETSIZE as c_int))
            .any(|fd| unsafe { libc::FD_ISSET(fd, r) } && dispatch::known(fd))
}

#[allow(clippy::too_many_arguments)]
/// After a select on a backup: as `poll_merge`, over the read set the
/// caller passed (`asked`). Returns the new count.
///
/// # Safety
/// The sets must be null or valid fd_sets covering fds below `n`.
unsafe fn select_merge(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    ret: c_int,
    asked: &libc::fd_set,
    unread: &[i32],
    bell: Option<i32>,
) -> c_int {
    if r.is_null() || (unread.is_empty() && bell.is_none()) {
        return ret;
    }
    let n = n.clamp(0, libc::FD_SETSIZE as c_int);
    // SAFETY: per the contract; FD_* only touch bits below FD_SETSIZE.
    unsafe {
        if ret < 0 {
            libc::FD_ZERO(r);
            for s in [w, e] {
                if !s.is_null() {
                    libc::FD_ZERO(s);
                }
            }
        }
        if let Some(b) = bell.filter(|b| *b < n) {
            libc::FD_CLR(b, r);
        }
        for fd in unread.iter().copied().filter(|fd| *fd < n) {
            if libc::FD_ISSET(fd, asked) {
                libc::FD_SET(fd, r);
            }
        }
        let mut ready = 0;
        for s in [r, w, e] {
            if s.is_null() {
                continue;
            }
            for fd in 0..n {
                if libc::FD_ISSET(fd, s) {
                    ready += 1;
                }
            }
        }
        if ret < 0 && ready == 0 {
            ret
        } else {
            ready
        }
    }
}

/// Whether a select read set asks for one of `unread`.
///
/// # Safety
/// `r` must be null or a valid fd_set covering fds below `n`.
pub(super) unsafe fn select_unread(n: c_int, r: *const libc::fd_set, unread: &[i32]) -> bool {
    // SAFETY: per the contract; FD_ISSET only reads.
    !r.is_null()
        && unread
            .iter()
            .any(|fd| *fd < n && unsafe { libc::FD_ISSET(*fd, r) })
}

/// Reports which connections (replay connections, clients) a poll set
/// waits to write to.
///
/// # Safety
/// `fds` must point to `n` valid pollfds (or be null with `n` 0).
pub(super) unsafe fn poll_interest(fds: *const libc::pollfd, n: libc::nfds_t) {
    if fds.is_null() || n == 0 || !dispatch::passive_hooked() {
        return;
    }
    // SAFETY: per the contract.
    let set = unsafe { std::slice::from_raw_parts(fds, n as usize) };
    for p in set {
        if dispatch::tracked(p.fd) {
            let _ = caught(|| dispatch::write_interest(p.fd, p.events & libc::POLLOUT != 0));
        }
    }
}

/// Reports which connections (replay connections, clients) a select
/// write set waits on.
///
/// # Safety
/// `w` must be null or a valid fd_set covering fds below `n`.
pub(super) unsafe fn select_interest(n: c_int, w: *const libc::fd_set) {
    if !dispatch::passive_hooked() {
        return;
    }
    for fd in 0..n.clamp(0, libc::FD_SETSIZE as c_int) {
        if dispatch::tracked(fd) {
            // SAFETY: per the contract; FD_ISSET only reads the set.
            let wants = !w.is_null() && unsafe { libc::FD_ISSET(fd, w) };
            let _ = caught(|| dispatch::write_interest(fd, wants));
        }
    }
}

/// What a backup's scan wait has to deliver: the replay connections the
/// log has bytes for, and whether a `TICK` makes this wait its turn. A
/// wait of the server's loop that asks not to block (`awaits`) with
/// nothing to deliver first waits for the log's next turn, as an epoll
/// wait does (see `region_host::await_turn`).
fn turn_news(awaits: bool) -> ([i32; crate::determinism::turns::MAX_WIDTH], usize, bool) {
    let (mut unread, mut k) = unread_fds();
    let mut tick = caught(|| crate::backup::region_host::must_not_block(0)).unwrap_or(false);
    if k == 0
        && !tick
        && awaits
        && caught(|| crate::backup::region_host::await_turn(0)) == Some(true)
    {
        (unread, k) = unread_fds();
        tick = caught(|| crate::backup::region_host::must_not_block(0)).unwrap_or(false);
    }
    (unread, k, tick)
}

/// The body of the poll hooks: the server's turn ends, and on a backup
/// the replay connections the log has bytes for are readable (see
/// `epoll_turn`). `zero_timeout`: the caller asked not to block.
/// `real(at_once)` polls, with a zero timeout when `at_once`.
///
/// # Safety
/// `fds` must point to `n` valid pollfds (or be null with `n` 0).
pub(super) unsafe fn poll_turn(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    zero_timeout: bool,
    real: impl FnOnce(bool) -> c_int,
) -> c_int {
    let Some(_reentry) = Reentry::enter() else {
        return real(false);
    };
    // SAFETY: per the contract.
    unsafe { poll_interest(fds, n) };
    // SAFETY: per the contract.
    let serves = unsafe { poll_serves(fds, n) };
    event_loop_turn(Wait::Scan, 0, serves, 0);
    let (unread, k, tick) = turn_news(serves && zero_timeout);
    // SAFETY: per the contract.
    let r = real(tick || unsafe { poll_unread(fds, n, &unread[..k]) });
    let _errno = KeptErrno::now();
    turn_returned(0, k > 0);
    // SAFETY: per the contract.
    let bell = unsafe { poll_bell(fds, n) };
    // SAFETY: per the contract.
    unsafe { poll_merge(fds, n, r, &unread[..k], bell) }
}

/// The body of the select hooks: as `poll_turn`, over the read set.
///
/// # Safety
/// The sets must be null or valid fd_sets covering fds below `n`.
pub(super) unsafe fn select_turn(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    zero_timeout: bool,
    real: impl FnOnce(bool) -> c_int,
) -> c_int {
    let Some(_reentry) = Reentry::enter() else {
        return real(false);
    };
    // SAFETY: per the contract.
    unsafe { select_interest(n, w) };
    // SAFETY: per the contract.
    let serves = unsafe { select_serves(n, r) };
    event_loop_turn(Wait::Scan, 0, serves, 0);
    let (unread, k, tick) = turn_news(serves && zero_timeout);
    let asked = if r.is_null() {
        None
    } else {
        // SAFETY: per the contract; the read set is copied: select
        // rewrites it.
        Some(unsafe { *r })
    };
    // SAFETY: per the contract.
    let ret = real(tick || unsafe { select_unread(n, r, &unread[..k]) });
    let _errno = KeptErrno::now();
    turn_returned(0, k > 0);
    let bell = caught(|| {
        crate::backup::region_host::after_wait(|fd| {
            // SAFETY: `a` is our copy of the caller's read set.
            asked
                .as_ref()
                .is_some_and(|a| fd < n && unsafe { libc::FD_ISSET(fd, a) })
        })
    })
    .flatten();
    match asked {
        // SAFETY: per the contract.
        Some(asked) => unsafe { select_merge(n, r, w, e, ret, &asked, &unread[..k], bell) },
        None => ret,
    }
}
