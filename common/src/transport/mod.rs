//! One-sided writes between nodes: `write(node, view, offset, bytes)` puts
//! `bytes` at `offset` of node `node`'s region, the last 8 bytes last.
//!
//! Callers never wait for a round trip: a write is posted and the caller
//! learns that it landed only through the protocol itself (an ack appearing
//! in its own region). The same trait fits shared memory ([`shm`]), TCP
//! region servers ([`tcp`]) and RDMA WRITE verbs ([`rdma`], cargo feature
//! `rdma`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::config::{Config, Node, TransportKind};
use crate::region::{Region, RegionError, MAX_NODES};
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
    /// The cluster key its handshakes prove could not be had.
    #[error(transparent)]
    Key(#[from] crate::config::KeyError),
}

/// A one-sided write transport. Writes to the local node go straight into
/// the local region.
pub trait Transport: Send + Sync {
    /// Posts `bytes` (8-aligned length) to region offset `offset` of node
    /// `node`, tagged with the writer's `view`. Returns once posted, not
    /// once landed. The last 8 bytes become visible last. A write may wait
    /// for the next [`Transport::flush`] to leave (tcp) or to wake the
    /// region's pollers (shm): writers flush after each batch.
    fn write(&self, node: u64, view: u64, offset: u64, bytes: &[u8]) -> Result<(), TransportError>;

    /// Sends what was written since the last flush and wakes the pollers
    /// of the regions written to, without waiting.
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
pub fn open(
    config: &Config,
    me: u64,
    local: Arc<Region>,
) -> Result<Box<dyn Transport>, TransportError> {
    match config.transport {
        TransportKind::Shm => Ok(Box::new(shm::ShmTransport::open(config, me, local)?)),
        TransportKind::Tcp => Ok(Box::new(tcp::TcpTransport::new(config, me, local)?)),
        TransportKind::Rdma => rdma::open(config, me, local),
    }
}

/// The rules every remote write obeys: non-empty, 8-aligned, inside a
/// region of `region_len` bytes and clear of the identity words.
pub(crate) fn check_remote_write(
    offset: u64,
    len: usize,
    region_len: u64,
) -> Result<(), WordsError> {
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

/// Refuses a write of view `ours` to `node`, known to be in view `theirs`,
/// if that view is newer.
pub(crate) fn check_view(node: u64, ours: u64, theirs: u64) -> Result<(), TransportError> {
    if theirs > ours {
        return Err(TransportError::Fenced { node, ours, theirs });
    }
    Ok(())
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
    check_view(node, view, local.view())?;
    local.write(offset, bytes)?;
    Ok(())
}

/// What the shared write path needs to know of a network transport's peer.
pub(crate) trait RemotePeer {
    /// Bytes of the peer's region.
    fn region_len(&self) -> u64;
    /// Highest view the peer refused our writes with (0: none).
    fn fenced_view(&self) -> u64;
}

/// A network transport's peers, indexed by node id: every node of the
/// config but this one.
pub(crate) struct PeerTable<P>(Vec<Option<Arc<P>>>);

impl<P: RemotePeer> PeerTable<P> {
    /// Makes a peer for every node of `config` but `me`.
    pub(crate) fn new(
        config: &Config,
        me: u64,
        mut make: impl FnMut(&Node) -> Result<P, TransportError>,
    ) -> Result<Self, TransportError> {
        let mut peers: Vec<Option<Arc<P>>> = (0..=MAX_NODES).map(|_| None).collect();
        for n in config.nodes.iter().filter(|n| n.id != me) {
            let Some(slot) = peers.get_mut(n.id as usize) else {
                return Err(TransportError::UnknownNode(n.id));
            };
            *slot = Some(Arc::new(make(n)?));
        }
        Ok(PeerTable(peers))
    }

    /// Every peer.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Arc<P>> {
        self.0.iter().flatten()
    }

    /// The peer a remote write of `len` bytes at `offset` in `view` goes
    /// to, once it passed the checks of every transport: `node` is a peer,
    /// the range is allowed ([`check_remote_write`]) and the peer has not
    /// refused `view`.
    pub(crate) fn target(
        &self,
        node: u64,
        view: u64,
        offset: u64,
        len: usize,
    ) -> Result<&Arc<P>, TransportError> {
        let peer = usize::try_from(node)
            .ok()
            .and_then(|i| self.0.get(i))
            .and_then(|p| p.as_ref())
            .ok_or(TransportError::UnknownNode(node))?;
        check_remote_write(offset, len, peer.region_len())?;
        check_view(node, view, peer.fenced_view())?;
        Ok(peer)
    }
}

/// Locks a mutex, ignoring poisoning (transport state stays consistent
/// at every unlock; no code here panics while holding one on purpose).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts a thread named `name`, running what `make` returns, the first
/// time it is called with `started`; later calls cost one atomic load and
/// do nothing. Returns the new thread's handle. If the thread cannot
/// start, `started` is cleared again and the error names `what`.
pub(crate) fn start_once<R: FnOnce() + Send + 'static>(
    started: &AtomicBool,
    name: impl FnOnce() -> String,
    what: impl FnOnce() -> String,
    make: impl FnOnce() -> R,
) -> Result<Option<JoinHandle<()>>, TransportError> {
    if started.load(Ordering::Acquire)
        || started
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
    {
        return Ok(None);
    }
    match std::thread::Builder::new().name(name()).spawn(make()) {
        Ok(h) => Ok(Some(h)),
        Err(e) => {
            started.store(false, Ordering::Release);
            Err(TransportError::Unavailable(format!(
                "cannot start {}: {e}",
                what()
            )))
        }
    }
}

