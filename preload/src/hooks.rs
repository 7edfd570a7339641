//! The interposed libc functions. This module is the preload's only home of
//! `unsafe`: resolving the real functions, the exported symbols, reading
//! iovecs, errno, and the fork handler.
//!
//! Real functions are resolved with `dlsym(RTLD_NEXT)` and cached, instead
//! of redhook's wrappers: redhook 2.0 catches a panic in a hook and then
//! calls the *real* function, which for a leader's `recv` would hand the
//! server bytes that were never replicated. Here a panic fails the
//! connection instead.
//!
//! Every hook: do the real call, then (unless inside another hook, in a
//! forked child, or the fd is not a tracked client) let `state` decide.

use std::cell::Cell;
use std::ffi::{c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use libc::{iovec, msghdr, size_t, sockaddr, socklen_t, ssize_t};

use crate::state::{self, Init, Verdict, INERT};

thread_local! {
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` unless this thread is already inside a hook (the preload's own
/// I/O, logging, initialisation) or the process is a forked child.
fn guarded<T>(f: impl FnOnce() -> T) -> Option<T> {
    if INERT.load(std::sync::atomic::Ordering::Relaxed) {
        return None;
    }
    let busy = IN_HOOK.try_with(|c| c.replace(true)).unwrap_or(true);
    if busy {
        return None;
    }
    let r = catch_unwind(AssertUnwindSafe(f));
    let _ = IN_HOOK.try_with(|c| c.set(false));
    match r {
        Ok(v) => Some(v),
        Err(_) => {
            log::error!("lockstep: internal error in a hook; failing the connection");
            None
        }
    }
}

macro_rules! real {
    ($name:ident : fn($($arg:ty),*) -> $ret:ty) => {
        #[allow(non_snake_case)]
        pub(super) fn $name() -> unsafe extern "C" fn($($arg),*) -> $ret {
            static CELL: once_cell::sync::OnceCell<usize> = once_cell::sync::OnceCell::new();
            let p = *CELL.get_or_init(|| {
                let sym = concat!(stringify!($name), "\0");
                // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name.
                unsafe { libc::dlsym(libc::RTLD_NEXT, sym.as_ptr() as *const libc::c_char) as usize }
            });
            if p == 0 {
                // SAFETY: abort is always safe to call; a libc without
                // this function cannot run the server anyway.
                unsafe { libc::abort() }
            }
            // SAFETY: the symbol resolved by dlsym has exactly this C
            // signature (it is the libc function of the same name).
            unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($arg),*) -> $ret>(p) }
        }
    };
}

mod real {
    use super::*;
    real!(read: fn(c_int, *mut c_void, size_t) -> ssize_t);
    real!(readv: fn(c_int, *const iovec, c_int) -> ssize_t);
    real!(recv: fn(c_int, *mut c_void, size_t, c_int) -> ssize_t);
    real!(recvfrom: fn(c_int, *mut c_void, size_t, c_int, *mut sockaddr, *mut socklen_t) -> ssize_t);
    real!(recvmsg: fn(c_int, *mut msghdr, c_int) -> ssize_t);
    real!(__read_chk: fn(c_int, *mut c_void, size_t, size_t) -> ssize_t);
    real!(__recv_chk: fn(c_int, *mut c_void, size_t, size_t, c_int) -> ssize_t);
    real!(__recvfrom_chk: fn(c_int, *mut c_void, size_t, size_t, c_int, *mut sockaddr, *mut socklen_t) -> ssize_t);
    real!(accept: fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int);
    real!(accept4: fn(c_int, *mut sockaddr, *mut socklen_t, c_int) -> c_int);
    real!(close: fn(c_int) -> c_int);
    real!(shutdown: fn(c_int, c_int) -> c_int);
    real!(write: fn(c_int, *const c_void, size_t) -> ssize_t);
    real!(writev: fn(c_int, *const iovec, c_int) -> ssize_t);
    real!(send: fn(c_int, *const c_void, size_t, c_int) -> ssize_t);
    real!(sendto: fn(c_int, *const c_void, size_t, c_int, *const sockaddr, socklen_t) -> ssize_t);
    real!(sendmsg: fn(c_int, *const msghdr, c_int) -> ssize_t);
}

/// Writes to stderr with the real `write` (for the logger).
pub fn stderr_write(bytes: &[u8]) {
    // SAFETY: writing a valid slice to fd 2 with the real libc write.
    unsafe {
        real::write()(2, bytes.as_ptr() as *const c_void, bytes.len());
    }
}

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Gathers the first `n` bytes described by `iov` into one slice (or
/// borrows the first buffer when it holds them all).
///
/// # Safety
/// `iov` must point to `cnt` valid iovecs whose buffers hold at least `n`
/// initialised bytes in total (the real call just filled them).
unsafe fn gather<'a>(iov: *const iovec, cnt: usize, n: usize, scratch: &'a mut Vec<u8>) -> &'a [u8] {
    // SAFETY: per the contract, `iov[..cnt]` is valid.
    let iovs = unsafe { std::slice::from_raw_parts(iov, cnt) };
    scratch.clear();
    let mut left = n;
    for v in iovs {
        if left == 0 {
            break;
        }
        let take = v.iov_len.min(left);
        // SAFETY: the real call wrote `take` bytes at `iov_base`.
        scratch.extend_from_slice(unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, take) });
        left -= take;
    }
    scratch
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(Vec::with_capacity(64 * 1024));
}

/// The shared tail of every recv-type hook.
fn after_input(fd: c_int, n: ssize_t, data: impl FnOnce() -> Vec<u8>, direct: Option<&[u8]>) -> ssize_t {
    let err = errno();
    let verdict = guarded(|| match state::state() {
        Init::On(p) if p.tracked(fd) => match direct {
            Some(d) => p.on_input(fd, n, err, d),
            None => {
                let bytes = if n > 0 { data() } else { Vec::new() };
                p.on_input(fd, n, err, &bytes)
            }
        },
        _ => Verdict::Pass,
    });
    match verdict {
        Some(Verdict::Pass) | None => {
            set_errno(err);
            n
        }
        Some(Verdict::Reset) => {
            set_errno(libc::ECONNRESET);
            -1
        }
    }
}

/// Slice of a buffer the real call filled with `n` bytes.
fn filled<'a>(buf: *const c_void, n: ssize_t) -> Option<&'a [u8]> {
    if n > 0 && !buf.is_null() {
        // SAFETY: the real call just wrote `n` bytes at `buf`.
        Some(unsafe { std::slice::from_raw_parts(buf as *const u8, n as usize) })
    } else {
        Some(&[])
    }
}

/// # Safety
/// Called by the server as libc's `read`.
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t {
    // SAFETY: forwarding the caller's arguments to the real function.
    let n = unsafe { real::read()(fd, buf, count) };
    after_input(fd, n, Vec::new, filled(buf, n))
}

/// # Safety
/// Called by the server as glibc's fortified `__read_chk`.
#[no_mangle]
pub unsafe extern "C" fn __read_chk(fd: c_int, buf: *mut c_void, count: size_t, buflen: size_t) -> ssize_t {
    // SAFETY: forwarding the caller's arguments to the real function.
    let n = unsafe { real::__read_chk()(fd, buf, count, buflen) };
    after_input(fd, n, Vec::new, filled(buf, n))
}

/// # Safety
/// Called by the server as libc's `recv`.
#[no_mangle]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t {
    // SAFETY: forwarding the caller's arguments to the real function.
    let n = unsafe { real::recv()(fd, buf, len, flags) };
    if flags & libc::MSG_PEEK != 0 {
        return n;
    }
    after_input(fd, n, Vec::new, filled(buf, n))
}

/// # Safety
/// Called by the server as glibc's fortified `__recv_chk`.
#[no_mangle]
pub unsafe extern "C" fn __recv_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t, flags: c_int) -> ssize_t {
    // SAFETY: forwarding the caller's arguments to the real function.
    let n = unsafe { real::__recv_chk()(fd, buf, len, buflen, flags) };
    if flags & libc::MSG_PEEK != 0 {
        return n;
    }
    after_input(fd, n, Vec::new, filled(buf, n))
}

/// # Safety
/// Called by the server as libc's `recvfrom`.
#[no_mangle]
pub unsafe extern "C" fn recvfrom(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int, addr: *mut sockaddr, alen: *mut socklen_t) -> ssize_t {
    // SAFETY: forwarding the caller's arguments to the real function.
    let n = unsafe { real::recvfrom()(fd, buf, len, flags, addr, alen) };
    if flags & libc::MSG_PEEK != 0 {
        return n;
    }
    after_input(fd, n, Vec::new, filled(buf, n))
}

/// # Safety
/// Called by the server as glibc's fortified `__recvfrom_chk`.
#[no_mangle]
pub unsafe extern "C" fn __recvfrom_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t, flags: c_int, addr: *mut sockaddr, alen: *mut socklen_t) -> ssize_t {
    // SAFETY: forwarding the caller's arguments to the real function.
    let n = unsafe { real::__recvfrom_chk()(fd, buf, len, buflen, flags, addr, alen) };
    if flags & libc::MSG_PEEK != 0 {
        return n;
    }
    after_input(fd, n, Vec::new, filled(buf, n))
}

/// # Safety
/// Called by the server as libc's `readv`.
#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    // SAFETY: forwarding the caller's arguments to the real function.
    let n = unsafe { real::readv()(fd, iov, cnt) };
    let data = || {
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            // SAFETY: the real readv filled `n` bytes into `iov[..cnt]`.
            unsafe { gather(iov, cnt.max(0) as usize, n as usize, &mut s) }.to_vec()
        })
    };
    after_input(fd, n, data, None)
}

/// # Safety
/// Called by the server as libc's `recvmsg`.
#[no_mangle]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    // SAFETY: forwarding the caller's arguments to the real function.
    let n = unsafe { real::recvmsg()(fd, msg, flags) };
    if flags & libc::MSG_PEEK != 0 || msg.is_null() {
        return n;
    }
    // SAFETY: `msg` is the caller's valid msghdr.
    let (iov, cnt) = unsafe { ((*msg).msg_iov as *const iovec, (*msg).msg_iovlen) };
    let data = || {
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            // SAFETY: the real recvmsg filled `n` bytes into the iovecs.
            unsafe { gather(iov, cnt, n as usize, &mut s) }.to_vec()
        })
    };
    after_input(fd, n, data, None)
}

fn local_addr(fd: c_int) -> Option<std::net::SocketAddr> {
    let mut ss: libc::sockaddr_storage = unsafe_zeroed();
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as socklen_t;
    // SAFETY: getsockname writes at most `len` bytes into `ss`.
    let r = unsafe { libc::getsockname(fd, &mut ss as *mut _ as *mut sockaddr, &mut len) };
    (r == 0).then(|| to_socket_addr(&ss)).flatten()
}

fn peer_addr(fd: c_int) -> Option<std::net::SocketAddr> {
    let mut ss: libc::sockaddr_storage = unsafe_zeroed();
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as socklen_t;
    // SAFETY: getpeername writes at most `len` bytes into `ss`.
    let r = unsafe { libc::getpeername(fd, &mut ss as *mut _ as *mut sockaddr, &mut len) };
    (r == 0).then(|| to_socket_addr(&ss)).flatten()
}

fn unsafe_zeroed() -> libc::sockaddr_storage {
    // SAFETY: sockaddr_storage is plain old data; all-zero is valid.
    unsafe { std::mem::zeroed() }
}

fn to_socket_addr(ss: &libc::sockaddr_storage) -> Option<std::net::SocketAddr> {
    match ss.ss_family as c_int {
        libc::AF_INET => {
            // SAFETY: the family says this storage holds a sockaddr_in.
            let a = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            Some(std::net::SocketAddr::from((u32::from_be(a.sin_addr.s_addr).to_be_bytes(), u16::from_be(a.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this storage holds a sockaddr_in6.
            let a = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            Some(std::net::SocketAddr::from((a.sin6_addr.s6_addr, u16::from_be(a.sin6_port))))
        }
        _ => None,
    }
}

/// The shared tail of accept and accept4.
fn after_accept(listener: c_int, fd: c_int) -> c_int {
    if fd < 0 {
        return fd;
    }
    let err = errno();
    let keep = guarded(|| match state::state() {
        Init::Off => true,
        Init::Broken(why) => {
            let line = format!("lockstep: cannot replicate: {why}; refusing to serve (set LOCKSTEP_ALLOW_UNREPLICATED=1 to run unreplicated)\n");
            stderr_write(line.as_bytes());
            // SAFETY: _exit ends the process without running handlers
            // that could touch half-initialised state.
            unsafe { libc::_exit(1) }
        }
        Init::On(p) => {
            let app = local_addr(listener).map(|a| p.is_app_listener(a)).unwrap_or(false);
            if !app {
                return true;
            }
            let port = peer_addr(fd).map(|a| a.port()).unwrap_or(0);
            p.on_accept(fd, port)
        }
    });
    match keep {
        Some(false) => {
            // SAFETY: closing the fd the real accept just returned.
            unsafe { real::close()(fd) };
            set_errno(libc::EAGAIN);
            -1
        }
        _ => {
            set_errno(err);
            fd
        }
    }
}

/// # Safety
/// Called by the server as libc's `accept`.
#[no_mangle]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: forwarding the caller's arguments to the real function.
    let c = unsafe { real::accept()(fd, addr, len) };
    after_accept(fd, c)
}

/// # Safety
/// Called by the server as libc's `accept4`.
#[no_mangle]
pub unsafe extern "C" fn accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int {
    // SAFETY: forwarding the caller's arguments to the real function.
    let c = unsafe { real::accept4()(fd, addr, len, flags) };
    after_accept(fd, c)
}

/// # Safety
/// Called by the server as libc's `close`.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    guarded(|| {
        if let Init::On(p) = state::state() {
            p.on_close(fd);
        }
    });
    // SAFETY: forwarding the caller's argument to the real function.
    unsafe { real::close()(fd) }
}

/// # Safety
/// Called by the server as libc's `shutdown`.
#[no_mangle]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    if how != libc::SHUT_WR {
        guarded(|| {
            if let Init::On(p) = state::state() {
                p.log_close(fd);
            }
        });
    }
    // SAFETY: forwarding the caller's arguments to the real function.
    unsafe { real::shutdown()(fd, how) }
}

fn after_output(fd: c_int, n: ssize_t, bytes: impl FnOnce() -> Vec<u8>) -> ssize_t {
    if n > 0 {
        let err = errno();
        guarded(|| {
            if let Init::On(p) = state::state() {
                if p.tracked(fd) {
                    p.on_output(fd, &bytes());
                }
            }
        });
        set_errno(err);
    }
    n
}

fn copy(buf: *const c_void, n: ssize_t) -> Vec<u8> {
    // SAFETY: the real call just sent `n` bytes from `buf`.
    unsafe { std::slice::from_raw_parts(buf as *const u8, n as usize) }.to_vec()
}

/// # Safety
/// Called by the server as libc's `write`.
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t {
    // SAFETY: forwarding the caller's arguments to the real function.
    let n = unsafe { real::write()(fd, buf, count) };
    after_output(fd, n, || copy(buf, n))
}

/// # Safety
/// Called by the server as libc's `send`.
#[no_mangle]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t {
    // SAFETY: forwarding the caller's arguments to the real function.
    let n = unsafe { real::send()(fd, buf, len, flags) };
    after_output(fd, n, || copy(buf, n))
}

/// # Safety
/// Called by the server as libc's `sendto`.
#[no_mangle]
pub unsafe extern "C" fn sendto(fd: c_int, buf: *const c_void, len: size_t, flags: c_int, addr: *const sockaddr, alen: socklen_t) -> ssize_t {
    // SAFETY: forwarding the caller's arguments to the real function.
    let n = unsafe { real::sendto()(fd, buf, len, flags, addr, alen) };
    after_output(fd, n, || copy(buf, n))
}

/// # Safety
/// Called by the server as libc's `writev`.
#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    // SAFETY: forwarding the caller's arguments to the real function.
    let n = unsafe { real::writev()(fd, iov, cnt) };
    after_output(fd, n, || {
        let mut v = Vec::new();
        // SAFETY: the real writev sent `n` bytes from `iov[..cnt]`.
        unsafe { gather(iov, cnt.max(0) as usize, n as usize, &mut v) };
        v
    })
}

/// # Safety
/// Called by the server as libc's `sendmsg`.
#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    // SAFETY: forwarding the caller's arguments to the real function.
    let n = unsafe { real::sendmsg()(fd, msg, flags) };
    if msg.is_null() {
        return n;
    }
    after_output(fd, n, || {
        let mut v = Vec::new();
        // SAFETY: the real sendmsg sent `n` bytes from the caller's iovecs.
        unsafe { gather((*msg).msg_iov, (*msg).msg_iovlen, n as usize, &mut v) };
        v
    })
}

extern "C" fn in_forked_child() {
    INERT.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Registers the fork handler: a forked child (Redis BGSAVE) passes
/// everything through and never replicates, closes or acks for its parent.
pub fn register_fork_handler() {
    // SAFETY: registering a plain extern "C" fn with no captured state.
    unsafe {
        libc::pthread_atfork(None, None, Some(in_forked_child));
    }
}

/// Name of a hooked symbol, for the import check.
pub fn hooked_symbols() -> &'static [&'static CStr] {
    &[
        c"read", c"readv", c"recv", c"recvfrom", c"recvmsg", c"__read_chk", c"__recv_chk", c"__recvfrom_chk",
        c"accept", c"accept4", c"close", c"shutdown", c"write", c"writev", c"send", c"sendto", c"sendmsg",
    ]
}
