//! TCP transport (placeholder until the region server lands).
use std::sync::Arc;

use super::{Transport, TransportError};
use crate::config::Config;
use crate::region::Region;

/// Sends one-sided writes to peers' region servers over TCP.
pub struct TcpTransport {
    local: Arc<Region>,
}

impl TcpTransport {
    /// Prepares writes from node `me`.
    pub fn new(_config: &Config, _me: u64, local: Arc<Region>) -> Result<Self, TransportError> {
        Ok(TcpTransport { local })
    }
}

impl Transport for TcpTransport {
    fn write(&self, _node: u64, _view: u64, _offset: u64, _bytes: &[u8]) -> Result<(), TransportError> {
        Err(TransportError::Unavailable("tcp transport not implemented yet".into()))
    }
    fn local(&self) -> &Region {
        &self.local
    }
}
