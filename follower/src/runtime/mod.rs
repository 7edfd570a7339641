//! The follower's runtime: the threads and I/O that carry out what
//! [`crate::protocol`] decides — polling the ring, storing, acking,
//! applying, the control channel, the heartbeat and the election.
//!
//! # Parts, one job each
//!
//! - [`node`]: [`Node`], the handle every thread shares.
//! - `startup`: opening everything and starting the threads.
//! - `poll`: the backup's ingest loop (ring → store → ack).
//! - `commit`: learning and raising the commit point.
//! - `ack`: what a backup writes into its leader's region.
//! - `apply`: handing committed entries to the local server.
//! - `catchup`: fetching entries from peers.
//! - `control_client`, `control_server`: the control channel's two sides.
//! - `heartbeat`: the heartbeat word, session and server checks, commit
//!   records.
//! - `zookeeper`, `static_leader`: the two election threads.
//! - `follow`, `candidate`: a node's and a candidate's side of a view
//!   change; `demotion`: stopping leading.
//! - `status`: status, metrics text and lag.

mod ack;
mod apply;
mod candidate;
mod catchup;
mod commit;
mod control_client;
mod control_server;
mod demotion;
mod follow;
mod heartbeat;
pub mod node;
mod poll;
mod startup;
mod static_leader;
mod status;
mod zookeeper;

pub use node::Node;
