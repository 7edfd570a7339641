//! The interposed libc functions — the preload's only home of `unsafe`:
//! resolving the real functions, the exported symbols, turning the
//! caller's raw buffers into slices, errno, socket addresses and the few
//! raw calls the rest of the crate makes (in [`sys`]).
//!
//! # Why not redhook
//!
//! Real functions are resolved with `dlsym(RTLD_NEXT, ..)` and cached in
//! atomics instead of going through redhook's `hook!`/`real!`: redhook 2.0
//! wraps each hook in `catch_unwind` and, when the hook panics, calls the
//! *real* function. For a leader's `recv` that hands the server bytes that
//! were never replicated — a silent divergence. Here a panic in a hook
//! body fails that one connection (-1/ECONNRESET) and nothing else.
//!
//! # Shape of a hook
//!
//! 1. Cheap filter: a forked child, or an fd the table does not track,
//!    goes straight to the real function (one relaxed load).
//! 2. Re-entrancy guard: a hook called from inside another hook on the
//!    same thread (the preload's own I/O) passes through.
//! 3. `dispatch` decides before the real call (fail, return EOF, pass) and
//!    after it (replicate, count, fail), inside `catch_unwind`.
//!
//! Real functions are resolved by a load-time constructor (so no hook ever
//! calls `dlsym` on a hot path); a hook that runs while `dlsym` itself is
//! resolving on the same thread (an allocator calling `read` during its
//! initialisation) uses the raw system call instead of recursing.

