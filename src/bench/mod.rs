//! `lockstep bench`: figures, not tests. Each benchmark starts the
//! clusters it measures (through `up`'s own `Cluster` or the processes it
//! needs) and stops them; [`harness`] holds what they share.

pub mod cpu_cost;
pub mod failover;
pub mod follower;
pub mod harness;
pub mod memcached;
pub mod redis;
pub mod restart;
pub mod snapshots;
