//! lockstep-follower as a library: the per-node runtime and its parts, so
//! benches and tests can drive them directly.

pub mod io;
pub mod protocol;
pub mod runtime;
pub mod serve;
pub mod snapshot;

/// The shared handle, where it always was: `lockstep_follower::node::Node`.
pub use runtime::node;
