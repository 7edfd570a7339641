//! What makes every replica's server compute the same: the log's time and
//! the time inside a turn, the event-loop turns and loops themselves,
//! where on its stack a thread reads, the cluster's random stream, and
//! the server's children by fork order. Both roles run these rules: the
//! leader to log what its server saw, a backup to see the same. They
//! import nothing of the leader's (`leader`) or the backup's (`backup`),
//! which both build on them.
//!
//! - [`clock`]: the log's time, the wall clock every replica's server
//!   reads; [`thread_clock`]: one thread's clock, pure.
//! - [`turn_time`]: time inside a turn (the clock and child records).
//! - [`turns`]: the server threads' event-loop turns.
//! - [`loops`]: the server's event loops, named alike on every replica,
//!   and the alarm that wakes one.
//! - [`stack_depth`]: where a thread reads against where it waited (a read
//!   after a nested loop returned).
//! - [`entropy`]: the cluster's random stream, the same on every replica.
//! - [`forks`]: the server's children by the order it forked them.

pub mod clock;
pub mod entropy;
pub mod forks;
pub mod loops;
pub mod stack_depth;
pub mod thread_clock;
pub mod turn_time;
pub mod turns;
