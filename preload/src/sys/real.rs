//! The real-symbol table: the next definition (`dlsym(RTLD_NEXT, ..)`) of
//! every interposed libc function, resolved by a load-time constructor so
//! that no hook calls `dlsym` on a hot path. A call made while `dlsym`
//! itself is resolving on the same thread (an allocator calling `read`
//! during its initialisation) uses the raw system call instead of
//! recursing.

use std::cell::Cell;
use std::ffi::{c_int, c_long, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

use libc::{iovec, msghdr, size_t, sockaddr, socklen_t, ssize_t};

thread_local! {
    /// Set while this thread is inside `dlsym`.
    static RESOLVING: Cell<bool> = const { Cell::new(false) };
}

/// A lazily resolved pointer to the next definition of a libc symbol.
struct RealFn {
    name: &'static CStr,
    addr: AtomicUsize,
}

impl RealFn {
    const fn new(name: &'static CStr) -> RealFn {
        RealFn {
            name,
            addr: AtomicUsize::new(0),
        }
    }

    /// The function's address, or 0 when it cannot be resolved right now
    /// (inside `dlsym` on this thread): the caller uses the raw syscall.
    fn addr(&self) -> usize {
        let a = self.addr.load(Ordering::Acquire);
        if a != 0 {
            return a;
        }
        if RESOLVING.try_with(|r| r.replace(true)).unwrap_or(true) {
            return 0;
        }
        // SAFETY: dlsym with the RTLD_NEXT pseudo-handle and a NUL-terminated
        // name has no other preconditions.
        let p = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr()) } as usize;
        let _ = RESOLVING.try_with(|r| r.set(false));
        if p == 0 {
            let mut msg = [0u8; 128];
            let text = b"lockstep: dlsym(RTLD_NEXT) cannot find libc's ";
            let name = self.name.to_bytes();
            let n = (text.len() + name.len()).min(msg.len() - 1);
            msg[..text.len()].copy_from_slice(text);
            msg[text.len()..n].copy_from_slice(&name[..n - text.len()]);
            msg[n] = b'\n';
            // SAFETY: writing a stack buffer to fd 2 with the raw syscall,
            // then aborting: without the real function the process cannot
            // go on.
            unsafe {
                libc::syscall(libc::SYS_write, 2, msg.as_ptr(), n + 1);
                libc::abort();
            }
        }
        self.addr.store(p, Ordering::Release);
        p
    }
}

/// Defines a cached real function and a typed caller `$call` for it that
/// falls back to `$fallback` (a raw syscall) when it cannot be resolved yet.
macro_rules! real_fn {
    ($static:ident, $call:ident, $sym:literal, ($($a:ident : $t:ty),*) -> $r:ty, $fallback:expr) => {
        static $static: RealFn = RealFn::new($sym);

        /// Calls the real (next) definition of the symbol.
        ///
        /// # Safety
        /// Same contract as the libc function.
        #[allow(clippy::too_many_arguments)]
        pub(crate) unsafe fn $call($($a: $t),*) -> $r {
            let addr = $static.addr();
            if addr == 0 {
                // SAFETY: the caller upholds the libc function's contract,
                // which is the system call's.
                // (Some fallbacks are safe functions.)
                #[allow(unused_unsafe)]
                let r = unsafe { $fallback };
                return r;
            }
            // SAFETY: `addr` is the address dlsym returned for this libc
            // symbol, whose C signature is exactly this one.
            let f = unsafe {
                std::mem::transmute::<usize, unsafe extern "C" fn($($t),*) -> $r>(addr)
            };
            // SAFETY: the caller upholds the libc function's contract.
            unsafe { f($($a),*) }
        }
    };
}

fn sys_ret(r: c_long) -> ssize_t {
    r as ssize_t
}

