//! One-sided writes between nodes: `write(node, view, offset, bytes)` puts
//! `bytes` at `offset` of node `node`'s region, the last 8 bytes last.
//!
//! Callers never wait for a round trip: a write is posted and the caller
//! learns that it landed only through the protocol itself (an ack appearing
//! in its own region). The same trait fits shared memory ([`shm`]), TCP
//! region servers ([`tcp`]) and RDMA WRITE verbs ([`rdma`], cargo feature
//! `rdma`).

use std::sync::Arc;

use crate::config::{Config, TransportKind};
use crate::region::{Region, RegionError};
use crate::words::WordsError;

pub mod rdma;
pub mod shm;
pub mod tcp;

/// Region bytes no remote write may touch (the identity words: magic,
/// layout, node, ring size, cluster).
pub const IDENTITY_BYTES: u64 = 64;

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
        TransportKind::Rdma => rdma::open(config, me, local),
    }
}

/// The rules every remote write obeys: non-empty, 8-aligned, inside a
/// region of `region_len` bytes and clear of the identity words.
pub(crate) fn check_remote_write(offset: u64, len: usize, region_len: u64) -> Result<(), WordsError> {
    if !offset.is_multiple_of(8) || !len.is_multiple_of(8) || len == 0 {
        return Err(WordsError::Unaligned { offset, len });
    }
    match offset.checked_add(len as u64) {
        Some(end) if end <= region_len && offset >= IDENTITY_BYTES => Ok(()),
        _ => Err(WordsError::OutOfBounds {
            offset,
            len,
            size: region_len,
        }),
    }
}

/// A write to this node's own region: refused if the region is in a newer
/// view than `view` (as a peer would), else stored directly.
pub(crate) fn write_local(
    local: &Region,
    node: u64,
    view: u64,
    offset: u64,
    bytes: &[u8],
) -> Result<(), TransportError> {
    let theirs = local.view();
    if theirs > view {
        return Err(TransportError::Fenced {
            node,
            ours: view,
            theirs,
        });
    }
    local.write(offset, bytes)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(transport: &str) -> Config {
        Config::parse(&format!(
            r#"
cluster = "routing"
transport = "{transport}"
key = "0123456789abcdef"
data_dir = "/tmp/lockstep-routing"
[[nodes]]
id = 1
app = "127.0.0.1:7001"
control = "127.0.0.1:7101"
"#
        ))
        .unwrap()
    }

    #[test]
    fn rdma_is_routed_to_the_rdma_transport() {
        let c = config("rdma");
        let local = Arc::new(Region::anonymous(&c.region_spec(1)).unwrap());
        let e = match open(&c, 1, local) {
            Err(e) => e,
            // Only a build with the feature on a host with a device opens.
            Ok(_) if cfg!(feature = "rdma") => return,
            Ok(_) => panic!("a build without the rdma feature opened an rdma transport"),
        };
        let msg = e.to_string();
        assert!(msg.contains("transport = \"rdma\""), "{msg}");
        if cfg!(feature = "rdma") {
            assert!(
                msg.contains("no RDMA device found") || !msg.contains("no RDMA support"),
                "{msg}"
            );
        } else {
            assert!(msg.contains("--features rdma"), "{msg}");
        }
        assert!(msg.contains("use transport = \"tcp\" or \"shm\""), "{msg}");
    }

    #[test]
    fn shm_is_routed_to_the_shm_transport() {
        let c = config("shm");
        let local = Arc::new(Region::anonymous(&c.region_spec(1)).unwrap());
        let Ok(t) = open(&c, 1, local) else {
            panic!("shm opens anywhere");
        };
        t.write(1, 1, crate::region::commit_offset(), &7u64.to_le_bytes())
            .unwrap();
        assert_eq!(t.local().commit(), 7);
    }

    #[test]
    fn remote_write_rules() {
        assert!(check_remote_write(64, 8, 128).is_ok());
        assert!(check_remote_write(120, 8, 128).is_ok());
        assert!(matches!(check_remote_write(56, 8, 128), Err(WordsError::OutOfBounds { .. })));
        assert!(matches!(check_remote_write(128, 8, 128), Err(WordsError::OutOfBounds { .. })));
        assert!(matches!(check_remote_write(68, 8, 128), Err(WordsError::Unaligned { .. })));
        assert!(matches!(check_remote_write(64, 0, 128), Err(WordsError::Unaligned { .. })));
        assert!(matches!(
            check_remote_write(u64::MAX - 7, 8, u64::MAX),
            Err(WordsError::OutOfBounds { .. })
        ));
    }
}
