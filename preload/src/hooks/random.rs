//! The bodies of the entropy hooks: the server's random reads and seeds
//! come from the cluster's stream (see `crate::determinism::entropy`), the
//! same on every replica.

use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};

use libc::{size_t, ssize_t};

use super::guards::caught;
use crate::reentry::Reentry;
use crate::sys::real::{real_getentropy, real_getrandom};

/// Set once the server's own generators got the cluster's seed.
pub(super) static GENERATORS_SEEDED: AtomicBool = AtomicBool::new(false);

/// Seeds the generators the server exports (`entropy::GENERATORS`) from the
/// cluster's stream, once, at its first event-loop wait: after `main`
/// seeded them from its clock and pid, before any input.
#[cold]
pub(super) fn seed_server_generators() {
    if GENERATORS_SEEDED.swap(true, Ordering::AcqRel) {
        return;
    }
    let Some(seed) = caught(crate::setup::entropy_seed).flatten() else {
        return;
    };
    let value = crate::determinism::entropy::generator_seed(&seed);
    for name in crate::determinism::entropy::GENERATORS {
        // SAFETY: dlsym with the RTLD_DEFAULT pseudo-handle and a
        // NUL-terminated name; it only looks the symbol up.
        let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
        if p.is_null() {
            continue;
        }
        // SAFETY: the names in GENERATORS are seeding functions taking one
        // 64-bit integer (Redis's `void init_genrand64(unsigned long long)`),
        // called on the server's own thread before it handles any input.
        unsafe {
            let f: extern "C" fn(u64) = std::mem::transmute(p);
            f(value);
        }
        log::info!(
            "seeded the server's {} from the cluster's entropy",
            name.to_string_lossy()
        );
    }
}

/// The cluster's entropy seed for a call of the server (see `entropy`):
/// None for the preload's own calls, a forked child, or a process that is
/// not a lockstep server. The guard it returns keeps the preload's own
/// work inside (reading the config) from coming back here.
pub(super) fn entropy_seed() -> Option<(Reentry, [u8; 32])> {
    if crate::setup::inert() {
        return None;
    }
    let guard = Reentry::enter()?;
    let seed = caught(crate::setup::entropy_seed).flatten()?;
    Some((guard, seed))
}

/// The body of the interposed `getrandom(2)`: the cluster's stream.
///
/// # Safety
/// Same contract as libc's `getrandom`.
pub(super) unsafe fn getrandom(buf: *mut c_void, len: size_t, flags: libc::c_uint) -> ssize_t {
    if let (Some((_guard, seed)), false) = (entropy_seed(), buf.is_null()) {
        // SAFETY: the caller's buffer of `len` bytes.
        let out = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, len) };
        crate::determinism::entropy::draw(&seed, out);
        return len as ssize_t;
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real_getrandom(buf, len, flags) }
}

/// The body of the interposed `getentropy(3)`: the cluster's stream.
///
/// # Safety
/// Same contract as libc's `getentropy`.
pub(super) unsafe fn getentropy(buf: *mut c_void, len: size_t) -> c_int {
    if len <= 256 && !buf.is_null() {
        if let Some((_guard, seed)) = entropy_seed() {
            // SAFETY: the caller's buffer of `len` bytes.
            let out = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, len) };
            crate::determinism::entropy::draw(&seed, out);
            return 0;
        }
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real_getentropy(buf, len) }
}

/// The common body of srand and srandom: `real(seed)` seeds, from the
/// cluster, whatever the server asks.
pub(super) fn seed(seed: libc::c_uint, real: impl FnOnce(libc::c_uint)) {
    let seed = entropy_seed().map_or(seed, |(_g, s)| crate::determinism::entropy::small_seed(&s));
    real(seed)
}

/// For `fopen` of the kernel's random devices: a read-only stream over the
/// cluster's block instead.
///
/// # Safety
/// `path` must be null or a NUL-terminated string.
pub(super) unsafe fn random_device_stream(path: *const libc::c_char) -> Option<*mut libc::FILE> {
    if path.is_null() {
        return None;
    }
    // SAFETY: per the contract.
    let name = unsafe { CStr::from_ptr(path) }.to_bytes();
    if !crate::determinism::entropy::is_random_device(name) {
        return None;
    }
    let (_guard, seed) = entropy_seed()?;
    let block = crate::determinism::entropy::block(&seed);
    // SAFETY: fmemopen over a 'static block that is never written (mode
    // "r"); the FILE is the caller's to fclose.
    let f = unsafe { libc::fmemopen(block.as_ptr() as *mut c_void, block.len(), c"r".as_ptr()) };
    (!f.is_null()).then_some(f)
}

/// The common body of fopen and fopen64: the random devices read the
/// cluster's entropy; `real()` opens anything else.
///
/// # Safety
/// `path` must be null or a NUL-terminated string.
pub(super) unsafe fn fopen(
    path: *const libc::c_char,
    real: impl FnOnce() -> *mut libc::FILE,
) -> *mut libc::FILE {
    // SAFETY: the caller's path.
    if let Some(f) = unsafe { random_device_stream(path) } {
        return f;
    }
    real()
}
