//! lockstep-common: what every lockstep process shares — the entry codec,
//! the ring, the region layout, the cluster config, the transports, the
//! leader's writer, and the Redis protocol (RESP) that the follower serves
//! Sentinel clients in and the launcher's client speaks.
#![deny(missing_docs)]

pub mod apply_lag;
pub mod config;
pub mod control;
pub mod entry;
pub mod handshake;
pub mod idle_spin;
pub mod leader_writer;
pub mod quorum;
pub mod region;
pub mod resp;
pub mod ring;
pub mod transport;
pub mod words;

pub use config::Config;
pub use entry::{EntryHeader, Kind};
pub use region::{Region, RegionSpec, Role};
