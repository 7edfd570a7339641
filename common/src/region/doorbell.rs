//! A futex-backed doorbell in a region's control block.
//!
//! One of the region's homes of `unsafe`: the futex calls and the `u32`
//! view of the doorbell word they need.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// A futex-backed doorbell: writers bump it after posting an entry or an
/// ack; pollers that ran out of spinning park on it instead of sleeping a
/// timer's worth.
#[derive(Clone, Copy, Debug)]
pub struct Doorbell<'a> {
    seq: &'a AtomicU64,
    waiters: &'a AtomicU64,
}

impl<'a> Doorbell<'a> {
    /// The doorbell whose counter is `seq` and whose parked waiters are
    /// counted in `waiters` (two words of a region's control block).
    pub(super) fn new(seq: &'a AtomicU64, waiters: &'a AtomicU64) -> Doorbell<'a> {
        Doorbell { seq, waiters }
    }

    fn futex_word(&self) -> &AtomicU32 {
        // SAFETY: the low half of an 8-aligned AtomicU64 on little-endian
        // x86_64/aarch64 is a 4-aligned u32 inside the same live mapping;
        // the futex syscall and this view only touch it atomically.
        unsafe { &*(self.seq as *const AtomicU64 as *const AtomicU32) }
    }

    /// Current doorbell value (pass to [`Doorbell::wait`]).
    pub fn value(&self) -> u32 {
        self.futex_word().load(Ordering::Acquire)
    }

    /// Bumps the doorbell and wakes parked waiters, if any.
    pub fn ring(&self) {
        self.seq.fetch_add(1, Ordering::AcqRel);
        if self.waiters.load(Ordering::SeqCst) != 0 {
            // SAFETY: FUTEX_WAKE on a valid shared-memory u32; no pointer
            // arguments besides the word itself.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.futex_word().as_ptr(),
                    libc::FUTEX_WAKE,
                    i32::MAX,
                    std::ptr::null::<libc::timespec>(),
                );
            }
        }
    }

    /// Parks until the doorbell moves past `seen` or `timeout` passes.
    pub fn wait(&self, seen: u32, timeout: Duration) {
        self.waiters.fetch_add(1, Ordering::SeqCst);
        if self.value() == seen {
            let ts = libc::timespec {
                tv_sec: timeout.as_secs() as libc::time_t,
                tv_nsec: timeout.subsec_nanos() as libc::c_long,
            };
            // SAFETY: FUTEX_WAIT on a valid shared u32 with a stack timespec
            // that outlives the call; spurious wake-ups are fine for callers.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.futex_word().as_ptr(),
                    libc::FUTEX_WAIT,
                    seen,
                    &ts as *const libc::timespec,
                );
            }
        }
        self.waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::test_regions::spec;
    use super::super::Region;

    #[test]
    fn doorbell_wakes_a_parked_waiter() {
        let r = std::sync::Arc::new(Region::anonymous(&spec(1)).unwrap());
        let seen = r.bell().value();
        let r2 = r.clone();
        let t = std::thread::spawn(move || {
            r2.bell().wait(seen, Duration::from_secs(30));
            r2.bell().value()
        });
        std::thread::sleep(Duration::from_millis(20));
        r.bell().ring();
        assert_ne!(t.join().unwrap(), seen);
    }
}
