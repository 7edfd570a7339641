//! The passive side: while this node is a backup, its server re-executes
//! the committed log, and what it writes is checked against the leader's.
//!
//! - [`replay`]: the replay machine, pure: which turn the server runs,
//!   when and on which loop, what it reads; simulated against model
//!   event-loop servers (`replay::sim`, in the tests).
//! - [`region_host`]: the replay's host over the region: the apply ring,
//!   the server threads' turn counters, the clock, real replay connections,
//!   the applier thread; what the hooks call on a backup.
//! - [`output_check`]: a replay connection's output against the leader's
//!   digests, pure.
//! - [`node_dependent`]: which replies differ per node by design (not
//!   counted as divergences).

pub mod node_dependent;
pub mod output_check;
pub mod region_host;
pub mod replay;