/// A keyed config of `nodes` nodes on 127.0.0.1 for unit tests.
#[cfg(test)]
pub(crate) fn test_config(cluster: &str, transport: &str, nodes: u64) -> Config {
    let mut text = format!(
        "cluster = \"{cluster}\"\ntransport = \"{transport}\"\nkey = \"0123456789abcdef\"\ndata_dir = \"/tmp/lockstep-{cluster}\"\n"
    );
    for id in 1..=nodes {
        text += &format!(
            "[[nodes]]\nid = {id}\napp = \"127.0.0.1:{}\"\ncontrol = \"127.0.0.1:{}\"\n",
            7000 + id,
            7100 + id
        );
    }
    Config::parse(&text).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(transport: &str) -> Config {
        test_config("routing", transport, 1)
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
    fn shm_rings_a_doorbell_once_per_flush_not_per_write() {
        let c = config("shm");
        let local = Arc::new(Region::anonymous(&c.region_spec(1)).unwrap());
        let t = open(&c, 1, local).unwrap();
        let before = t.local().bell().value();
        for v in 1..=3u64 {
            t.write(1, 1, crate::region::commit_offset(), &v.to_le_bytes())
                .unwrap();
        }
        assert_eq!(t.local().commit(), 3, "the writes landed");
        assert_eq!(t.local().bell().value(), before, "no ring before the flush");
        t.flush();
        assert_eq!(t.local().bell().value(), before.wrapping_add(1));
        t.flush();
        assert_eq!(
            t.local().bell().value(),
            before.wrapping_add(1),
            "nothing written since: no ring"
        );
    }

    #[test]
    fn shm_maps_a_peer_again_after_its_clean_stop_removed_its_file() {
        let c = test_config(&format!("shm-retire-{}", std::process::id()), "shm", 2);
        let spec = c.region_spec(2);
        let path = spec.default_path();
        let _ = std::fs::remove_file(&path);
        let local = Arc::new(Region::anonymous(&c.region_spec(1)).unwrap());
        let t = open(&c, 1, local).unwrap();
        let old = Region::create(&path, &spec).unwrap();
        old.claim().unwrap();
        let commit = crate::region::commit_offset();
        t.write(2, 1, commit, &5u64.to_le_bytes()).unwrap();
        assert_eq!(old.commit(), 5);
        assert!(old.remove_unattached().unwrap());
        // Down: the write is missed, as with any peer that is not up.
        t.write(2, 1, commit, &6u64.to_le_bytes()).unwrap();
        let new = Region::create(&path, &spec).unwrap();
        t.write(2, 1, commit, &7u64.to_le_bytes()).unwrap();
        assert_eq!(new.commit(), 7, "the write reached the new file");
        assert_eq!(old.commit(), 5);
        let _ = std::fs::remove_file(&path);
    }

    struct FakePeer {
        len: u64,
        fenced: u64,
    }

    impl RemotePeer for FakePeer {
        fn region_len(&self) -> u64 {
            self.len
        }
        fn fenced_view(&self) -> u64 {
            self.fenced
        }
    }

    #[test]
    fn peer_table_checks_every_remote_write() {
        let c = test_config("peers", "tcp", 3);
        let t = PeerTable::new(&c, 1, |n| {
            Ok(FakePeer {
                len: 4096,
                fenced: if n.id == 3 { 7 } else { 0 },
            })
        })
        .unwrap();
        assert_eq!(t.iter().count(), 2);
        assert!(t.target(2, 1, 64, 8).is_ok());
        assert!(matches!(
            t.target(1, 1, 64, 8),
            Err(TransportError::UnknownNode(1))
        ));
        assert!(matches!(
            t.target(9, 1, 64, 8),
            Err(TransportError::UnknownNode(9))
        ));
        assert!(matches!(
            t.target(u64::MAX, 1, 64, 8),
            Err(TransportError::UnknownNode(_))
        ));
        assert!(matches!(
            t.target(2, 1, 0, 8),
            Err(TransportError::Range(_))
        ));
        assert!(matches!(
            t.target(2, 1, 4096, 8),
            Err(TransportError::Range(_))
        ));
        assert!(matches!(
            t.target(3, 6, 64, 8),
            Err(TransportError::Fenced {
                node: 3,
                ours: 6,
                theirs: 7
            })
        ));
        assert!(t.target(3, 7, 64, 8).is_ok());
    }

    #[test]
    fn start_once_starts_one_thread() {
        let started = AtomicBool::new(false);
        let (tx, rx) = std::sync::mpsc::channel();
        let start = |tx: std::sync::mpsc::Sender<u32>| {
            start_once(
                &started,
                || "t".into(),
                || "a test thread".into(),
                move || move || tx.send(1).unwrap(),
            )
        };
        let h = start(tx.clone()).unwrap().expect("first call starts");
        h.join().unwrap();
        assert!(start(tx).unwrap().is_none(), "later calls do nothing");
        assert_eq!(rx.try_iter().count(), 1);
    }

    #[test]
    fn remote_write_rules() {
        assert!(check_remote_write(64, 8, 128).is_ok());
        assert!(check_remote_write(120, 8, 128).is_ok());
        assert!(matches!(
            check_remote_write(56, 8, 128),
            Err(WordsError::OutOfBounds { .. })
        ));
        assert!(matches!(
            check_remote_write(128, 8, 128),
            Err(WordsError::OutOfBounds { .. })
        ));
        assert!(matches!(
            check_remote_write(68, 8, 128),
            Err(WordsError::Unaligned { .. })
        ));
        assert!(matches!(
            check_remote_write(64, 0, 128),
            Err(WordsError::Unaligned { .. })
        ));
        assert!(matches!(
            check_remote_write(u64::MAX - 7, 8, u64::MAX),
            Err(WordsError::OutOfBounds { .. })
        ));
    }
}
