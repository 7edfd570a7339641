//! RDMA transport (cargo feature `rdma`): one-sided `IBV_WR_RDMA_WRITE`s
//! over reliable-connection queue pairs, straight into the peers' region
//! files.
//!
//! # Quick start
//!
//! ```text
//! cargo build --release --features rdma          # needs libibverbs-dev librdmacm-dev clang
//! ```
//!
//! ```toml
//! transport = "rdma"
//! key = "…at least 16 characters…"
//! [[nodes]]
//! id = 1
//! app = "10.0.0.1:7001"
//! control = "10.0.0.1:7101"   # an address on the node's RDMA NIC (IPoIB or RoCE)
//! ```
//!
//! Each process registers memory, which pins it: the locked-memory limit
//! (`ulimit -l`, `LimitMEMLOCK=`) must cover the region plus 2 MiB per peer,
//! or the process needs `CAP_IPC_LOCK`. Without an RDMA device, opening the
//! transport fails at once with a line that says so; a build without the
//! feature refuses `transport = "rdma"` the same way.
//!
//! # Connection setup: rdma_cm, not the control channel
//!
//! A writer needs, for each peer, a queue pair connected to one of the
//! peer's, plus the address, length and remote key of the peer's
//! registered region. The queue-pair half (QP numbers, LID/GID, PSNs, MTU,
//! timeouts, the INIT→RTR→RTS transitions) is done by the RDMA connection
//! manager (librdmacm), and the rest travels in the private data of its
//! REQ / REP / REJ messages ([`wire`]: request = who, view, cluster, MAC;
//! accept = addr, len, rkey, view; refusal = why, view). Why not exchange
//! all of it over the existing TCP control channel:
//!
//! - the control channel is served by the follower's dispatcher, which
//!   would have to host verbs objects for every writer; with rdma_cm the
//!   transport owns its listener, so callers do not change (the
//!   [`Transport`] contract) and the preloaded server needs nothing either;
//! - rdma_cm resolves paths and GIDs (RoCE v2 GID index, IB path records)
//!   and drives the queue-pair state machine with the fabric's parameters —
//!   the part hand-rolled exchanges usually get wrong;
//! - on InfiniBand and RoCE its port space is separate from TCP's, so the
//!   listener binds the node's `control` ip:port next to the follower's TCP
//!   listener: no new config field. (iWARP shares TCP's port space: not
//!   supported.)
//!
//! The price: the request is one 56-byte message (the IB limit), so its
//! MAC cannot cover a fresh nonce the way the TCP handshake's does. A peer
//! without the cluster key is refused, but a request captured on the fabric
//! could be replayed; like Mu and FaRM, this assumes a trusted fabric.
//!
//! # Who answers
//!
//! Both the follower and the preloaded server of a node open the transport.
//! The first to open it (the follower, which starts before its server)
//! binds the control address, registers its mapping of the region file
//! (bytes after the identity words only, with remote-write access) and runs
//! a listener thread that accepts connect requests. A later process finds
//! the address taken and only writes; the pages written are the same shared
//! pages either way.
//!
//! # Writes
//!
//! [`Transport::write`] checks the range, then posts without waiting for the
//! network: [`plan::plan_write`] splits it into the body (pieces of at most
//! [`MAX_PIECE`] bytes) and the last 8 bytes as a WRITE of its own. A
//! reliable connection executes WRITEs in order, so the last word (an
//! entry's canary, an ack, a tail) lands after the body. Pieces that fit the
//! queue pair's inline data are posted from the caller's buffer; larger
//! ones are copied into a registered staging ring ([`STAGING_BYTES`] per
//! peer). One request in [`SIGNAL_EVERY`] is signaled (sooner when staging
//! fills or the send queue is half full); a signaled completion frees the
//! send-queue slots and staging bytes of every request before it.
//! Completions are polled in [`Transport::flush`] and whenever a write
//! lacks room; a write that still has none after a millisecond is queued.
//!
//! A connector thread per peer (started by the first write to it) connects,
//! reconnects with backoff (20 ms doubling to 1 s), and replaces a
//! connection whose peer disconnected or whose completion failed. Writes
//! made while there is no connection are queued (up to [`MAX_PENDING`]
//! bytes, then dropped like lost one-sided writes, which the protocol
//! tolerates) and posted in order once connected. Writes in flight when a
//! connection breaks may or may not have landed.
//!
//! # Fencing
//!
//! A connect request from a view older than the region's is refused with
//! the region's view, which [`Transport::fenced_by`] then reports. When the
//! region moves to a newer view, the listener revokes remote-write access on
//! the queue pairs of writers that connected in older views (as Mu does):
//! their next WRITE fails with a remote access error, their connection is
//! replaced, and the new request either gets in (the writer is current) or
//! learns the newer view. The listener looks at the view every 20 ms.
//!
//! # Notes
//!
//! - One-sided writes do not ring the target's doorbell: pollers there see
//!   them while spinning or when their park times out.
//! - The staging ring is shared anonymous memory and the region a shared
//!   file mapping, so a server that forks (Redis `BGSAVE`) never has them
//!   copied away from the device. The queue buffers libibverbs providers
//!   allocate need a kernel that copies pinned pages on fork (Linux 5.13
//!   or later); on older kernels the transport calls `ibv_fork_init`
//!   (as `RDMAV_FORK_SAFE=1` would), which keeps registered memory out of
//!   forked children.
//! - Connections of writers that vanish without a disconnect (a host that
//!   crashes; a killed process still disconnects, the kernel does it) stay
//!   on the owner, idle, until it restarts.
//! - Dropping the transport stops its threads and destroys every queue pair
//!   (peers see a disconnect).
//! - All `unsafe` of this transport is in its `verbs` module (built with
//!   the feature).