use std::ffi::{c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use libc::{iovec, msghdr, size_t, sockaddr, socklen_t, ssize_t};

use crate::apply::Served;
use crate::dispatch::{self, Before, Ret};
use crate::reentry::{in_hook, Reentry};
use crate::sys::real::*;
use crate::sys::{self, errno, set_errno};
use crate::turns::{Wait, MAX_WIDTH};

// ---------------------------------------------------------------------------
// Helpers for the hook bodies.

/// Puts back, when dropped, the errno a real call left: the preload's
/// work after a server's wait (draining the bell, reading an alarm) must
/// not change what the server reads there (Redis aborts when epoll_wait
/// fails with anything but EINTR, and a SIGCONT or any handled signal
/// makes it fail with EINTR).
struct KeptErrno(c_int);

impl KeptErrno {
    fn now() -> KeptErrno {
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
fn caught<T>(f: impl FnOnce() -> T) -> Option<T> {
    catch_unwind(AssertUnwindSafe(f)).ok()
}

/// Sets errno as `r` says and returns its value.
fn finish(r: Ret, errno_after_call: c_int) -> ssize_t {
    set_errno(r.errno.unwrap_or(errno_after_call));
    r.value as ssize_t
}

/// Where the bytes of a call live.
#[derive(Clone, Copy)]
enum Bufs {
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
    unsafe fn resolved(self) -> Bufs {
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
    unsafe fn total(self) -> usize {
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
unsafe fn with_segments<T>(bufs: Bufs, n: usize, f: impl FnOnce(&[&[u8]]) -> T) -> T {
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
unsafe fn fill(bufs: Bufs, src: &[u8]) -> usize {
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

/// The filter every data hook starts with: `None` (call the real function
/// at once) for an fd the table does not track, or inside another hook on
/// this thread; else the re-entry guard and the buffers, a msghdr's
/// iovecs read before the real call.
///
/// # Safety
/// A `Bufs::Msg` must point to a valid msghdr.
unsafe fn enter_tracked(fd: c_int, bufs: Bufs) -> Option<(Reentry, Bufs)> {
    if !dispatch::tracked(fd) {
        return None;
    }
    let reentry = Reentry::enter()?;
    // SAFETY: per the contract.
    Some((reentry, unsafe { bufs.resolved() }))
}

/// The body of every recv-type hook: an fd the table does not track goes
/// straight to `real` (the cheap filter); otherwise `dispatch` decides
/// before and after the real call.
///
/// # Safety
/// `bufs` must describe the buffers `real` fills (as the caller of the
/// hooked function passed them).
unsafe fn input(fd: c_int, flags: c_int, bufs: Bufs, real: impl FnOnce() -> ssize_t) -> ssize_t {
    // SAFETY: per the contract.
    let Some((_reentry, bufs)) = (unsafe { enter_tracked(fd, bufs) }) else {
        return real();
    };
    // SAFETY: per the contract.
    let want = unsafe { bufs.total() };
    let before = caught(|| dispatch::before_input(fd, want, flags))
        .unwrap_or_else(|| Before::Return(dispatch::internal_error(fd)));
    let ticket = match before {
        Before::Pass => return real(),
        Before::Return(r) => return finish(r, errno()),
        Before::Serve { conn, peek } => {
            let served = caught(|| {
                // SAFETY: per the contract, `bufs` are the caller's buffers
                // for the bytes a read returns.
                crate::apply::serve(conn, peek, &mut |src| unsafe { fill(bufs, src) })
            });
            return match served {
                Some(Served::Bytes(n)) => n as ssize_t,
                Some(Served::Eof) => 0,
                Some(Served::Empty) | None => {
                    set_errno(libc::EAGAIN);
                    -1
                }
            };
        }
        Before::Go(t) => t,
    };
    let n = real();
    let e = errno();
    let got = if n > 0 { n as usize } else { 0 };
    let r = caught(|| {
        // SAFETY: the real call filled `got` bytes into `bufs`.
        unsafe { with_segments(bufs, got, |segs| dispatch::after_input(ticket, n, e, segs)) }
    })
    .unwrap_or_else(|| dispatch::internal_error(fd));
    finish(r, e)
}

/// The body of every send-type hook: output to a tracked fd waits for the
/// commit (output mode) and feeds its digest; anything else goes straight
/// to `real`.
///
/// # Safety
/// `bufs` must describe the buffers `real` sends from.
unsafe fn output(fd: c_int, bufs: Bufs, real: impl FnOnce() -> ssize_t) -> ssize_t {
    // SAFETY: per the contract.
    let Some((_reentry, bufs)) = (unsafe { enter_tracked(fd, bufs) }) else {
        return real();
    };
    if dispatch::is_replay(fd) {
        // A replay connection's output goes nowhere: only its digest is
        // kept, and the server never blocks on it.
        // SAFETY: per the contract, `bufs` holds the bytes to send.
        let total = unsafe { bufs.total() };
        let sent = caught(|| {
            // SAFETY: the caller's buffers hold `total` bytes to send.
            unsafe { with_segments(bufs, total, |segs| dispatch::replay_output(fd, segs)) }
        });
        if let Some(Some(n)) = sent {
            return n as ssize_t;
        }
    }
    // Output commit: nothing leaves for a client before the inputs it may
    // depend on are committed. A panic deciding fails the connection
    // rather than release an output unchecked.
    let held = caught(|| dispatch::before_output(fd))
        .unwrap_or_else(|| Some(dispatch::internal_error(fd)));
    if let Some(r) = held {
        return finish(r, errno());
    }
    let n = real();
    if n > 0 {
        let e = errno();
        // A panic here only loses digest bytes; the divergence check
        // reports it, the server is unaffected.
        let _ = caught(|| {
            // SAFETY: the real call sent `n` bytes from `bufs`.
            unsafe { with_segments(bufs, n as usize, |segs| dispatch::after_output(fd, segs)) }
        });
        set_errno(e);
    }
    n
}

/// The common body of accept and accept4.
///
/// # Safety
/// `addr`/`len` as for accept(2).
unsafe fn accept_common(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    real: impl Fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int,
) -> c_int {
    let Some(_reentry) = Reentry::enter() else {
        return real(fd, addr, len);
    };
    let orig_len = if len.is_null() {
        0
    } else {
        // SAFETY: the caller passed a valid socklen_t pointer.
        unsafe { *len }
    };
    let mut call = || {
        if !len.is_null() {
            // SAFETY: as above; a retried accept gets the caller's size
            // back, as if it were the first call.
            unsafe { *len = orig_len };
        }
        let c = real(fd, addr, len);
        (c, errno())
    };
    match caught(|| dispatch::accept(fd, &mut call)) {
        Some(r) => finish(r, errno()) as c_int,
        None => {
            set_errno(libc::ECONNABORTED);
            -1
        }
    }
}

/// `fd` is about to be closed (by close, or replaced by dup2/dup3): a
/// client's close is its CLOSE entry.
fn before_close(fd: c_int) {
    if dispatch::known(fd) {
        if let Some(_reentry) = Reentry::enter() {
            if caught(|| dispatch::before_close(fd)).is_none() {
                dispatch::forget(fd);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The exported hooks.

/// Interposed `read(2)`.
///
/// # Safety
/// Same contract as libc's `read`.
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t {
    // SAFETY: `buf` is the caller's buffer of `count` bytes; forwarding.
    unsafe {
        input(fd, 0, Bufs::Flat(buf as *const u8, count), || {
            real_read(fd, buf, count)
        })
    }
}

/// Interposed glibc `__read_chk` (`read` under `_FORTIFY_SOURCE`).
///
/// # Safety
/// Same contract as glibc's `__read_chk`.
#[no_mangle]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    count: size_t,
    buflen: size_t,
) -> ssize_t {
    if count > buflen {
        // SAFETY: forwarding; the real function reports the overflow.
        return unsafe { real_read_chk(fd, buf, count, buflen) };
    }
    // SAFETY: as for `read`.
    unsafe {
        input(fd, 0, Bufs::Flat(buf as *const u8, count), || {
            real_read_chk(fd, buf, count, buflen)
        })
    }
}

/// Interposed `readv(2)`.
///
/// # Safety
/// Same contract as libc's `readv`.
#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    if cnt < 0 {
        // SAFETY: forwarding the caller's arguments (the real call fails).
        return unsafe { real_readv(fd, iov, cnt) };
    }
    // SAFETY: `iov` holds `cnt` iovecs describing the buffers readv fills.
    unsafe {
        input(fd, 0, Bufs::Iov(iov, cnt as usize), || {
            real_readv(fd, iov, cnt)
        })
    }
}

/// Interposed `recv(2)`.
///
/// # Safety
/// Same contract as libc's `recv`.
#[no_mangle]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t {
    // SAFETY: `buf` is the caller's buffer of `len` bytes; forwarding.
    unsafe {
        input(fd, flags, Bufs::Flat(buf as *const u8, len), || {
            real_recv(fd, buf, len, flags)
        })
    }
}

/// Interposed glibc `__recv_chk`.
///
/// # Safety
/// Same contract as glibc's `__recv_chk`.
#[no_mangle]
pub unsafe extern "C" fn __recv_chk(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    buflen: size_t,
    flags: c_int,
) -> ssize_t {
    if len > buflen {
        // SAFETY: forwarding; the real function reports the overflow.
        return unsafe { real_recv_chk(fd, buf, len, buflen, flags) };
    }
    // SAFETY: as for `recv`.
    unsafe {
        input(fd, flags, Bufs::Flat(buf as *const u8, len), || {
            real_recv_chk(fd, buf, len, buflen, flags)
        })
    }
}

/// Interposed `recvfrom(2)`.
///
/// # Safety
/// Same contract as libc's `recvfrom`.
#[no_mangle]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    // SAFETY: `buf` is the caller's buffer of `len` bytes; forwarding.
    unsafe {
        input(fd, flags, Bufs::Flat(buf as *const u8, len), || {
            real_recvfrom(fd, buf, len, flags, addr, alen)
        })
    }
}

/// Interposed glibc `__recvfrom_chk`.
///
/// # Safety
/// Same contract as glibc's `__recvfrom_chk`.
#[no_mangle]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    buflen: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    if len > buflen {
        // SAFETY: forwarding; the real function reports the overflow.
        return unsafe { real_recvfrom_chk(fd, buf, len, buflen, flags, addr, alen) };
    }
    // SAFETY: as for `recvfrom`.
    unsafe {
        input(fd, flags, Bufs::Flat(buf as *const u8, len), || {
            real_recvfrom_chk(fd, buf, len, buflen, flags, addr, alen)
        })
    }
}

/// Interposed `recvmsg(2)`: every iovec counts; control messages are not
/// replicated.
///
/// # Safety
/// Same contract as libc's `recvmsg`.
#[no_mangle]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    if msg.is_null() {
        // SAFETY: forwarding the caller's arguments (the real call fails).
        return unsafe { real_recvmsg(fd, msg, flags) };
    }
    // SAFETY: `msg` is the caller's valid msghdr; its iovecs describe the
    // buffers recvmsg fills.
    unsafe { input(fd, flags, Bufs::Msg(msg), || real_recvmsg(fd, msg, flags)) }
}

/// Interposed `accept(2)`.
///
/// # Safety
/// Same contract as libc's `accept`.
#[no_mangle]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    if !dispatch::accept_hooked() {
        // SAFETY: forwarding the caller's arguments.
        return unsafe { real_accept(fd, addr, len) };
    }
    // SAFETY: forwarding the caller's arguments (possibly several times,
    // with `*len` restored each time).
    unsafe { accept_common(fd, addr, len, |f, a, l| real_accept(f, a, l)) }
}

/// Interposed `accept4(2)`.
///
/// # Safety
/// Same contract as libc's `accept4`.
#[no_mangle]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    if !dispatch::accept_hooked() {
        // SAFETY: forwarding the caller's arguments.
        return unsafe { real_accept4(fd, addr, len, flags) };
    }
    // SAFETY: as for `accept`.
    unsafe { accept_common(fd, addr, len, |f, a, l| real_accept4(f, a, l, flags)) }
}

