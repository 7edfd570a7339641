//! The interposed libc functions: with [`crate::sys`], the preload's only
//! home of `unsafe`. [`exports`] defines every exported symbol (one macro,
//! one line each), binding the real function to a body; the bodies live
//! by job: `io` (recv- and send-type calls), `fds` (accept, listen,
//! close, shutdown, dup), `epoll` and `scan` (the event-loop waits,
//! with `turn`), `clocks`, `random` (entropy), `signals`, `children`
//! (polls for ended child processes) and `privileges` (user-id changes);
//! `bufs` turns the caller's raw buffers into slices and `guards`
//! keeps panics and errno in check.
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
//!
//! The real functions and their load-time resolution are in
//! [`crate::sys::real`].

mod bufs;
mod children;
mod clocks;
mod epoll;
pub mod exports;
mod fds;
mod guards;
mod io;
mod privileges;
mod random;
mod scan;
mod signals;
mod turn;
