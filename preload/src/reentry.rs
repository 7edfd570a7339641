//! Which threads are inside a hook: a hooked call made from inside
//! another hook on the same thread (the preload's own I/O), or from one of
//! the preload's own threads, passes straight through to the real
//! function.

use std::cell::Cell;

thread_local! {
    /// Set while this thread runs a hook body (for good on the preload's
    /// own threads).
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// Marks this thread as inside a hook until dropped; None when it already
/// is (the preload's own I/O passes through).
pub struct Reentry;

impl Reentry {
    /// Enters a hook body on this thread; None when the thread already is
    /// inside one (or its thread-locals are gone: it is exiting).
    pub fn enter() -> Option<Reentry> {
        let busy = IN_HOOK.try_with(|c| c.replace(true)).unwrap_or(true);
        (!busy).then_some(Reentry)
    }
}

impl Drop for Reentry {
    fn drop(&mut self) {
        let _ = IN_HOOK.try_with(|c| c.set(false));
    }
}

/// Whether this thread is inside a hook body, or is the preload's own
/// (true as well when its thread-locals are gone).
pub fn in_hook() -> bool {
    IN_HOOK.try_with(|c| c.get()).unwrap_or(true)
}

/// Marks the calling thread as the preload's own (the applier): every
/// hooked call it makes passes straight through, as inside a hook.
pub fn own_thread() {
    let _ = IN_HOOK.try_with(|c| c.set(true));
}
