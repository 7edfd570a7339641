//! The raw libc layer under the rest of the crate: the real (next)
//! definitions of the interposed functions ([`real`]) and safe wrappers
//! over the raw calls the preload itself makes, which use the real
//! functions, never the hooks. Imports nothing of the crate's, so every
//! other module may use it.

pub mod published;
pub mod real;

use std::ffi::{c_int, c_void, CStr};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::sync::atomic::{AtomicU64, Ordering};

use libc::{sockaddr, socklen_t};

use real::{
    real_clock_gettime, real_close, real_epoll_ctl, real_read, real_recv, real_send, real_shutdown,
    real_write,
};

/// This thread's errno.
pub fn errno() -> c_int {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Sets this thread's errno.
pub fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e }
}

/// Writes all of `bytes` to `fd` with the real `write`, retrying on
/// EINTR; gives up silently on other errors (it is used for logging).
pub fn write_all(fd: i32, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is a live slice of `len` bytes.
        let n = unsafe { real_write(fd, bytes.as_ptr() as *const c_void, bytes.len()) };
        if n > 0 {
            bytes = &bytes[n as usize..];
        } else if n < 0 && errno() == libc::EINTR {
            continue;
        } else {
            return;
        }
    }
}

/// One non-blocking send of `bytes` on socket `fd` with the real
/// `send` (MSG_DONTWAIT | MSG_NOSIGNAL): never waits and never raises
/// SIGPIPE; returns how many bytes went (0 on any error).
pub fn send_nonblocking(fd: i32, bytes: &[u8]) -> usize {
    // SAFETY: `bytes` is a live slice of `len` bytes; the flags only
    // keep the call from blocking or signalling.
    let n = unsafe {
        real_send(
            fd,
            bytes.as_ptr() as *const c_void,
            bytes.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    n.max(0) as usize
}

/// Reads and drops whatever socket `fd` already received, without
/// waiting (real `recv`, MSG_DONTWAIT): a close with unread input
/// would send a reset that can cost the peer a reply sent just before.
pub fn discard_input(fd: i32) {
    let mut buf = [0u8; 4096];
    // A fresh socket holds little; a bound keeps this short anyway.
    for _ in 0..16 {
        // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`.
        let n = unsafe {
            real_recv(
                fd,
                buf.as_mut_ptr() as *mut c_void,
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n <= 0 {
            return;
        }
    }
}

/// Closes `fd` with the real `close` (no CLOSE entry).
pub fn close(fd: i32) {
    // SAFETY: closing an fd this process owns; errors are irrelevant.
    unsafe { real_close(fd) };
}

/// Shuts `fd` down both ways with the real `shutdown`, so its client
/// sees the connection end while the server still holds the fd.
pub fn shutdown_both(fd: i32) {
    // SAFETY: shutdown on an fd number has no memory preconditions.
    unsafe { real_shutdown(fd, libc::SHUT_RDWR) };
}

/// A fresh non-blocking, close-on-exec eventfd (None: the kernel
/// refused one).
pub fn eventfd() -> Option<i32> {
    // SAFETY: eventfd takes no pointer argument.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    (fd >= 0).then_some(fd)
}

/// Adds `fd` to epoll instance `epfd`, readable, with `key`, with the
/// real `epoll_ctl` (the fd table does not see it).
pub fn epoll_add(epfd: i32, fd: i32, key: u64) -> bool {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: key,
    };
    // SAFETY: `ev` is a valid event on the stack for the call.
    unsafe { real_epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) == 0 }
}

/// One non-blocking read of `fd` into `buf` with the real `read`
/// (errors ignored: it empties an alarm).
pub fn read_nonblocking(fd: i32, buf: &mut [u8]) {
    // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`.
    unsafe { real_read(fd, buf.as_mut_ptr() as *mut c_void, buf.len()) };
}

/// Whether `fd` has O_NONBLOCK set.
pub fn is_nonblocking(fd: i32) -> bool {
    // SAFETY: F_GETFL takes no pointer argument.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    fl >= 0 && fl & libc::O_NONBLOCK != 0
}

fn to_addr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in,
            // which is smaller than and alignment-compatible with it.
            let a = unsafe { &*(ss as *const libc::sockaddr_storage as *const libc::sockaddr_in) };
            Some(SocketAddr::from((
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let a = unsafe { &*(ss as *const libc::sockaddr_storage as *const libc::sockaddr_in6) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

fn sockname(fd: i32, peer: bool) -> Option<SocketAddr> {
    // SAFETY: sockaddr_storage is plain data; all-zero is a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as socklen_t;
    let p = &mut ss as *mut libc::sockaddr_storage as *mut sockaddr;
    // SAFETY: the kernel writes at most `len` bytes into `ss`.
    let r = unsafe {
        if peer {
            libc::getpeername(fd, p, &mut len)
        } else {
            libc::getsockname(fd, p, &mut len)
        }
    };
    if r == 0 {
        to_addr(&ss)
    } else {
        None
    }
}

/// The local address of a socket (None: not an IP socket).
pub fn local_addr(fd: i32) -> Option<SocketAddr> {
    sockname(fd, false)
}

/// The peer address of a connected socket.
pub fn peer_addr(fd: i32) -> Option<SocketAddr> {
    sockname(fd, true)
}

/// Ends the process at once, without atexit handlers or unwinding
/// through the host program.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and has no preconditions.
    unsafe { libc::_exit(code) }
}

/// The real wall clock, µs since the epoch.
pub fn realtime_us() -> u64 {
    // SAFETY: timespec is plain data; all-zero is a valid value.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: the real clock_gettime writing into a stack timespec.
    unsafe { real_clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
}

/// The real monotonic clock in µs.
pub fn monotonic_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: the real clock_gettime writing into a stack timespec.
    unsafe { real_clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
}

/// Whether environment variable `name` is set, without allocating.
pub fn env_is_set(name: &CStr) -> bool {
    // SAFETY: getenv with a NUL-terminated name; it only reads the
    // environment (the preload never sets variables).
    !unsafe { libc::getenv(name.as_ptr()) }.is_null()
}

/// `LOCKSTEP_ORIGIN_US` (µs; 0: unset or not a number), read once: at load
/// (the load-time constructor asks first), before the server can rewrite
/// its environment as Redis's process-title code does. `clock` decides
/// what an absent origin means.
pub fn origin_env_us() -> u64 {
    match ORIGIN_ENV.load(Ordering::Acquire) {
        NOT_READ => {
            let us = env_u64(c"LOCKSTEP_ORIGIN_US").unwrap_or(0);
            ORIGIN_ENV.store(us.min(NOT_READ - 1), Ordering::Release);
            us
        }
        us => us,
    }
}

/// [`origin_env_us`] before its first read.
const NOT_READ: u64 = u64::MAX;
static ORIGIN_ENV: AtomicU64 = AtomicU64::new(NOT_READ);

/// Environment variable `name` as a decimal number, without allocating
/// (None: unset, empty, or not all digits, or past u64).
pub fn env_u64(name: &CStr) -> Option<u64> {
    // SAFETY: getenv with a NUL-terminated name; it only reads the
    // environment (the preload never sets variables).
    let p = unsafe { libc::getenv(name.as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: a non-null getenv result is a NUL-terminated string that
    // stays valid while nobody sets variables: the preload never does, and
    // it reads this at load time, before the server's code runs.
    let digits = unsafe { CStr::from_ptr(p) }.to_bytes();
    parse_u64(digits)
}

/// `digits` as a decimal u64 (None: empty, another byte, or too big).
pub fn parse_u64(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &b| {
        if b.is_ascii_digit() {
            n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

/// Whether the calling thread is the process's main thread (its id is
/// the pid): the server's start-up runs there.
pub fn is_main_thread() -> bool {
    thread_local! {
        static MAIN: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
    }
    MAIN.try_with(|m| {
        *m.get().get_or_insert_with(|| {
            // SAFETY: gettid and getpid take no arguments and cannot fail.
            unsafe { libc::syscall(libc::SYS_gettid) == libc::getpid() as libc::c_long }
        })
    })
    .unwrap_or(false)
}

/// Registers `child` to run in the child after every fork.
pub fn at_fork_child(child: extern "C" fn()) {
    // SAFETY: registers a plain function without captured state; the
    // handler only stores to an atomic (async-signal-safe).
    let r = unsafe { libc::pthread_atfork(None, None, Some(child)) };
    if r != 0 {
        log::warn!("pthread_atfork failed ({r}): a forked child would not become inert");
    }
}
