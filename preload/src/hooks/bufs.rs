//! The caller's buffers of a data call (one buffer, an iovec array, a
//! msghdr's iovecs) seen as slices without copying, or filled from the
//! log.

use libc::{iovec, msghdr};

/// Where the bytes of a call live.
#[derive(Clone, Copy)]
pub(super) enum Bufs {
    /// One buffer of this many bytes.
    Flat(*const u8, usize),
    /// An iovec array of this many entries.
    Iov(*const iovec, usize),
    /// The iovecs of a msghdr (control messages are not replicated).
    Msg(*const msghdr),
}

impl Bufs {
    /// The same buffers, with a msghdr's iovecs taken out of it.
    ///
    /// # Safety
    /// A `Msg` must point to a valid msghdr.
    pub(super) unsafe fn resolved(self) -> Bufs {
        match self {
            // SAFETY: per the contract.
            Bufs::Msg(m) => unsafe { Bufs::Iov((*m).msg_iov as *const iovec, (*m).msg_iovlen) },
            b => b,
        }
    }

    /// Total bytes the buffers can hold.
    ///
    /// # Safety
    /// `Iov` must point to its count of valid iovecs (or be null with a
    /// count of 0); `Msg` must be a valid msghdr.
    pub(super) unsafe fn total(self) -> usize {
        // SAFETY: per the contract.
        match unsafe { self.resolved() } {
            Bufs::Flat(_, n) => n,
            Bufs::Iov(iov, cnt) if !iov.is_null() && cnt != 0 => {
                // SAFETY: per the contract.
                let iovs = unsafe { std::slice::from_raw_parts(iov, cnt) };
                iovs.iter().fold(0usize, |a, v| a.saturating_add(v.iov_len))
            }
            _ => 0,
        }
    }
}

/// Calls `f` with the first `n` bytes of `bufs` as slices, without copying.
///
/// # Safety
/// `bufs` must describe memory holding at least `n` initialised bytes
/// (the real call just filled or sent them), valid for this call.
pub(super) unsafe fn with_segments<T>(bufs: Bufs, n: usize, f: impl FnOnce(&[&[u8]]) -> T) -> T {
    const INLINE: usize = 16;
    // SAFETY: per the contract, a `Msg` is a valid msghdr.
    match unsafe { bufs.resolved() } {
        Bufs::Flat(p, _) => {
            let s: &[u8] = if n == 0 || p.is_null() {
                &[]
            } else {
                // SAFETY: per the contract, `p` holds `n` bytes.
                unsafe { std::slice::from_raw_parts(p, n) }
            };
            f(&[s])
        }
        Bufs::Iov(iov, cnt) => {
            let iovs: &[iovec] = if cnt == 0 || iov.is_null() {
                &[]
            } else {
                // SAFETY: per the contract, `iov` points to `cnt` iovecs.
                unsafe { std::slice::from_raw_parts(iov, cnt) }
            };
            let mut inline: [&[u8]; INLINE] = [&[]; INLINE];
            let mut heap: Vec<&[u8]> = Vec::new();
            let mut left = n;
            let mut k = 0;
            for v in iovs {
                if left == 0 {
                    break;
                }
                let take = v.iov_len.min(left);
                if take == 0 {
                    continue;
                }
                // SAFETY: the call filled (or sent) `take` bytes at
                // `iov_base`, which the caller keeps valid.
                let s = unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, take) };
                left -= take;
                if k < INLINE {
                    inline[k] = s;
                } else {
                    if heap.is_empty() {
                        heap.extend_from_slice(&inline);
                    }
                    heap.push(s);
                }
                k += 1;
            }
            if heap.is_empty() {
                f(&inline[..k])
            } else {
                f(&heap)
            }
        }
        Bufs::Msg(_) => unreachable!("resolved above"),
    }
}

/// Copies `src` into `bufs` (as a read would fill them); returns the bytes
/// copied.
///
/// # Safety
/// `bufs` (resolved) must describe writable memory of the sizes it names.
pub(super) unsafe fn fill(bufs: Bufs, src: &[u8]) -> usize {
    /// Copies what fits of `src[done..]` into `room` bytes at `dst`.
    ///
    /// # Safety
    /// `dst` must hold `room` writable bytes, apart from `src`.
    unsafe fn put(dst: *mut u8, room: usize, src: &[u8], done: &mut usize) {
        let n = room.min(src.len() - *done);
        if n > 0 && !dst.is_null() {
            // SAFETY: per the contract; `src` has `n` bytes from `done`.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().add(*done), dst, n) };
            *done += n;
        }
    }
    let mut done = 0;
    // SAFETY: per the contract (the log's copy is the pump's own buffer,
    // never the caller's).
    match unsafe { bufs.resolved() } {
        // SAFETY: a flat buffer names `room` writable caller bytes.
        Bufs::Flat(p, room) => unsafe { put(p as *mut u8, room, src, &mut done) },
        Bufs::Iov(iov, cnt) if !iov.is_null() && cnt != 0 => {
            // SAFETY: per the contract, `iov` points to `cnt` iovecs.
            let iovs = unsafe { std::slice::from_raw_parts(iov, cnt) };
            for v in iovs {
                if done == src.len() {
                    break;
                }
                // SAFETY: each iovec names writable caller memory.
                unsafe { put(v.iov_base as *mut u8, v.iov_len, src, &mut done) };
            }
        }
        _ => {}
    }
    done
}
