//! Snapshots of a backup's server: the exact state of its process at a log
//! position, so that a server restored from one and fed the entries after
//! it cannot be told from one that replayed the whole log.
//!
//! A snapshot on disk is `<node data dir>/snapshots/<seq as 20 digits>/`:
//! the image's files and, written last (atomically, by rename),
//! `meta.json` ([`Meta`]). Without `meta.json` it is incomplete and never
//! used. [`ServerImage`] takes and restores images; [`criu::Criu`] is the
//! process-image implementation.

pub mod criu;
pub mod files;

use serde::{Deserialize, Serialize};

pub use files::{Meta, Refusal};

/// A log position a snapshot was taken at: the server had applied every entry up to `seq` (inclusive)
/// and nothing after, at a turn boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Position {
    /// Last seq the server applied.
    pub seq: u64,
    /// The view of that entry.
    pub view: u64,
    /// The log's time at that entry (µs).
    pub time_us: u64,
}

/// Takes and restores images of this node's server (the CRIU implementation is `criu::Criu`).
pub trait ServerImage: Send + Sync {
    /// Quiesce the server after it applied exactly `upto` (the runtime stops feeding the apply ring
    /// there and calls this once the server reported it applied `upto`), write the image's files into
    /// the empty directory `dir`, let the server run on. Returns the build ids recorded in the image
    /// (server binary, liblockstep.so) as (name, hex) pairs.
    fn take(&self, dir: &std::path::Path, upto: Position) -> anyhow::Result<Vec<(String, String)>>;
    /// Replace this node's (stopped) server by the one in `dir`; returns once it runs.
    fn restore(&self, dir: &std::path::Path, at: Position) -> anyhow::Result<()>;
}

/// Where the preload's apply stream stood when an image was taken: a
/// restored server's preload reads on from there, so the follower resumes
/// the stream (same epoch, same ring position) instead of starting a new
/// one (which would end every replay connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamState {
    /// The stream's epoch.
    pub epoch: u64,
    /// The seq the stream started at.
    pub start_seq: u64,
    /// The apply ring position just past the last entry applied.
    pub pos: u64,
    /// The last seq applied.
    pub applied: u64,
    /// Threads of the server parked on the apply doorbell (its applier,
    /// when idle): the restored ones leave that wait and uncount
    /// themselves.
    #[serde(default)]
    pub waiters: u64,
}

/// The file in an image directory that holds its [`StreamState`].
pub const STREAM_FILE: &str = "stream.json";