/// Interposed `listen(2)`: a listener on the app address attaches the
/// preload to its region early (so the follower sees the server's pid).
///
/// # Safety
/// Same contract as libc's `listen`.
#[no_mangle]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    // SAFETY: forwarding the caller's arguments.
    let r = unsafe { real_listen(fd, backlog) };
    if r == 0 && dispatch::accept_hooked() {
        if let Some(_reentry) = Reentry::enter() {
            let e = errno();
            let _ = caught(|| dispatch::after_listen(fd));
            set_errno(e);
        }
    }
    r
}

/// Interposed `close(2)`: a client's close is its CLOSE entry.
///
/// # Safety
/// Same contract as libc's `close`.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    before_close(fd);
    // SAFETY: forwarding the caller's argument.
    unsafe { real_close(fd) }
}

/// Interposed `shutdown(2)`: SHUT_RD and SHUT_RDWR of a client end its
/// input, which is its CLOSE entry.
///
/// # Safety
/// Same contract as libc's `shutdown`.
#[no_mangle]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    if dispatch::tracked(fd) {
        if let Some(_reentry) = Reentry::enter() {
            let _ = caught(|| dispatch::before_shutdown(fd, how));
        }
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real_shutdown(fd, how) }
}

/// Interposed `dup2(2)`: replacing a tracked fd closes it.
///
/// # Safety
/// Same contract as libc's `dup2`.
#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    if old != new {
        before_close(new);
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real_dup2(old, new) }
}

/// Interposed `dup3(2)`: replacing a tracked fd closes it.
///
/// # Safety
/// Same contract as libc's `dup3`.
#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if old != new {
        before_close(new);
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real_dup3(old, new, flags) }
}

/// Interposed `write(2)`: output to a client feeds its digest.
///
/// # Safety
/// Same contract as libc's `write`.
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t {
    // SAFETY: `buf` holds `count` bytes (the caller's contract); forwarding.
    unsafe {
        output(fd, Bufs::Flat(buf as *const u8, count), || {
            real_write(fd, buf, count)
        })
    }
}

/// Interposed `writev(2)`.
///
/// # Safety
/// Same contract as libc's `writev`.
#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    if cnt < 0 {
        // SAFETY: forwarding the caller's arguments (the real call fails).
        return unsafe { real_writev(fd, iov, cnt) };
    }
    // SAFETY: `iov` holds `cnt` valid iovecs (the caller's contract).
    unsafe {
        output(fd, Bufs::Iov(iov, cnt as usize), || {
            real_writev(fd, iov, cnt)
        })
    }
}

/// Interposed `send(2)`.
///
/// # Safety
/// Same contract as libc's `send`.
#[no_mangle]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t {
    // SAFETY: `buf` holds `len` bytes (the caller's contract); forwarding.
    unsafe {
        output(fd, Bufs::Flat(buf as *const u8, len), || {
            real_send(fd, buf, len, flags)
        })
    }
}

/// Interposed `sendto(2)`.
///
/// # Safety
/// Same contract as libc's `sendto`.
#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    addr: *const sockaddr,
    alen: socklen_t,
) -> ssize_t {
    // SAFETY: `buf` holds `len` bytes (the caller's contract); forwarding.
    unsafe {
        output(fd, Bufs::Flat(buf as *const u8, len), || {
            real_sendto(fd, buf, len, flags, addr, alen)
        })
    }
}

