//! lockstep's test fixtures, a dev-dependency only (the product's
//! dependency tree holds no test code): whole clusters of real processes
//! with the fault controls the integration tests need ([`cluster`]), a
//! server under the preload fed by a real apply-stream writer
//! ([`preload_fixture`]), the commit mode a test runs in
//! ([`commit_mode`]), the three-node config text of the unit tests
//! ([`config_fixture`]) and waiting for a condition ([`poll`]).

pub mod cluster;
pub mod commit_mode;
pub mod config_fixture;
pub mod poll;
pub mod preload_fixture;
