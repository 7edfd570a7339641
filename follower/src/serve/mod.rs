//! What a follower offers besides replication, on its metrics address and
//! its own ports: Prometheus metrics ([`metrics`]), health checks for
//! proxies ([`health`]) and a Sentinel endpoint for Sentinel-aware clients
//! ([`sentinel`]).

pub mod health;
pub mod metrics;
pub mod sentinel;