/// Interposed `sendmsg(2)`.
///
/// # Safety
/// Same contract as libc's `sendmsg`.
#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    if msg.is_null() {
        // SAFETY: forwarding the caller's arguments (the real call fails).
        return unsafe { real_sendmsg(fd, msg, flags) };
    }
    // SAFETY: `msg` is the caller's valid msghdr; its iovecs describe the
    // bytes sendmsg sends.
    unsafe { output(fd, Bufs::Msg(msg), || real_sendmsg(fd, msg, flags)) }
}

/// The server is about to wait in its event loop (`max`: epoll's
/// maxevents).
fn event_loop_turn(wait: Wait, max: c_int, serves: bool) {
    if dispatch::passive_hooked() {
        let e = errno();
        if serves {
            crate::clock::on_loop_thread();
        }
        if !GENERATORS_SEEDED.load(Ordering::Relaxed) {
            seed_server_generators();
        }
        let _ = caught(|| dispatch::before_wait(wait, max));
        set_errno(e);
    }
}

/// The server's wait in loop `loop_id` returned (`delivers`: reporting
/// replay connections the log has bytes for): a new turn starts (see
/// `clock`). The caller holds a `Reentry`.
fn turn_returned(loop_id: u64, delivers: bool) {
    if dispatch::passive_hooked() {
        let e = errno();
        let _ = caught(|| dispatch::after_wait(loop_id, delivers));
        set_errno(e);
    }
}

/// An epoll wait on a backup: the replay connections the log has bytes
/// for are readable (first, in log order) and the wait does not block;
/// the kernel's other events follow. `real(max, timeout)` waits.
///
/// # Safety
/// `ev` must be the caller's buffer of `max` events.
unsafe fn epoll_turn(
    epfd: c_int,
    ev: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
    real: impl FnOnce(c_int, c_int) -> c_int,
) -> c_int {
    // The preload's work below reads real clocks, and its own calls pass.
    let Some(_reentry) = Reentry::enter() else {
        return real(max, timeout);
    };
    let loop_id = crate::loops::of_epfd(epfd);
    event_loop_turn(Wait::Epoll, max, loop_id != 0);
    if !dispatch::passive_hooked() || ev.is_null() || max <= 0 {
        let n = real(max, timeout);
        let _errno = KeptErrno::now();
        turn_returned(loop_id, false);
        return n;
    }
    let (keys, k) = caught(|| crate::apply::epoll_unread(epfd)).unwrap_or(([0; MAX_WIDTH], 0));
    let k = k.min(max as usize);
    // A TICK of this loop is due: this wait is its turn.
    let tick = caught(|| crate::apply::tick_due(loop_id)).unwrap_or(false);
    let n = match k {
        0 => real(max, wait_timeout(tick, timeout)),
        // No room left for the kernel's events: they wait for the next
        // call (a level-triggered fd is reported again).
        k if k == max as usize => 0,
        k => real(max - k as c_int, 0),
    };
    let _errno = KeptErrno::now();
    let n = if n > 0 {
        // SAFETY: the kernel filled the first `n` events of the caller's
        // buffer.
        let got = unsafe { std::slice::from_raw_parts_mut(ev, n as usize) };
        let kept = crate::loops::without_alarm(got);
        if kept < got.len() {
            crate::loops::silence(epfd);
        }
        kept as c_int
    } else {
        n
    };
    turn_returned(loop_id, k > 0);
    let bell = caught(|| {
        crate::apply::after_wait(|fd| {
            crate::fdtable::slot(fd).is_some_and(|s| s.wait_epfd() == epfd)
        })
    })
    .flatten();
    if n < 0 && k == 0 {
        return n;
    }
    let real_n = n.max(0) as usize;
    let bell_key = bell.and_then(crate::fdtable::slot).map(|s| s.wait_key());
    if k == 0 && bell_key.is_none() {
        return n;
    }
    for i in real_n..real_n + k {
        // SAFETY: `i` < real_n + k <= max: inside the caller's buffer.
        unsafe { ev.add(i).write(libc::epoll_event { events: 0, u64: 0 }) };
    }
    // SAFETY: the first `real_n` events were filled by the kernel and the
    // next `k` just now, all inside the caller's buffer of `max`.
    let events = unsafe { std::slice::from_raw_parts_mut(ev, real_n + k) };
    caught(|| crate::apply::merge_events(events, real_n, &keys[..k], bell_key))
        .map_or(n, |m| m as c_int)
}

/// A backup's epoll timeout: none when a tick is due (this wait is its
/// turn); unbounded while the log has no time (the server's clock stands
/// at the origin, so no timer of its can come due: the first entry's bell
/// or alarm wakes it, a signal too); else the server's.
fn wait_timeout(tick: bool, timeout: c_int) -> c_int {
    if tick {
        0
    } else if crate::clock::stilled()
        && crate::setup::engine()
            .is_some_and(|e| e.region.role() != lockstep_common::region::Role::Leader)
    {
        -1
    } else {
        timeout
    }
}

