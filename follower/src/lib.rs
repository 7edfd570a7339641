//! lockstep-follower as a library: the per-node runtime and its parts, so
//! benches and tests can drive them directly.

pub mod election;
pub mod feed;
pub mod health;
pub mod membership;
pub mod metrics;
pub mod protocol;
pub mod runtime;
pub mod sentinel;
pub mod snapshot;
pub mod store;

/// The shared handle, where it always was: `lockstep_follower::node::Node`.
pub use runtime::node;
