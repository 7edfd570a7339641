//! One-sided writes between nodes: `write(node, view, offset, bytes)` puts
//! `bytes` at `offset` of node `node`'s region, the last 8 bytes last.
//!
//! Callers never wait for a round trip: a write is posted and the caller
//! learns that it landed only through the protocol itself (an ack appearing
//! in its own region). The same trait fits shared memory, TCP region servers
//! and RDMA WRITE verbs.

use std::sync::Arc;

use crate::config::{Config, TransportKind};
use crate::region::{Region, RegionError};
use crate::words::WordsError;

pub mod shm;
pub mod tcp;

/// Why a write could not be posted.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The node id is not part of the cluster.
    #[error("node {0} is not in the cluster")]
    UnknownNode(u64),
    /// The write is misaligned or out of the region's bounds.
    #[error(transparent)]
    Range(#[from] WordsError),
    /// The target has moved to a newer view; writes of `ours` are refused.
    #[error("fenced: node {node} is in view {theirs}, this write is from view {ours}")]
    Fenced {
        /// Target node.
        node: u64,
        /// The writer's view.
        ours: u64,
        /// The target's view.
        theirs: u64,
    },
    /// A region could not be opened or mapped.
    #[error(transparent)]
    Region(#[from] RegionError),
    /// The transport cannot run here (e.g. no RDMA device).
    #[error("transport unavailable: {0}")]
    Unavailable(String),
}

/// A one-sided write transport. Writes to the local node go straight into
/// the local region.
pub trait Transport: Send + Sync {
    /// Posts `bytes` (8-aligned length) to region offset `offset` of node
    /// `node`, tagged with the writer's `view`. Returns once posted, not
    /// once landed. The last 8 bytes become visible last.
    fn write(&self, node: u64, view: u64, offset: u64, bytes: &[u8]) -> Result<(), TransportError>;

    /// Pushes batched writes towards the network without waiting.
    fn flush(&self) {}

    /// The highest view a peer reported when it refused one of our writes
    /// (0: none). A leader that sees a newer view than its own must stop.
    fn fenced_by(&self) -> u64 {
        0
    }

    /// This node's own region.
    fn local(&self) -> &Region;
}

/// Opens the configured transport for node `me`, whose region is `local`.
pub fn open(config: &Config, me: u64, local: Arc<Region>) -> Result<Box<dyn Transport>, TransportError> {
    match config.transport {
        TransportKind::Shm => Ok(Box::new(shm::ShmTransport::open(config, me, local)?)),
        TransportKind::Tcp => Ok(Box::new(tcp::TcpTransport::new(config, me, local)?)),
        TransportKind::Rdma => Err(TransportError::Unavailable(
            "the rdma transport is not built in yet".into(),
        )),
    }
}
