//! lockstep-follower as a library: the per-node runtime and its parts, so
//! benches and tests can drive them directly.

pub mod election;
mod failover;
pub mod feed;
pub mod health;
pub mod membership;
pub mod metrics;
pub mod node;
pub mod protocol;
pub mod sentinel;
pub mod store;
