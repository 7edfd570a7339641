//! liblockstep.so: preloaded into an unmodified server (`LD_PRELOAD`), it
//! turns the server's socket inputs into replicated log entries while this
//! node leads, and reports what the server consumed from the follower's
//! replay connections while it is a backup.
//!
//! # Environment
//!
//! - `LOCKSTEP_CONFIG`: the cluster config. Unset: the library passes every
//!   call through and does nothing else.
//! - `LOCKSTEP_NODE`: this node's id in the config.
//! - `LOCKSTEP_LOG`: `LEVEL`, `LEVEL:/path/file` or `/path/file` (default
//!   `warn`, to stderr).
//! - `LOCKSTEP_ALLOW_UNREPLICATED=1`: when the config or the region is
//!   unusable, warn once and serve unreplicated instead of stopping the
//!   server at its first accept on the app address.
//!
//! # Which fds count
//!
//! Only connections that `accept`/`accept4` returned on a listening socket
//! bound to the node's `app` address (same port; same address unless one
//! side is a wildcard). Every other fd — files, pipes, the server's own
//! outgoing connections, other listeners — passes through after one
//! lookup in a fixed table indexed by fd ([`fdtable`]).
//!
//! # Modules
//!
//! Layers, each importing only those below it: `hooks` (the exported
//! symbols) calls into the safe modules; they and `hooks` call [`sys`],
//! which imports nothing of the crate's.
//!
//! - `hooks`: the exported symbols and the hook bodies; with [`sys`], the
//!   only home of `unsafe` in the crate.
//! - [`sys`]: the real-symbol table (`dlsym(RTLD_NEXT)`, resolved at load)
//!   and safe wrappers over the raw calls the preload itself makes.
//! - [`reentry`]: which threads are inside a hook (their calls pass
//!   through).
//! - [`dispatch`]: what each call does, per fd class and role (and a
//!   server thread's clock and child reads inside its turn, by role).
//! - [`leader`]: the leader's path: the engine (ring, transport, acks), how
//!   it tags its entries, held output, the turn lock.
//! - [`backup`]: the passive side: a backup's server re-executes the log
//!   (the replay machine, pure and simulated against model servers, and
//!   its host over the region), and its output is checked against the
//!   leader's.
//! - [`determinism`]: what makes replicas agree, for both roles: the log's
//!   time, turns and loops, stack depth, entropy, children by fork order.
//! - [`setup`]: configuration, attaching to the region, fork handling.
//! - [`listeners`]: the server's listeners against the app address
//!   (a server listening in the wrong place stops before it serves).
//! - [`fdtable`]: per-fd state.
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod backup;
pub mod determinism;
pub mod dispatch;
pub mod fdtable;
#[allow(unsafe_code)]
pub mod hooks;
pub mod leader;
pub mod listeners;
pub mod logger;
pub mod reentry;
pub mod setup;
#[allow(unsafe_code)]
pub mod sys;
