//! `lockstep verify`: a Jepsen-style run against a cluster it starts
//! itself — concurrent clients, injected faults, a recorded history, and
//! checkers that decide whether the history is consistent.

pub mod check;
mod client;
mod cluster;
mod command;
pub mod history;
mod nemesis;
mod report;

pub use command::{run, VerifyArgs};