use std::sync::Arc;

use super::{Transport, TransportError};
use crate::config::Config;
use crate::region::Region;

pub mod plan;
pub mod wire;

#[cfg(feature = "rdma")]
mod listener;
#[cfg(feature = "rdma")]
mod peer;
#[cfg(feature = "rdma")]
pub mod verbs;

/// Largest piece of a write's body posted as one WRITE.
pub const MAX_PIECE: usize = 256 << 10;
/// Registered staging bytes per peer (at least 4 pieces, so that a piece
/// always fits once earlier ones completed).
pub const STAGING_BYTES: usize = 2 << 20;
/// Send-queue depth asked for (capped by the device).
pub const SQ_DEPTH: u32 = 512;
/// One request in this many is signaled.
pub const SIGNAL_EVERY: u32 = 32;
/// Inline data asked for (enough for acks, tails and small entries).
pub const WANT_INLINE: u32 = 64;
/// Most bytes queued per peer while it is unreachable.
pub const MAX_PENDING: usize = 64 << 20;

const _: () = assert!(STAGING_BYTES >= 4 * MAX_PIECE);
const _: () = assert!(SIGNAL_EVERY * 4 <= SQ_DEPTH);

/// What `transport = "rdma"` says on a host without an RDMA device.
pub const NO_DEVICE: &str = "transport = \"rdma\": no RDMA device found (ibv_get_device_list returned none); use transport = \"tcp\" or \"shm\"";

/// Opens the rdma transport for node `me` (see the module docs).
#[cfg(feature = "rdma")]
pub fn open(
    config: &Config,
    me: u64,
    local: Arc<Region>,
) -> Result<Box<dyn Transport>, TransportError> {
    Ok(Box::new(RdmaTransport::open(config, me, local)?))
}

/// Without the `rdma` feature: refuses, saying how to get it.
#[cfg(not(feature = "rdma"))]
pub fn open(
    config: &Config,
    me: u64,
    local: Arc<Region>,
) -> Result<Box<dyn Transport>, TransportError> {
    let _ = (config, me, local);
    Err(TransportError::Unavailable(
        "transport = \"rdma\": this build has no RDMA support (build with `--features rdma`, which needs libibverbs-dev and librdmacm-dev); use transport = \"tcp\" or \"shm\"".into(),
    ))
}

#[cfg(feature = "rdma")]
pub use imp::RdmaTransport;

#[cfg(feature = "rdma")]
mod imp {
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use super::listener::{Listener, Owner};
    use super::peer::{Peer, PeerSpec};
    use super::verbs::{
        self, CmId, CompletionQueue, Device, EventChannel, ProtectionDomain, RdmaError,
        RegisteredRegion,
    };
    use super::NO_DEVICE;
    use crate::config::Config;
    use crate::region::{cluster_hash, Region};
    use crate::transport::{write_local, PeerTable, Transport, TransportError, IDENTITY_BYTES};

    fn unavailable(e: RdmaError) -> TransportError {
        TransportError::Unavailable(match e {
            RdmaError::NoDevice => NO_DEVICE.into(),
            e => format!("transport = \"rdma\": {e}"),
        })
    }

    /// One-sided RDMA WRITEs to peers' regions (see the module docs).
    pub struct RdmaTransport {
        me: u64,
        local: Arc<Region>,
        peers: PeerTable<Peer>,
        fenced_by: Arc<AtomicU64>,
        listener: Option<Listener>,
    }

