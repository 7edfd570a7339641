//! Shared-memory transport: every node maps the other nodes' region files
//! and writes into them directly. True one-sided writes; nodes must share a
//! host (and /dev/shm).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::{check_view, Transport, TransportError};
use crate::config::Config;
use crate::region::{Region, RegionError};

/// Writes straight into mapped peer regions. A peer whose region does not
/// exist yet (its follower is not up) is mapped on first successful use,
/// and mapped again when its follower, stopped cleanly, removed the file.
pub struct ShmTransport {
    me: u64,
    local: Arc<Region>,
    config: Config,
    peers: Mutex<HashMap<u64, Arc<Region>>>,
    /// Nodes written to since the last [`Transport::flush`] (bit `id`):
    /// their doorbells ring once there, not once per write.
    unrung: AtomicU64,
}

impl ShmTransport {
    /// Prepares writes from node `me`; peers are mapped lazily.
    pub fn open(config: &Config, me: u64, local: Arc<Region>) -> Result<Self, TransportError> {
        config
            .node(me)
            .map_err(|_| TransportError::UnknownNode(me))?;
        Ok(ShmTransport {
            me,
            local,
            config: config.clone(),
            peers: Mutex::new(HashMap::new()),
            unrung: AtomicU64::new(0),
        })
    }

    fn peer(&self, node: u64) -> Result<Arc<Region>, TransportError> {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        match peers.get(&node) {
            // A peer stopped cleanly removed the file mapped here: its
            // restart creates a new one at the path (one load per write).
            Some(r) if r.retired() => {
                peers.remove(&node);
            }
            Some(r) => return Ok(r.clone()),
            None => {}
        }
        if self.config.node(node).is_err() {
            return Err(TransportError::UnknownNode(node));
        }
        let spec = self.config.region_spec(node);
        let region = Arc::new(Region::open(&spec.default_path(), &spec)?);
        peers.insert(node, region.clone());
        Ok(region)
    }

    /// Forgets a peer's mapping (its region file was recreated). A
    /// removed file is noticed without it (see [`Region::retired`]).
    pub fn forget(&self, node: u64) {
        self.peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&node);
    }
}

impl Transport for ShmTransport {
    fn write(&self, node: u64, view: u64, offset: u64, bytes: &[u8]) -> Result<(), TransportError> {
        let region = if node == self.me {
            self.local.clone()
        } else {
            match self.peer(node) {
                Ok(r) => r,
                Err(TransportError::Region(RegionError::Missing(_))) => {
                    // A peer that is down misses the write, as with RDMA;
                    // it catches up from a peer when it comes back.
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        };
        check_view(node, view, region.view())?;
        region.write_unrung(offset, bytes)?;
        self.unrung.fetch_or(1 << (node & 63), Ordering::AcqRel);
        Ok(())
    }

    /// Rings the doorbell of every region written to since the last flush:
    /// a poller parked there wakes once per batch of writes (every
    /// `futex` wake is a syscall on the writer's thread, the leader's
    /// server's own).
    fn flush(&self) {
        let mut nodes = self.unrung.swap(0, Ordering::AcqRel);
        while nodes != 0 {
            let node = u64::from(nodes.trailing_zeros());
            nodes &= nodes - 1;
            if node == self.me & 63 {
                self.local.bell().ring();
            } else if let Ok(r) = self.peer(node) {
                r.bell().ring();
            }
        }
    }

    fn local(&self) -> &Region {
        &self.local
    }
}