/// The log's readiness over a poll set (see `epoll_turn`): whether any
/// entry waits to read a replay connection the log has bytes for.
///
/// # Safety
/// `fds` must point to `n` valid pollfds (or be null with `n` 0).
unsafe fn poll_unread(fds: *const libc::pollfd, n: libc::nfds_t, unread: &[i32]) -> bool {
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
unsafe fn poll_merge(
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
unsafe fn poll_bell(fds: *const libc::pollfd, n: libc::nfds_t) -> Option<i32> {
    if fds.is_null() || n == 0 {
        return None;
    }
    // SAFETY: per the contract.
    let set = unsafe { std::slice::from_raw_parts(fds, n as usize) };
    caught(|| crate::apply::after_wait(|fd| set.iter().any(|p| p.fd == fd))).flatten()
}

/// Whether a poll set watches a connection or listener of the server's
/// (then the thread runs the server's event loop; the preload's own
/// threads poll only sockets of their own).
///
/// # Safety
/// `fds` must point to `n` valid pollfds (or be null with `n` 0).
unsafe fn poll_serves(fds: *const libc::pollfd, n: libc::nfds_t) -> bool {
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
unsafe fn select_serves(n: c_int, r: *const libc::fd_set) -> bool {
    // SAFETY: per the contract; FD_ISSET only reads.
    !r.is_null()
        && (0..n.min(libc::FD_SETSIZE as c_int))
            .any(|fd| unsafe { libc::FD_ISSET(fd, r) } && dispatch::known(fd))
}

/// This turn's unread replay connections (server fds), log order.
fn unread_fds() -> ([i32; MAX_WIDTH], usize) {
    if !dispatch::passive_hooked() {
        return ([-1; MAX_WIDTH], 0);
    }
    let fds = caught(crate::apply::unread).unwrap_or([-1; MAX_WIDTH]);
    let n = fds.iter().take_while(|fd| **fd >= 0).count();
    (fds, n)
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
unsafe fn select_unread(n: c_int, r: *const libc::fd_set, unread: &[i32]) -> bool {
    // SAFETY: per the contract; FD_ISSET only reads.
    !r.is_null()
        && unread
            .iter()
            .any(|fd| *fd < n && unsafe { libc::FD_ISSET(*fd, r) })
}

/// Set once the server's own generators got the cluster's seed.
static GENERATORS_SEEDED: AtomicBool = AtomicBool::new(false);

/// Seeds the generators the server exports (`entropy::GENERATORS`) from the
/// cluster's stream, once, at its first event-loop wait: after `main`
/// seeded them from its clock and pid, before any input.
#[cold]
fn seed_server_generators() {
    if GENERATORS_SEEDED.swap(true, Ordering::AcqRel) {
        return;
    }
    let Some(seed) = caught(crate::entropy::seed).flatten() else {
        return;
    };
    let value = crate::entropy::generator_seed(&seed);
    for name in crate::entropy::GENERATORS {
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

/// Interposed `epoll_wait(2)`: a backup orders the replay connections'
/// events (see `apply::order_events`).
///
/// # Safety
/// Same contract as libc's `epoll_wait`.
#[no_mangle]
pub unsafe extern "C" fn epoll_wait(
    epfd: c_int,
    ev: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
) -> c_int {
    // SAFETY: the caller's buffer of `max` events; the real call gets a
    // part of it.
    unsafe {
        epoll_turn(epfd, ev, max, timeout, |m, t| {
            real_epoll_wait(epfd, ev, m, t)
        })
    }
}

/// Interposed `epoll_pwait(2)`: as `epoll_wait`.
///
/// # Safety
/// Same contract as libc's `epoll_pwait`.
#[no_mangle]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    ev: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: as epoll_wait; `mask` is the caller's.
    unsafe {
        epoll_turn(epfd, ev, max, timeout, |m, t| {
            real_epoll_pwait(epfd, ev, m, t, mask)
        })
    }
}

/// The log's time for a clock read of the server (see `clock`): None
/// for the preload's own calls, a forked child, or a process that is not
/// a lockstep server (no usable config).
fn log_time() -> Option<u64> {
    if in_hook() {
        return None;
    }
    if !dispatch::passive_hooked() && !starting_up() {
        return None;
    }
    crate::clock::now_us(sys::monotonic_us)
}

/// Whether this process is a lockstep server that did not attach yet (its
/// start-up: it reads the log's origin). Allocates nothing: jemalloc
/// reads the monotonic clock under its own lock at start-up.
fn starting_up() -> bool {
    !crate::setup::inert() && crate::setup::engine().is_none() && crate::setup::may_serve()
}

/// Whether the calling thread's monotonic clocks read the log's time: the
/// server's event loops and its main thread (its start-up arms the
/// timers). Other threads read real monotonic time, which their deadlines
/// and futex waits rely on.
fn monotonic_is_logged() -> bool {
    crate::clock::is_loop_thread() || sys::is_main_thread()
}

/// Interposed `clock_gettime(2)`: the wall clocks read the log's time,
/// and so do the monotonic ones on the server's event-loop and main
/// threads (see `monotonic_is_logged`).
///
/// # Safety
/// Same contract as libc's `clock_gettime`.
#[no_mangle]
pub unsafe extern "C" fn clock_gettime(clk: libc::clockid_t, ts: *mut libc::timespec) -> c_int {
    let logged = match clk {
        libc::CLOCK_REALTIME | libc::CLOCK_REALTIME_COARSE => log_time(),
        libc::CLOCK_MONOTONIC
        | libc::CLOCK_MONOTONIC_COARSE
        | libc::CLOCK_MONOTONIC_RAW
        | libc::CLOCK_BOOTTIME => log_time().filter(|_| monotonic_is_logged()),
        _ => None,
    };
    if !ts.is_null() {
        if let Some(us) = logged {
            let (s, u) = crate::clock::split_us(us);
            // SAFETY: `ts` is the caller's non-null timespec.
            unsafe {
                (*ts).tv_sec = s as libc::time_t;
                (*ts).tv_nsec = (u * 1000) as libc::c_long;
            }
            return 0;
        }
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real_clock_gettime(clk, ts) }
}

/// Interposed `gettimeofday(2)`: reads the log's time.
///
/// # Safety
/// Same contract as libc's `gettimeofday`.
#[no_mangle]
pub unsafe extern "C" fn gettimeofday(tv: *mut libc::timeval, tz: *mut c_void) -> c_int {
    // SAFETY: forwarding the caller's arguments (the time zone, if asked).
    let r = unsafe { real_gettimeofday(tv, tz) };
    if r == 0 && !tv.is_null() {
        if let Some(us) = log_time() {
            let (s, u) = crate::clock::split_us(us);
            // SAFETY: `tv` is the caller's non-null timeval.
            unsafe {
                (*tv).tv_sec = s as libc::time_t;
                (*tv).tv_usec = u as libc::suseconds_t;
            }
        }
    }
    r
}

/// Interposed `time(2)`: reads the log's time.
///
/// # Safety
/// Same contract as libc's `time`.
#[no_mangle]
pub unsafe extern "C" fn time(t: *mut libc::time_t) -> libc::time_t {
    let Some(us) = log_time() else {
        // SAFETY: forwarding the caller's argument.
        return unsafe { real_time(t) };
    };
    let s = crate::clock::split_us(us).0 as libc::time_t;
    if !t.is_null() {
        // SAFETY: a non-null `t` is the caller's time_t.
        unsafe { *t = s };
    }
    s
}

/// The cluster's entropy seed for a call of the server (see `entropy`):
/// None for the preload's own calls, a forked child, or a process that is
/// not a lockstep server. The guard it returns keeps the preload's own
/// work inside (reading the config) from coming back here.
fn entropy_seed() -> Option<(Reentry, [u8; 32])> {
    if crate::setup::inert() {
        return None;
    }
    let guard = Reentry::enter()?;
    let seed = caught(crate::entropy::seed).flatten()?;
    Some((guard, seed))
}

/// Interposed `getrandom(2)`: the cluster's stream.
///
/// # Safety
/// Same contract as libc's `getrandom`.
#[no_mangle]
pub unsafe extern "C" fn getrandom(buf: *mut c_void, len: size_t, flags: libc::c_uint) -> ssize_t {
    if let (Some((_guard, seed)), false) = (entropy_seed(), buf.is_null()) {
        // SAFETY: the caller's buffer of `len` bytes.
        let out = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, len) };
        crate::entropy::draw(&seed, out);
        return len as ssize_t;
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real_getrandom(buf, len, flags) }
}

/// Interposed `getentropy(3)`: the cluster's stream.
///
/// # Safety
/// Same contract as libc's `getentropy`.
#[no_mangle]
pub unsafe extern "C" fn getentropy(buf: *mut c_void, len: size_t) -> c_int {
    if len <= 256 && !buf.is_null() {
        if let Some((_guard, seed)) = entropy_seed() {
            // SAFETY: the caller's buffer of `len` bytes.
            let out = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, len) };
            crate::entropy::draw(&seed, out);
            return 0;
        }
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real_getentropy(buf, len) }
}

/// Interposed `srand(3)`: seeded from the cluster, whatever the server asks.
///
/// # Safety
/// Same contract as libc's `srand`.
#[no_mangle]
pub unsafe extern "C" fn srand(seed: libc::c_uint) {
    let seed = entropy_seed().map_or(seed, |(_g, s)| crate::entropy::small_seed(&s));
    // SAFETY: forwarding a seed.
    unsafe { real_srand(seed) }
}

/// Interposed `srandom(3)`: seeded from the cluster, whatever the server asks.
///
/// # Safety
/// Same contract as libc's `srandom`.
#[no_mangle]
pub unsafe extern "C" fn srandom(seed: libc::c_uint) {
    let seed = entropy_seed().map_or(seed, |(_g, s)| crate::entropy::small_seed(&s));
    // SAFETY: forwarding a seed.
    unsafe { real_srandom(seed) }
}

/// For `fopen` of the kernel's random devices: a read-only stream over the
/// cluster's block instead.
///
/// # Safety
/// `path` must be null or a NUL-terminated string.
unsafe fn random_device_stream(path: *const libc::c_char) -> Option<*mut libc::FILE> {
    if path.is_null() {
        return None;
    }
    // SAFETY: per the contract.
    let name = unsafe { CStr::from_ptr(path) }.to_bytes();
    if !crate::entropy::is_random_device(name) {
        return None;
    }
    let (_guard, seed) = entropy_seed()?;
    let block = crate::entropy::block(&seed);
    // SAFETY: fmemopen over a 'static block that is never written (mode
    // "r"); the FILE is the caller's to fclose.
    let f = unsafe { libc::fmemopen(block.as_ptr() as *mut c_void, block.len(), c"r".as_ptr()) };
    (!f.is_null()).then_some(f)
}

/// Interposed `fopen(3)`: the random devices read the cluster's entropy.
///
/// # Safety
/// Same contract as libc's `fopen`.
#[no_mangle]
pub unsafe extern "C" fn fopen(
    path: *const libc::c_char,
    mode: *const libc::c_char,
) -> *mut libc::FILE {
    // SAFETY: the caller's path.
    if let Some(f) = unsafe { random_device_stream(path) } {
        return f;
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real_fopen(path, mode) }
}

/// Interposed `fopen64(3)`: as `fopen`.
///
/// # Safety
/// Same contract as libc's `fopen64`.
#[no_mangle]
pub unsafe extern "C" fn fopen64(
    path: *const libc::c_char,
    mode: *const libc::c_char,
) -> *mut libc::FILE {
    // SAFETY: the caller's path.
    if let Some(f) = unsafe { random_device_stream(path) } {
        return f;
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real_fopen64(path, mode) }
}

/// Interposed `epoll_ctl(2)`: observed, not changed — whether the server
/// wants to write more to a replay connection (a reply it sends in
/// several turns) tells a backup's pump that the reply is not complete.
///
/// # Safety
/// Same contract as libc's `epoll_ctl`.
#[no_mangle]
pub unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: *mut libc::epoll_event,
) -> c_int {
    if dispatch::tracked(fd) && dispatch::is_replay(fd) {
        if op != libc::EPOLL_CTL_DEL && !ev.is_null() {
            // SAFETY: a non-null event of EPOLL_CTL_ADD/MOD is the caller's
            // valid epoll_event; packed fields are read by copy.
            let (key, events) = unsafe { ((*ev).u64, (*ev).events) };
            let reads = events & libc::EPOLLIN as u32 != 0;
            let _ = caught(|| dispatch::wait_key(fd, epfd, key, reads));
        } else if op == libc::EPOLL_CTL_DEL {
            let _ = caught(|| dispatch::wait_key(fd, -1, 0, false));
        }
        let wants = op != libc::EPOLL_CTL_DEL
            && !ev.is_null()
            // SAFETY: a non-null event of EPOLL_CTL_ADD/MOD is the caller's
            // valid epoll_event.
            && unsafe { (*ev).events } & libc::EPOLLOUT as u32 != 0;
        let _ = caught(|| dispatch::write_interest(fd, wants));
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real_epoll_ctl(epfd, op, fd, ev) }
}

