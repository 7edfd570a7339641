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
//! By role, in layers, top to bottom; each imports only those below it
//! (no import circle, between files or between these modules):
//!
//! - `hooks`: the exported symbols and the hook bodies; with [`sys`], the
//!   only home of `unsafe` in the crate. What a call does by fd class and
//!   role it asks [`dispatch`]; the rest it takes from the modules below
//!   (a backup's waits and replayed reads from [`backup::region_host`],
//!   the log's clocks, loops, entropy and fork counts from
//!   [`determinism`], the process's state from [`setup`]).
//! - [`dispatch`]: what each call does, per fd class and role, in safe
//!   code; [`dispatch::turn_reads`]: a server thread's clock and child
//!   reads inside its turn, by role (the leader logs them, a backup reads
//!   the log's).
//! - [`listeners`]: the server's listeners against the app address
//!   (a server listening in the wrong place stops before it serves).
//! - [`setup`]: process-wide state: configuration (and the cluster's
//!   entropy key), attaching to the region, fork handling.
//! - [`backup`]: the passive side: the replay machine (pure, simulated
//!   against model servers), its host over the region, the output checks
//!   against the leader's digests, the replies that differ per node by
//!   design. It stands above [`leader`] only for the replay simulation,
//!   whose model leader tags and chunks its entries as the real one does.
//! - [`leader`]: the leader's path: the engine (ring, transport, acks),
//!   how it tags its entries, held output, the turn lock.
//! - [`determinism`]: what makes replicas agree, for both roles: the log's
//!   time and the time inside a turn, event-loop turns and loops, stack
//!   depth, entropy, children by fork order.
//! - The ground: [`logger`] (the preload's `log` backend), [`fdtable`]
//!   (per-fd state), [`reentry`] (which threads are inside a hook: their
//!   calls pass through) and [`sys`] (the real-symbol table,
//!   `dlsym(RTLD_NEXT)` resolved at load, and safe wrappers over the raw
//!   calls the preload itself makes), which imports nothing of the
//!   crate's.
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
