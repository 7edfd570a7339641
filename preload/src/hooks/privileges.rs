//! The body of the interposed user-id changes (`setuid`, `seteuid`,
//! `setreuid`, `setresuid`): a server that drops its privileges after
//! starting (memcached `-u nobody`) could not open the region files later.

use std::ffi::c_int;

use super::guards::caught;
use crate::reentry::Reentry;
use crate::setup;
use crate::sys::{errno, set_errno};

/// Lets the preload open what it will map while the process still may
/// ([`setup::before_privilege_drop`]), then makes the real call.
pub(super) fn before_drop(real: impl FnOnce() -> c_int) -> c_int {
    if let Some(_reentry) = Reentry::enter() {
        let e = errno();
        let _ = caught(setup::before_privilege_drop);
        set_errno(e);
    }
    real()
}
