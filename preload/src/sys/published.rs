//! [`Published`]: a value set once and, rarely, replaced by another, read
//! on hot paths as a plain `&'static` without a lock. A replaced value is
//! never freed (a thread may still hold the old reference), so each
//! replacement costs one value's memory for the process's life: meant for
//! things replaced a handful of times at most (the preload's engine, when
//! a restored image takes another node's identity).

use std::sync::atomic::{AtomicPtr, Ordering};

/// See the module documentation.
pub struct Published<T: 'static> {
    ptr: AtomicPtr<T>,
}

impl<T: Sync + 'static> Published<T> {
    /// Nothing published yet.
    pub const fn new() -> Published<T> {
        Published {
            ptr: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// The value published last, if any.
    #[inline]
    pub fn get(&self) -> Option<&'static T> {
        let p = self.ptr.load(Ordering::Acquire);
        // SAFETY: a non-null pointer here came from `Box::leak` in
        // `publish` and is never freed or written through again, so it is
        // valid and immutable for the rest of the process.
        unsafe { p.as_ref() }
    }

    /// Publishes `value` (replacing, not freeing, the one before) and
    /// returns it.
    pub fn publish(&self, value: T) -> &'static T {
        let leaked: &'static mut T = Box::leak(Box::new(value));
        self.ptr.store(leaked, Ordering::Release);
        leaked
    }
}

impl<T: Sync + 'static> Default for Published<T> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_published_value_is_read_and_old_references_stay_valid() {
        static P: Published<String> = Published::new();
        assert!(P.get().is_none());
        let first = P.publish("node 2".into());
        assert_eq!(P.get().map(String::as_str), Some("node 2"));
        P.publish("node 3".into());
        assert_eq!(P.get().map(String::as_str), Some("node 3"));
        assert_eq!(first, "node 2");
    }
}