    impl RdmaTransport {
        /// Opens the device behind node `me`'s control address, registers
        /// what it needs and, if no other process of this node does yet,
        /// starts answering connect requests for `local`. Connections to
        /// peers are made by the first write to each.
        pub fn open(config: &Config, me: u64, local: Arc<Region>) -> Result<Self, TransportError> {
            let node = config
                .node(me)
                .map_err(|_| TransportError::UnknownNode(me))?;
            // Configured (the rdma transport needs one), so no I/O: this
            // runs inside the preloaded server too.
            let key = config.cluster_key()?.to_string();
            // Before any other verbs call: a server that forks (Redis
            // BGSAVE) must not take registered pages with it.
            if verbs::fork_unsafe() {
                if let Err(e) = verbs::fork_init() {
                    log::warn!(
                        "rdma: {e}: a server that forks needs RDMAV_FORK_SAFE=1 on this kernel"
                    );
                }
            }
            let devices = verbs::device_names().map_err(unavailable)?;
            let control = node.control;
            let channel = EventChannel::new().map_err(unavailable)?;
            let anchor = CmId::new(&channel).map_err(unavailable)?;
            let (anchor, listening) = match anchor.bind(control) {
                Ok(()) => (anchor, true),
                Err(e) if e.is_addr_in_use() => {
                    // Another process of this node (its follower) answers.
                    drop(anchor);
                    let a = CmId::new(&channel).map_err(unavailable)?;
                    a.bind(SocketAddr::new(control.ip(), 0))
                        .map_err(unavailable)?;
                    (a, false)
                }
                Err(e) => return Err(unavailable(e)),
            };
            let device = Device::open(anchor, control).map_err(unavailable)?;
            let pd = ProtectionDomain::new(&device).map_err(unavailable)?;
            let listener = if listening {
                let registered =
                    RegisteredRegion::new(&pd, &local, IDENTITY_BYTES).map_err(unavailable)?;
                let cq = CompletionQueue::new(&device, 16).map_err(unavailable)?;
                let owner = Owner {
                    me,
                    cluster: cluster_hash(&config.cluster),
                    key: key.clone(),
                    known: config.ids().collect(),
                    local: local.clone(),
                    device: device.clone(),
                    pd: pd.clone(),
                    registered,
                    cq,
                };
                Some(Listener::start(owner).map_err(unavailable)?)
            } else {
                None
            };
            let fenced_by = Arc::new(AtomicU64::new(0));
            let src = (!control.ip().is_unspecified()).then(|| SocketAddr::new(control.ip(), 0));
            let peers = PeerTable::new(config, me, |n| {
                let spec = PeerSpec {
                    node: n.id,
                    me,
                    addr: n.control,
                    src,
                    region_len: config.region_spec(n.id).remote_len(),
                    cluster: cluster_hash(&config.cluster),
                    key: key.clone(),
                };
                Peer::new(spec, &pd, fenced_by.clone()).map_err(unavailable)
            })?;
            log::info!(
                "rdma: node {me} on {} (devices: {}){}",
                device.name,
                devices.join(", "),
                if listening {
                    format!(", taking writes at {control}")
                } else {
                    String::from(", writing only (another process of this node takes writes)")
                }
            );
            Ok(RdmaTransport {
                me,
                local,
                peers,
                fenced_by,
                listener,
            })
        }
    }

    impl Transport for RdmaTransport {
        fn write(
            &self,
            node: u64,
            view: u64,
            offset: u64,
            bytes: &[u8],
        ) -> Result<(), TransportError> {
            if node == self.me {
                return write_local(&self.local, node, view, offset, bytes);
            }
            self.peers
                .target(node, view, offset, bytes.len())?
                .write(view, offset, bytes)
        }

        fn flush(&self) {
            for p in self.peers.iter() {
                p.flush();
            }
        }

        fn fenced_by(&self) -> u64 {
            self.fenced_by.load(Ordering::Acquire)
        }

        fn local(&self) -> &Region {
            &self.local
        }
    }

    impl Drop for RdmaTransport {
        fn drop(&mut self) {
            for p in self.peers.iter() {
                p.stop();
            }
            // Stops answering and closes accepted connections.
            self.listener.take();
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::region::RegionSpec;

        #[test]
        fn open_refuses_clearly_without_a_device() {
            let config = crate::transport::test_config("rdmaunit", "rdma", 2);
            let local = Arc::new(Region::anonymous(&config.region_spec(1)).unwrap());
            match verbs::device_names() {
                Err(RdmaError::NoDevice) => {
                    let e = RdmaTransport::open(&config, 1, local)
                        .err()
                        .expect("must refuse");
                    let msg = e.to_string();
                    assert!(msg.contains("no RDMA device found"), "{msg}");
                    assert!(msg.contains("use transport = \"tcp\" or \"shm\""), "{msg}");
                    assert!(!msg.contains('\n'));
                }
                other => eprintln!(
                    "skipped: this host has RDMA devices or none can be listed ({other:?})"
                ),
            }
            // An unknown node is refused before any device is looked at.
            let spec = RegionSpec {
                cluster: "rdmaunit".into(),
                node: 9,
                ring_size: 1 << 20,
            };
            let r = Arc::new(Region::anonymous(&spec).unwrap());
            assert!(matches!(
                RdmaTransport::open(&config, 9, r),
                Err(TransportError::UnknownNode(9))
            ));
        }
    }
}