real_fn!(REAL_READ, real_read, c"read", (fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t,
    sys_ret(libc::syscall(libc::SYS_read, fd, buf, n)));
real_fn!(REAL_READV, real_readv, c"readv", (fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t,
    sys_ret(libc::syscall(libc::SYS_readv, fd, iov, cnt)));
real_fn!(REAL_RECV, real_recv, c"recv", (fd: c_int, buf: *mut c_void, n: size_t, fl: c_int) -> ssize_t,
    sys_ret(libc::syscall(libc::SYS_recvfrom, fd, buf, n, fl, 0usize, 0usize)));
real_fn!(REAL_RECVFROM, real_recvfrom, c"recvfrom",
    (fd: c_int, buf: *mut c_void, n: size_t, fl: c_int, a: *mut sockaddr, al: *mut socklen_t) -> ssize_t,
    sys_ret(libc::syscall(libc::SYS_recvfrom, fd, buf, n, fl, a, al)));
real_fn!(REAL_RECVMSG, real_recvmsg, c"recvmsg", (fd: c_int, m: *mut msghdr, fl: c_int) -> ssize_t,
    sys_ret(libc::syscall(libc::SYS_recvmsg, fd, m, fl)));
real_fn!(REAL_READ_CHK, real_read_chk, c"__read_chk",
    (fd: c_int, buf: *mut c_void, n: size_t, bl: size_t) -> ssize_t,
    if n > bl { libc::abort() } else { sys_ret(libc::syscall(libc::SYS_read, fd, buf, n)) });
real_fn!(REAL_RECV_CHK, real_recv_chk, c"__recv_chk",
(fd: c_int, buf: *mut c_void, n: size_t, bl: size_t, fl: c_int) -> ssize_t,
if n > bl { libc::abort() } else {
    sys_ret(libc::syscall(libc::SYS_recvfrom, fd, buf, n, fl, 0usize, 0usize))
});
real_fn!(REAL_RECVFROM_CHK, real_recvfrom_chk, c"__recvfrom_chk",
(fd: c_int, buf: *mut c_void, n: size_t, bl: size_t, fl: c_int, a: *mut sockaddr, al: *mut socklen_t)
    -> ssize_t,
if n > bl { libc::abort() } else {
    sys_ret(libc::syscall(libc::SYS_recvfrom, fd, buf, n, fl, a, al))
});
real_fn!(REAL_ACCEPT, real_accept, c"accept", (fd: c_int, a: *mut sockaddr, al: *mut socklen_t) -> c_int,
    libc::syscall(libc::SYS_accept4, fd, a, al, 0) as c_int);
real_fn!(REAL_ACCEPT4, real_accept4, c"accept4",
    (fd: c_int, a: *mut sockaddr, al: *mut socklen_t, fl: c_int) -> c_int,
    libc::syscall(libc::SYS_accept4, fd, a, al, fl) as c_int);
real_fn!(REAL_CLOSE, real_close, c"close", (fd: c_int) -> c_int,
    libc::syscall(libc::SYS_close, fd) as c_int);
real_fn!(REAL_SHUTDOWN, real_shutdown, c"shutdown", (fd: c_int, how: c_int) -> c_int,
    libc::syscall(libc::SYS_shutdown, fd, how) as c_int);
real_fn!(REAL_LISTEN, real_listen, c"listen", (fd: c_int, backlog: c_int) -> c_int,
    libc::syscall(libc::SYS_listen, fd, backlog) as c_int);
real_fn!(REAL_DUP2, real_dup2, c"dup2", (old: c_int, new: c_int) -> c_int,
if old == new {
    if libc::syscall(libc::SYS_fcntl, old, libc::F_GETFD) < 0 { -1 } else { new }
} else {
    libc::syscall(libc::SYS_dup3, old, new, 0) as c_int
});
real_fn!(REAL_DUP3, real_dup3, c"dup3", (old: c_int, new: c_int, fl: c_int) -> c_int,
    libc::syscall(libc::SYS_dup3, old, new, fl) as c_int);
real_fn!(REAL_WRITE, real_write, c"write", (fd: c_int, buf: *const c_void, n: size_t) -> ssize_t,
    sys_ret(libc::syscall(libc::SYS_write, fd, buf, n)));
real_fn!(REAL_WRITEV, real_writev, c"writev", (fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t,
    sys_ret(libc::syscall(libc::SYS_writev, fd, iov, cnt)));
real_fn!(REAL_SEND, real_send, c"send", (fd: c_int, buf: *const c_void, n: size_t, fl: c_int) -> ssize_t,
    sys_ret(libc::syscall(libc::SYS_sendto, fd, buf, n, fl, 0usize, 0usize)));
real_fn!(REAL_SENDTO, real_sendto, c"sendto",
    (fd: c_int, buf: *const c_void, n: size_t, fl: c_int, a: *const sockaddr, al: socklen_t) -> ssize_t,
    sys_ret(libc::syscall(libc::SYS_sendto, fd, buf, n, fl, a, al)));
real_fn!(REAL_SENDMSG, real_sendmsg, c"sendmsg", (fd: c_int, m: *const msghdr, fl: c_int) -> ssize_t,
    sys_ret(libc::syscall(libc::SYS_sendmsg, fd, m, fl)));

// The event-loop waits: observed only (a backup's pump moves on when its
// server comes back to wait), never changed. Without a resolved function
// (inside dlsym, where no server waits) they fail with ENOSYS.
real_fn!(REAL_EPOLL_WAIT, real_epoll_wait, c"epoll_wait",
    (epfd: c_int, ev: *mut libc::epoll_event, max: c_int, t: c_int) -> c_int, unresolved());
real_fn!(REAL_EPOLL_PWAIT, real_epoll_pwait, c"epoll_pwait",
    (epfd: c_int, ev: *mut libc::epoll_event, max: c_int, t: c_int, m: *const libc::sigset_t) -> c_int,
    unresolved());
real_fn!(REAL_POLL, real_poll, c"poll", (fds: *mut libc::pollfd, n: libc::nfds_t, t: c_int) -> c_int,
    unresolved());
real_fn!(REAL_PPOLL, real_ppoll, c"ppoll",
    (fds: *mut libc::pollfd, n: libc::nfds_t, t: *const libc::timespec, m: *const libc::sigset_t) -> c_int,
    unresolved());
real_fn!(REAL_SELECT, real_select, c"select",
    (n: c_int, r: *mut libc::fd_set, w: *mut libc::fd_set, e: *mut libc::fd_set, t: *mut libc::timeval) -> c_int,
    unresolved());
real_fn!(REAL_PSELECT, real_pselect, c"pselect",
    (n: c_int, r: *mut libc::fd_set, w: *mut libc::fd_set, e: *mut libc::fd_set, t: *const libc::timespec,
     m: *const libc::sigset_t) -> c_int,
    unresolved());

real_fn!(REAL_CLOCK_GETTIME, real_clock_gettime, c"clock_gettime",
    (clk: libc::clockid_t, ts: *mut libc::timespec) -> c_int,
    libc::syscall(libc::SYS_clock_gettime, clk, ts) as c_int);
real_fn!(REAL_GETTIMEOFDAY, real_gettimeofday, c"gettimeofday",
    (tv: *mut libc::timeval, tz: *mut c_void) -> c_int,
    libc::syscall(libc::SYS_gettimeofday, tv, tz) as c_int);
real_fn!(REAL_TIME, real_time, c"time", (t: *mut libc::time_t) -> libc::time_t,
    libc::syscall(libc::SYS_time, t) as libc::time_t);
real_fn!(REAL_GETRANDOM, real_getrandom, c"getrandom",
    (buf: *mut c_void, len: size_t, flags: libc::c_uint) -> ssize_t,
    sys_ret(libc::syscall(libc::SYS_getrandom, buf, len, flags)));
real_fn!(REAL_GETENTROPY, real_getentropy, c"getentropy", (buf: *mut c_void, len: size_t) -> c_int,
    if libc::syscall(libc::SYS_getrandom, buf, len, 0) == len as c_long { 0 } else { -1 });
real_fn!(REAL_SRAND, real_srand, c"srand", (seed: libc::c_uint) -> (), ());
real_fn!(REAL_SRANDOM, real_srandom, c"srandom", (seed: libc::c_uint) -> (), ());
real_fn!(REAL_FOPEN, real_fopen, c"fopen",
    (path: *const libc::c_char, mode: *const libc::c_char) -> *mut libc::FILE, std::ptr::null_mut());
real_fn!(REAL_FOPEN64, real_fopen64, c"fopen64",
    (path: *const libc::c_char, mode: *const libc::c_char) -> *mut libc::FILE, std::ptr::null_mut());
real_fn!(REAL_EPOLL_CREATE, real_epoll_create, c"epoll_create", (size: c_int) -> c_int,
    libc::syscall(libc::SYS_epoll_create1, 0) as c_int);
real_fn!(REAL_EPOLL_CREATE1, real_epoll_create1, c"epoll_create1", (flags: c_int) -> c_int,
    libc::syscall(libc::SYS_epoll_create1, flags) as c_int);
real_fn!(REAL_EPOLL_CTL, real_epoll_ctl, c"epoll_ctl",
    (epfd: c_int, op: c_int, fd: c_int, ev: *mut libc::epoll_event) -> c_int, unresolved());

real_fn!(REAL_SIGACTION, real_sigaction, c"sigaction",
    (sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int,
    unresolved());
real_fn!(REAL_SIGNAL, real_signal, c"signal",
    (sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t, libc::SIG_ERR);

// The user-id changes: never a raw syscall, which would change the
// calling thread's ids only (glibc changes every thread's).
real_fn!(REAL_SETUID, real_setuid, c"setuid", (uid: libc::uid_t) -> c_int, unresolved());
real_fn!(REAL_SETEUID, real_seteuid, c"seteuid", (uid: libc::uid_t) -> c_int, unresolved());
real_fn!(REAL_SETREUID, real_setreuid, c"setreuid",
    (ruid: libc::uid_t, euid: libc::uid_t) -> c_int, unresolved());
real_fn!(REAL_SETRESUID, real_setresuid, c"setresuid",
    (ruid: libc::uid_t, euid: libc::uid_t, suid: libc::uid_t) -> c_int, unresolved());

// Children: their forks (counted) and polls for their end (a backup's
// reap where the log says).
real_fn!(REAL_WAITPID, real_waitpid, c"waitpid",
    (pid: libc::pid_t, status: *mut c_int, options: c_int) -> libc::pid_t, unresolved());
real_fn!(REAL_FORK, real_fork, c"fork", () -> libc::pid_t, unresolved());

/// Fails with ENOSYS: a wait, signal or user-id call made before its real
/// function could be resolved.
fn unresolved() -> c_int {
    super::set_errno(libc::ENOSYS);
    -1
}

static ALL_REAL: [&RealFn; 46] = [
    &REAL_READ,
    &REAL_READV,
    &REAL_RECV,
    &REAL_RECVFROM,
    &REAL_RECVMSG,
    &REAL_READ_CHK,
    &REAL_RECV_CHK,
    &REAL_RECVFROM_CHK,
    &REAL_ACCEPT,
    &REAL_ACCEPT4,
    &REAL_CLOSE,
    &REAL_SHUTDOWN,
    &REAL_LISTEN,
    &REAL_DUP2,
    &REAL_DUP3,
    &REAL_WRITE,
    &REAL_WRITEV,
    &REAL_SEND,
    &REAL_SENDTO,
    &REAL_SENDMSG,
    &REAL_EPOLL_WAIT,
    &REAL_EPOLL_PWAIT,
    &REAL_POLL,
    &REAL_PPOLL,
    &REAL_SELECT,
    &REAL_PSELECT,
    &REAL_EPOLL_CREATE,
    &REAL_EPOLL_CREATE1,
    &REAL_EPOLL_CTL,
    &REAL_SIGACTION,
    &REAL_SIGNAL,
    &REAL_CLOCK_GETTIME,
    &REAL_GETTIMEOFDAY,
    &REAL_TIME,
    &REAL_GETRANDOM,
    &REAL_GETENTROPY,
    &REAL_SRAND,
    &REAL_SRANDOM,
    &REAL_FOPEN,
    &REAL_FOPEN64,
    &REAL_SETUID,
    &REAL_SETEUID,
    &REAL_SETREUID,
    &REAL_SETRESUID,
    &REAL_WAITPID,
    &REAL_FORK,
];

/// Load-time constructor: resolves every real function (dlsym only; no
/// allocation of ours, no I/O, no configuration — that happens lazily at
/// the first `listen`/`accept` on the app address), and reads the log's
/// origin time from the environment before the server can change it.
extern "C" fn resolve_all() {
    for f in ALL_REAL.iter() {
        f.addr();
    }
    super::origin_env_us();
}

#[used]
#[link_section = ".init_array"]
static RESOLVE_AT_LOAD: extern "C" fn() = resolve_all;
