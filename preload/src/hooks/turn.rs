//! The server's event-loop turns, as every wait hook (epoll, poll,
//! select) reports them: a turn ends when the server comes to wait, and a
//! new one starts when the wait returns.

use std::ffi::c_int;
use std::sync::atomic::Ordering;

use super::guards::caught;
use super::random::{seed_server_generators, GENERATORS_SEEDED};
use crate::determinism::turns::{Wait, MAX_WIDTH};
use crate::dispatch;
use crate::sys::{errno, set_errno};

/// The server is about to wait in its event loop `loop_id` (0: none
/// named, see `loops`; `max`: epoll's maxevents; `serves`: the wait
/// watches fds of the server's). A
/// `poll`/`select` of a server that runs epoll loops is a wait of a
/// thread's own, not a loop (see `loops::any`).
pub(super) fn event_loop_turn(wait: Wait, max: c_int, serves: bool, loop_id: u64) {
    crate::determinism::stack_depth::waited(crate::determinism::stack_depth::here());
    if !crate::setup::inert() {
        let _ = caught(crate::listeners::before_wait);
    }
    if dispatch::passive_hooked() {
        let e = errno();
        if serves && (wait == Wait::Epoll || !crate::determinism::loops::any()) {
            crate::determinism::clock::on_loop_thread();
        }
        if !GENERATORS_SEEDED.load(Ordering::Relaxed) {
            seed_server_generators();
        }
        let _ = caught(|| dispatch::before_wait(wait, max, loop_id));
        set_errno(e);
    }
}

/// The server's wait in loop `loop_id` returned (`delivers`: reporting
/// replay connections the log has bytes for): a new turn starts (see
/// `clock`). The caller holds a `Reentry`.
pub(super) fn turn_returned(loop_id: u64, delivers: bool) {
    if dispatch::passive_hooked() {
        let e = errno();
        let _ = caught(|| dispatch::after_wait(loop_id, delivers));
        set_errno(e);
    }
}

/// This turn's unread replay connections (server fds), log order.
pub(super) fn unread_fds() -> ([i32; MAX_WIDTH], usize) {
    if !dispatch::passive_hooked() {
        return ([-1; MAX_WIDTH], 0);
    }
    let fds = caught(crate::backup::region_host::unread).unwrap_or([-1; MAX_WIDTH]);
    let n = fds.iter().take_while(|fd| **fd >= 0).count();
    (fds, n)
}