/// Interposed `epoll_create(2)`: the server's epoll instances name its
/// event loops (see `loops`).
///
/// # Safety
/// Same contract as libc's `epoll_create`.
#[no_mangle]
pub unsafe extern "C" fn epoll_create(size: c_int) -> c_int {
    // SAFETY: forwarding the caller's argument.
    let fd = unsafe { real_epoll_create(size) };
    epoll_created(fd);
    fd
}

/// Interposed `epoll_create1(2)`: as `epoll_create`.
///
/// # Safety
/// Same contract as libc's `epoll_create1`.
#[no_mangle]
pub unsafe extern "C" fn epoll_create1(flags: c_int) -> c_int {
    // SAFETY: forwarding the caller's argument.
    let fd = unsafe { real_epoll_create1(flags) };
    epoll_created(fd);
    fd
}

/// Names the server's new epoll instance `fd` (not the preload's own).
fn epoll_created(fd: c_int) {
    if fd >= 0 && !in_hook() {
        crate::loops::created(fd);
    }
}

/// The server's own handlers of the stop signals, by signal number (the
/// preload's relay runs first; see `clock::stop_signalled`).
static STOP_HANDLERS: [AtomicUsize; 32] = [const { AtomicUsize::new(0) }; 32];

/// Whether `sig` stops a server (its handler is relayed).
fn is_stop_signal(sig: c_int) -> bool {
    sig == libc::SIGTERM || sig == libc::SIGINT
}

