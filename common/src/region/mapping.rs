//! The region's memory: a `MAP_SHARED` mapping of the region file (or of
//! anonymous memory), seen as a slice of `AtomicU64` words.
//!
//! One of the region's homes of `unsafe`: `mmap`, `munmap` and the view of
//! the mapping as atomics.

use std::io;
use std::os::unix::io::RawFd;
use std::sync::atomic::AtomicU64;

/// Maps `len` bytes of the file `fd` (None: fresh zeroed anonymous memory)
/// read-write and `MAP_SHARED`, so a `fork` never copies them. The caller
/// unmaps them.
pub(crate) fn map_shared(fd: Option<RawFd>, len: usize) -> io::Result<*mut libc::c_void> {
    let (flags, fd) = match fd {
        Some(fd) => (libc::MAP_SHARED, fd),
        None => (libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1),
    };
    // SAFETY: a new mapping chosen by the kernel (no address hint), of an
    // open fd or anonymous; MAP_FAILED is checked. It touches no existing
    // memory.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(ptr)
}

/// A live shared mapping of `words * 8` bytes, only ever accessed as
/// atomics. Dropping it unmaps.
pub(super) struct SharedWords {
    ptr: *mut AtomicU64,
    words: usize,
}

// SAFETY: the mapping is only accessed through `AtomicU64`, which is Sync;
// the pointer stays valid until Drop, which needs `&mut self`.
unsafe impl Send for SharedWords {}
// SAFETY: as above, all access is atomic.
unsafe impl Sync for SharedWords {}

impl SharedWords {
    /// Maps `len` bytes (a multiple of 8) of the file `fd` (None: fresh
    /// zeroed anonymous memory) shared. The memory is page-aligned (so
    /// 8-aligned) and only ever accessed as atomics, for which every bit
    /// pattern is valid.
    pub(super) fn map(fd: Option<RawFd>, len: usize) -> io::Result<SharedWords> {
        let ptr = map_shared(fd, len)?;
        Ok(SharedWords {
            ptr: ptr as *mut AtomicU64,
            words: len / 8,
        })
    }

    /// The mapping as atomic words.
    pub(super) fn words(&self) -> &[AtomicU64] {
        // SAFETY: `ptr` is a live, page-aligned mapping of `words * 8` bytes
        // (see `map`); AtomicU64 has the size and alignment of u64 and every
        // bit pattern is valid. The slice borrows `self`, so it cannot
        // outlive the mapping.
        unsafe { std::slice::from_raw_parts(self.ptr, self.words) }
    }
}

impl Drop for SharedWords {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`words` describe the mapping made in `map`; no
        // borrow of it survives `&mut self`.
        unsafe {
            libc::munmap(self.ptr as *mut libc::c_void, self.words * 8);
        }
    }
}
