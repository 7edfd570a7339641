//! What every hook body wraps its work in: panics caught (never across
//! FFI), errno kept or set as the server must read it.

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use libc::ssize_t;

use crate::dispatch::Ret;
use crate::sys::{errno, set_errno};

/// Puts back, when dropped, the errno a real call left: the preload's
/// work after a server's wait (draining the bell, reading an alarm) must
/// not change what the server reads there (Redis aborts when epoll_wait
/// fails with anything but EINTR, and a SIGCONT or any handled signal
/// makes it fail with EINTR).
pub(super) struct KeptErrno(c_int);

impl KeptErrno {
    pub(super) fn now() -> KeptErrno {
        KeptErrno(errno())
    }
}

impl Drop for KeptErrno {
    fn drop(&mut self) {
        set_errno(self.0);
    }
}

/// Runs `f`, turning a panic into None (the panic message has been
/// printed by the panic hook; the caller fails the connection).
pub(super) fn caught<T>(f: impl FnOnce() -> T) -> Option<T> {
    catch_unwind(AssertUnwindSafe(f)).ok()
}

/// Sets errno as `r` says and returns its value.
pub(super) fn finish(r: Ret, errno_after_call: c_int) -> ssize_t {
    set_errno(r.errno.unwrap_or(errno_after_call));
    r.value as ssize_t
}