/// Whether `h` is a handler function (not SIG_DFL, SIG_IGN or SIG_ERR).
fn is_function(h: libc::sighandler_t) -> bool {
    h != libc::SIG_DFL && h != libc::SIG_IGN && h != libc::SIG_ERR
}

extern "C" fn relay_stop(sig: c_int) {
    crate::clock::stop_signalled();
    let h = STOP_HANDLERS[sig as usize & 31].load(Ordering::Acquire);
    if is_function(h) {
        // SAFETY: `h` is the server's own plain handler for `sig`.
        let f: extern "C" fn(c_int) = unsafe { std::mem::transmute(h) };
        f(sig);
    }
}

extern "C" fn relay_stop_info(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    crate::clock::stop_signalled();
    let h = STOP_HANDLERS[sig as usize & 31].load(Ordering::Acquire);
    if is_function(h) {
        // SAFETY: `h` is the server's own SA_SIGINFO handler for `sig`,
        // called with the kernel's arguments.
        let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) =
            unsafe { std::mem::transmute(h) };
        f(sig, info, ctx);
    }
}

/// The relay standing in for handler `h`, recorded as the server's.
fn relay_for(sig: c_int, h: libc::sighandler_t, siginfo: bool) -> libc::sighandler_t {
    STOP_HANDLERS[sig as usize & 31].store(h, Ordering::Release);
    if siginfo {
        relay_stop_info as *const () as libc::sighandler_t
    } else {
        relay_stop as *const () as libc::sighandler_t
    }
}

/// What the server set as `sig`'s handler, where `h` may be a relay.
fn unrelayed(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t {
    if h == relay_stop as *const () as libc::sighandler_t
        || h == relay_stop_info as *const () as libc::sighandler_t
    {
        STOP_HANDLERS[sig as usize & 31].load(Ordering::Acquire)
    } else {
        h
    }
}

/// Interposed `sigaction(2)`: a server's SIGTERM/SIGINT handler runs after
/// the preload notes the stop (its clock then runs free: see `clock`).
///
/// # Safety
/// Same contract as libc's `sigaction`.
#[no_mangle]
pub unsafe extern "C" fn sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    let mut mine = None;
    if is_stop_signal(sig) && !act.is_null() && !in_hook() {
        // SAFETY: a non-null `act` is the caller's valid sigaction.
        let mut a = unsafe { *act };
        if is_function(a.sa_sigaction) {
            a.sa_sigaction = relay_for(sig, a.sa_sigaction, a.sa_flags & libc::SA_SIGINFO != 0);
            mine = Some(a);
        }
    }
    let act = mine.as_ref().map_or(act, |a| a as *const libc::sigaction);
    // SAFETY: forwarding the caller's arguments (or our copy of `act`).
    let r = unsafe { real_sigaction(sig, act, old) };
    if r == 0 && !old.is_null() && is_stop_signal(sig) {
        // SAFETY: the kernel filled the caller's `old`.
        unsafe { (*old).sa_sigaction = unrelayed(sig, (*old).sa_sigaction) };
    }
    r
}

