//! The follower's runtime: the threads and I/O that feed
//! [`crate::protocol::Replica`] what they observe and carry out what it
//! decides. It makes no protocol decision of its own.
//!
//! One [`Replica`](crate::protocol::Replica) per node, behind a lock on
//! [`Node`]: a thread that observes something steps it ([`Node::step`])
//! and carries out the actions it returns under the same lock, so that
//! the stored log every step reads is the one the previous step left.
//! Blocking work never runs under that lock: control requests to peers
//! run in threads of their own and come back as events (the answer, or
//! `Unanswered`), ZooKeeper requests run on the election thread and come
//! back as `ViewClaimed`.
//!
//! # Parts, one job each
//!
//! - [`node`]: [`Node`], the handle every thread shares, and stepping.
//! - `host`: the log and region reads a step makes.
//! - `carried`: the entry bytes an event hands over with it.
//! - `execute`: carrying out actions (store, region, one-sided writes,
//!   handing requests to the threads that make them).
//! - `startup`: opening everything, starting the replica and the threads.
//! - `poll`: the ingest loop (ring → `Read`).
//! - `heartbeat`: the heartbeat word, `Tick` with the region's words, the
//!   session and server checks.
//! - `apply`: handing applicable entries to the local server (`Applied`).
//! - `control_client`: the replica's requests to peers.
//! - `control_server`: peers' requests (view change requests go to the
//!   replica; fetches and status are served from the store).
//! - `zookeeper`, `static_leader`: the two elections' threads.
//! - `snapshots`: restoring the newest snapshot at start, taking one on
//!   the apply thread when asked.
//! - `status`: status, metrics text and lag.

mod apply;
mod carried;
mod control_client;
mod control_server;
mod execute;
mod heartbeat;
mod host;
pub mod log_limit;
pub mod node;
mod origin;
mod poll;
pub mod snapshots;
mod startup;
mod static_leader;
mod status;
mod zookeeper;

pub use node::Node;
pub use startup::RegionOnStop;