/// Interposed `signal(3)`: as `sigaction` (glibc's `signal` does not go
/// through the exported `sigaction`).
///
/// # Safety
/// Same contract as libc's `signal`.
#[no_mangle]
pub unsafe extern "C" fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    let relayed = is_stop_signal(sig) && is_function(handler) && !in_hook();
    let h = if relayed {
        relay_for(sig, handler, false)
    } else {
        handler
    };
    // SAFETY: forwarding the caller's arguments (or the relay).
    let prev = unsafe { real_signal(sig, h) };
    if is_stop_signal(sig) {
        unrelayed(sig, prev)
    } else {
        prev
    }
}

/// Reports which replay connections a poll set waits to write to.
///
/// # Safety
/// `fds` must point to `n` valid pollfds (or be null with `n` 0).
unsafe fn poll_interest(fds: *const libc::pollfd, n: libc::nfds_t) {
    if fds.is_null() || n == 0 || !dispatch::passive_hooked() {
        return;
    }
    // SAFETY: per the contract.
    let set = unsafe { std::slice::from_raw_parts(fds, n as usize) };
    for p in set {
        if dispatch::tracked(p.fd) && dispatch::is_replay(p.fd) {
            let _ = caught(|| dispatch::write_interest(p.fd, p.events & libc::POLLOUT != 0));
        }
    }
}

/// Reports which replay connections a select write set waits on.
///
/// # Safety
/// `w` must be null or a valid fd_set covering fds below `n`.
unsafe fn select_interest(n: c_int, w: *const libc::fd_set) {
    if !dispatch::passive_hooked() {
        return;
    }
    for fd in 0..n.clamp(0, libc::FD_SETSIZE as c_int) {
        if dispatch::tracked(fd) && dispatch::is_replay(fd) {
            // SAFETY: per the contract; FD_ISSET only reads the set.
            let wants = !w.is_null() && unsafe { libc::FD_ISSET(fd, w) };
            let _ = caught(|| dispatch::write_interest(fd, wants));
        }
    }
}

/// The body of the poll hooks: the server's turn ends, and on a backup
/// the replay connections the log has bytes for are readable (see
/// `epoll_turn`). `real(at_once)` polls, with a zero timeout when
/// `at_once`.
///
/// # Safety
/// `fds` must point to `n` valid pollfds (or be null with `n` 0).
unsafe fn poll_turn(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    real: impl FnOnce(bool) -> c_int,
) -> c_int {
    let Some(_reentry) = Reentry::enter() else {
        return real(false);
    };
    // SAFETY: per the contract.
    unsafe { poll_interest(fds, n) };
    // SAFETY: per the contract.
    event_loop_turn(
        Wait::Scan,
        0,
        !crate::loops::any() && unsafe { poll_serves(fds, n) },
    );
    let (unread, k) = unread_fds();
    let tick = caught(|| crate::apply::tick_due(0)).unwrap_or(false);
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
unsafe fn select_turn(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    real: impl FnOnce(bool) -> c_int,
) -> c_int {
    let Some(_reentry) = Reentry::enter() else {
        return real(false);
    };
    // SAFETY: per the contract.
    unsafe { select_interest(n, w) };
    // SAFETY: per the contract.
    event_loop_turn(
        Wait::Scan,
        0,
        !crate::loops::any() && unsafe { select_serves(n, r) },
    );
    let (unread, k) = unread_fds();
    let tick = caught(|| crate::apply::tick_due(0)).unwrap_or(false);
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
        crate::apply::after_wait(|fd| {
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

/// Interposed `poll(2)`: see `poll_turn`.
///
/// # Safety
/// Same contract as libc's `poll`.
#[no_mangle]
pub unsafe extern "C" fn poll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int) -> c_int {
    // SAFETY: the caller's poll set, forwarded (or a zero timeout).
    unsafe {
        poll_turn(fds, n, |now| {
            real_poll(fds, n, if now { 0 } else { timeout })
        })
    }
}

/// Interposed `ppoll(2)`: see `poll_turn`.
///
/// # Safety
/// Same contract as libc's `ppoll`.
#[no_mangle]
pub unsafe extern "C" fn ppoll(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    timeout: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    let zero = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: the caller's arguments, forwarded (or a zero timeout).
    unsafe {
        poll_turn(fds, n, |now| {
            real_ppoll(fds, n, if now { &zero } else { timeout }, mask)
        })
    }
}

/// Interposed `select(2)`: see `select_turn`.
///
/// # Safety
/// Same contract as libc's `select`.
#[no_mangle]
pub unsafe extern "C" fn select(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    let mut zero = libc::timeval {
        tv_sec: 0,
        tv_usec: 0,
    };
    // SAFETY: the caller's arguments, forwarded (or a zero timeout).
    unsafe {
        select_turn(n, r, w, e, |now| {
            real_select(n, r, w, e, if now { &mut zero } else { timeout })
        })
    }
}

/// Interposed `pselect(2)`: see `select_turn`.
///
/// # Safety
/// Same contract as libc's `pselect`.
#[no_mangle]
pub unsafe extern "C" fn pselect(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    timeout: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    let zero = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: the caller's arguments, forwarded (or a zero timeout).
    unsafe {
        select_turn(n, r, w, e, |now| {
            real_pselect(n, r, w, e, if now { &zero } else { timeout }, mask)
        })
    }
}
