//! The connection-info exchange of the rdma transport: what travels in the
//! private data of the connection manager's REQ, REP and REJ messages.
//!
//! Pure encoding and checking, no verbs: compiled (and tested) with or
//! without the `rdma` feature. All integers are little-endian; reserved
//! bytes must be zero; the transport pads private data with zeros (IB
//! does), so trailing zero bytes after a message are accepted and
//! anything else after it is garbage.
//!
//! ```text
//! request (writer → region owner, REQ, 56 bytes: the IB limit for rdma_cm)
//!   0  magic "LKRQ" | version u8 (1) | from u8 | to u8 | reserved u8
//!   8  view u64        the writer's view
//!   16 cluster u64     region::cluster_hash of the cluster name
//!   24 mac [32]        blake3::keyed_hash(derive_key("lockstep rdma connect v1", key), bytes 0..24)
//!
//! accept (region owner → writer, REP, 40 bytes)
//!   0  magic "LKAC" | version u8 (1) | node u8 | reserved u16
//!   8  view u64        the owner's region view
//!   16 addr u64        virtual address of region offset 0 in the owner's process
//!   24 len u64         region bytes
//!   32 rkey u32        remote key of the region's memory region | reserved u32
//!
//! refusal (region owner → writer, REJ, 16 bytes)
//!   0  magic "LKRJ" | version u8 (1) | code u8 | reserved u16
//!   8  view u64        the owner's region view
//! ```
//!
//! The queue pair numbers, LIDs/GIDs and packet sequence numbers are not in
//! here: the connection manager exchanges those itself (see the module docs
//! of [`super`]).

use crate::region::MAX_NODES;

/// Bytes of a [`ConnRequest`] on the wire.
pub const REQUEST_LEN: usize = 56;
/// Bytes of a [`ConnAccept`] on the wire.
pub const ACCEPT_LEN: usize = 40;
/// Bytes of a [`Refusal`] on the wire.
pub const REFUSAL_LEN: usize = 16;
/// Version byte of every message.
pub const VERSION: u8 = 1;

const REQUEST_MAGIC: [u8; 4] = *b"LKRQ";
const ACCEPT_MAGIC: [u8; 4] = *b"LKAC";
const REFUSAL_MAGIC: [u8; 4] = *b"LKRJ";
const KEY_CONTEXT: &str = "lockstep rdma connect v1";
const MAC_AT: usize = 24;

/// Why received private data is not a message of this protocol.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Fewer bytes than the message needs.
    #[error("{what}: {got} bytes, expected {want}")]
    Short {
        /// Which message.
        what: &'static str,
        /// Bytes received.
        got: usize,
        /// Bytes needed.
        want: usize,
    },
    /// Not this protocol (or another version of it).
    #[error("{what}: bad magic or version (not a lockstep rdma peer, or another version)")]
    Magic {
        /// Which message.
        what: &'static str,
    },
    /// A field holds a value the protocol does not allow.
    #[error("{what}: {field}")]
    Field {
        /// Which message.
        what: &'static str,
        /// What is wrong.
        field: String,
    },
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(w)
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[i..i + 4]);
    u32::from_le_bytes(w)
}

/// Checks length, magic, version and zero padding after `want` bytes.
fn frame<'a>(
    what: &'static str,
    b: &'a [u8],
    want: usize,
    magic: [u8; 4],
) -> Result<&'a [u8], WireError> {
    if b.len() < want {
        return Err(WireError::Short {
            what,
            got: b.len(),
            want,
        });
    }
    if b[..4] != magic || b[4] != VERSION {
        return Err(WireError::Magic { what });
    }
    if b[want..].iter().any(|&x| x != 0) {
        return Err(WireError::Field {
            what,
            field: format!("{} bytes of trailing garbage", b.len() - want),
        });
    }
    Ok(&b[..want])
}

fn field(what: &'static str, field: String) -> WireError {
    WireError::Field { what, field }
}

fn check_node(what: &'static str, name: &str, n: u8) -> Result<u64, WireError> {
    if n == 0 || n as usize > MAX_NODES {
        return Err(field(what, format!("{name} node id {n} is out of range")));
    }
    Ok(n as u64)
}

/// A writer asks to write into node `to`'s region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnRequest {
    /// The writer's node id.
    pub from: u64,
    /// The region owner's node id.
    pub to: u64,
    /// The writer's view when it connects.
    pub view: u64,
    /// [`crate::region::cluster_hash`] of the writer's cluster.
    pub cluster: u64,
}

impl ConnRequest {
    /// The request's wire bytes, authenticated with the cluster `key`
    /// ([`crate::Config::cluster_key`]).
    pub fn encode(&self, key: &str) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[..4].copy_from_slice(&REQUEST_MAGIC);
        b[4] = VERSION;
        b[5] = self.from as u8;
        b[6] = self.to as u8;
        b[8..16].copy_from_slice(&self.view.to_le_bytes());
        b[16..24].copy_from_slice(&self.cluster.to_le_bytes());
        let mac = mac(key, &b[..MAC_AT]);
        b[MAC_AT..].copy_from_slice(mac.as_bytes());
        b
    }

    /// Parses a request; the MAC is checked separately by [`Self::verify`]
    /// (so that a wrong cluster can be told apart from a wrong key).
    pub fn decode(b: &[u8]) -> Result<(ConnRequest, [u8; 32]), WireError> {
        const W: &str = "rdma connect request";
        let b = frame(W, b, REQUEST_LEN, REQUEST_MAGIC)?;
        if b[7] != 0 {
            return Err(field(W, format!("reserved byte is {:#04x}", b[7])));
        }
        let req = ConnRequest {
            from: check_node(W, "sender", b[5])?,
            to: check_node(W, "target", b[6])?,
            view: u64_at(b, 8),
            cluster: u64_at(b, 16),
        };
        let mut m = [0u8; 32];
        m.copy_from_slice(&b[MAC_AT..]);
        Ok((req, m))
    }

    /// Whether `mac` (from [`Self::decode`]) proves knowledge of `key`.
    /// Constant-time comparison.
    pub fn verify(&self, mac: &[u8; 32], key: &str) -> bool {
        let expected = self.encode(key);
        let mut got = [0u8; 32];
        got.copy_from_slice(&expected[MAC_AT..]);
        blake3::Hash::from(got) == blake3::Hash::from(*mac)
    }
}

fn mac(key: &str, msg: &[u8]) -> blake3::Hash {
    let k = blake3::derive_key(KEY_CONTEXT, key.as_bytes());
    blake3::keyed_hash(&k, msg)
}

/// The region owner lets a writer in: where to write and with which key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnAccept {
    /// The region owner's node id.
    pub node: u64,
    /// The owner's region view when it accepted.
    pub view: u64,
    /// Virtual address of region offset 0 (remote writes go to
    /// `addr + offset`).
    pub addr: u64,
    /// Region length in bytes.
    pub len: u64,
    /// Remote key of the region's memory region.
    pub rkey: u32,
}

impl ConnAccept {
    /// The accept's wire bytes.
    pub fn encode(&self) -> [u8; ACCEPT_LEN] {
        let mut b = [0u8; ACCEPT_LEN];
        b[..4].copy_from_slice(&ACCEPT_MAGIC);
        b[4] = VERSION;
        b[5] = self.node as u8;
        b[8..16].copy_from_slice(&self.view.to_le_bytes());
        b[16..24].copy_from_slice(&self.addr.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b[32..36].copy_from_slice(&self.rkey.to_le_bytes());
        b
    }

    /// Parses an accept.
    pub fn decode(b: &[u8]) -> Result<ConnAccept, WireError> {
        const W: &str = "rdma connect accept";
        let b = frame(W, b, ACCEPT_LEN, ACCEPT_MAGIC)?;
        if b[6..8] != [0, 0] || b[36..40] != [0; 4] {
            return Err(field(W, "reserved bytes are not zero".into()));
        }
        let a = ConnAccept {
            node: check_node(W, "owner", b[5])?,
            view: u64_at(b, 8),
            addr: u64_at(b, 16),
            len: u64_at(b, 24),
            rkey: u32_at(b, 32),
        };
        if !a.addr.is_multiple_of(8) || a.len == 0 || a.addr.checked_add(a.len).is_none() {
            return Err(field(
                W,
                format!("region at {:#x} of {} bytes is not usable", a.addr, a.len),
            ));
        }
        Ok(a)
    }
}

/// Why a region owner refused a writer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusalCode {
    /// The writer's view is older than the region's: it is fenced.
    Fenced = 1,
    /// The writer belongs to another cluster.
    WrongCluster = 2,
    /// The request's MAC does not match the cluster key.
    WrongKey = 3,
    /// The writer or target node id is not what the owner expects.
    WrongNode = 4,
    /// The request could not be parsed.
    Malformed = 5,
    /// The owner could not set up the connection (see its log).
    Internal = 6,
}

impl RefusalCode {
    fn from_u8(b: u8) -> Option<RefusalCode> {
        Some(match b {
            1 => RefusalCode::Fenced,
            2 => RefusalCode::WrongCluster,
            3 => RefusalCode::WrongKey,
            4 => RefusalCode::WrongNode,
            5 => RefusalCode::Malformed,
            6 => RefusalCode::Internal,
            _ => return None,
        })
    }
}

/// A region owner's refusal, with its view (for fencing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Why.
    pub code: RefusalCode,
    /// The owner's region view.
    pub view: u64,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.code {
            RefusalCode::Fenced => write!(f, "fenced: the region is in view {}", self.view),
            RefusalCode::WrongCluster => f.write_str("wrong cluster"),
            RefusalCode::WrongKey => f.write_str("authentication failed: wrong cluster key"),
            RefusalCode::WrongNode => f.write_str("node ids do not match the owner's config"),
            RefusalCode::Malformed => f.write_str("malformed connect request"),
            RefusalCode::Internal => f.write_str("the owner could not set up the connection"),
        }
    }
}

impl Refusal {
    /// The refusal's wire bytes.
    pub fn encode(&self) -> [u8; REFUSAL_LEN] {
        let mut b = [0u8; REFUSAL_LEN];
        b[..4].copy_from_slice(&REFUSAL_MAGIC);
        b[4] = VERSION;
        b[5] = self.code as u8;
        b[8..16].copy_from_slice(&self.view.to_le_bytes());
        b
    }

    /// Parses a refusal.
    pub fn decode(b: &[u8]) -> Result<Refusal, WireError> {
        const W: &str = "rdma connect refusal";
        let b = frame(W, b, REFUSAL_LEN, REFUSAL_MAGIC)?;
        if b[6..8] != [0, 0] {
            return Err(field(W, "reserved bytes are not zero".into()));
        }
        let code = RefusalCode::from_u8(b[5])
            .ok_or_else(|| field(W, format!("unknown refusal code {}", b[5])))?;
        Ok(Refusal {
            code,
            view: u64_at(b, 8),
        })
    }
}

/// What a region owner answers a request with, given its cluster hash,
/// key, own id, current view and the config's node ids (`known`).
pub fn answer(
    data: &[u8],
    cluster: u64,
    key: &str,
    me: u64,
    view: u64,
    known: impl Fn(u64) -> bool,
) -> Result<ConnRequest, Refusal> {
    let refuse = |code| Refusal { code, view };
    let (req, mac) = ConnRequest::decode(data).map_err(|_| refuse(RefusalCode::Malformed))?;
    if req.cluster != cluster {
        return Err(refuse(RefusalCode::WrongCluster));
    }
    if !req.verify(&mac, key) {
        return Err(refuse(RefusalCode::WrongKey));
    }
    if req.to != me || req.from == me || !known(req.from) {
        return Err(refuse(RefusalCode::WrongNode));
    }
    if req.view < view {
        return Err(refuse(RefusalCode::Fenced));
    }
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "0123456789abcdef";

    fn req() -> ConnRequest {
        ConnRequest {
            from: 1,
            to: 3,
            view: 7,
            cluster: 0xfeed_beef_1234_5678,
        }
    }

    #[test]
    fn request_round_trips_and_authenticates() {
        let b = req().encode(KEY);
        let (r, mac) = ConnRequest::decode(&b).unwrap();
        assert_eq!(r, req());
        assert!(r.verify(&mac, KEY));
        assert!(!r.verify(&mac, "fedcba9876543210"));
        assert!(!r.verify(&mac, ""));
        // IB pads private data with zeros: still the same request.
        let mut padded = b.to_vec();
        padded.extend_from_slice(&[0; 36]);
        assert_eq!(ConnRequest::decode(&padded).unwrap().0, req());
    }

    #[test]
    fn accept_and_refusal_round_trip() {
        let a = ConnAccept {
            node: 3,
            view: 9,
            addr: 0x7f00_dead_b000,
            len: (32 << 10) + (1 << 20),
            rkey: 0x1234_5678,
        };
        assert_eq!(ConnAccept::decode(&a.encode()).unwrap(), a);
        let mut padded = a.encode().to_vec();
        padded.resize(196, 0);
        assert_eq!(ConnAccept::decode(&padded).unwrap(), a);
        for code in [
            RefusalCode::Fenced,
            RefusalCode::WrongCluster,
            RefusalCode::WrongKey,
            RefusalCode::WrongNode,
            RefusalCode::Malformed,
            RefusalCode::Internal,
        ] {
            let r = Refusal { code, view: 42 };
            assert_eq!(Refusal::decode(&r.encode()).unwrap(), r);
        }
    }

    #[test]
    fn garbage_is_rejected() {
        let good = req().encode(KEY);
        assert!(matches!(
            ConnRequest::decode(&good[..55]),
            Err(WireError::Short { .. })
        ));
        assert!(matches!(
            ConnRequest::decode(&[]),
            Err(WireError::Short { .. })
        ));
        let flip = |i: usize, v: u8| {
            let mut b = good;
            b[i] = v;
            b
        };
        assert!(matches!(
            ConnRequest::decode(&flip(0, b'X')),
            Err(WireError::Magic { .. })
        ));
        assert!(matches!(
            ConnRequest::decode(&flip(4, 2)),
            Err(WireError::Magic { .. })
        ));
        for (i, v) in [(5, 0), (5, 16), (6, 0), (6, 200), (7, 1)] {
            assert!(
                matches!(
                    ConnRequest::decode(&flip(i, v)),
                    Err(WireError::Field { .. })
                ),
                "byte {i} = {v}"
            );
        }
        let mut trailing = good.to_vec();
        trailing.push(1);
        assert!(ConnRequest::decode(&trailing).is_err());
        // Another message's bytes are not a request, and the reverse.
        let acc = ConnAccept {
            node: 2,
            view: 1,
            addr: 4096,
            len: 4096,
            rkey: 1,
        };
        assert!(ConnRequest::decode(&acc.encode()).is_err());
        assert!(ConnAccept::decode(&good).is_err());
        assert!(Refusal::decode(&acc.encode()).is_err());
        // Unusable accepts.
        for bad in [
            ConnAccept { addr: 4097, ..acc },
            ConnAccept { len: 0, ..acc },
            ConnAccept {
                addr: u64::MAX - 7,
                ..acc
            },
            ConnAccept { node: 0, ..acc },
        ] {
            assert!(ConnAccept::decode(&bad.encode()).is_err(), "{bad:?}");
        }
        let mut r = Refusal {
            code: RefusalCode::Fenced,
            view: 1,
        }
        .encode();
        r[5] = 99;
        assert!(Refusal::decode(&r)
            .unwrap_err()
            .to_string()
            .contains("unknown refusal code"));
        // Any single flipped bit of a request is either refused by decode or
        // by the MAC.
        for bit in 0..REQUEST_LEN * 8 {
            let mut b = good;
            b[bit / 8] ^= 1 << (bit % 8);
            if let Ok((r, mac)) = ConnRequest::decode(&b) {
                assert!(!r.verify(&mac, KEY), "bit {bit} went unnoticed");
            }
        }
    }

    #[test]
    fn owner_answers() {
        let cluster = req().cluster;
        let known = |n: u64| (1..=3).contains(&n);
        let ask = |r: ConnRequest, key, view| answer(&r.encode(key), cluster, KEY, 3, view, known);
        assert_eq!(ask(req(), KEY, 7), Ok(req()));
        assert_eq!(ask(req(), KEY, 5), Ok(req()));
        let code = |r: Result<ConnRequest, Refusal>| r.unwrap_err().code;
        assert_eq!(code(ask(req(), KEY, 8)), RefusalCode::Fenced);
        assert_eq!(ask(req(), KEY, 8).unwrap_err().view, 8);
        assert_eq!(
            code(ask(req(), "another key 12345", 7)),
            RefusalCode::WrongKey
        );
        assert_eq!(
            code(ask(
                ConnRequest {
                    cluster: 1,
                    ..req()
                },
                KEY,
                7
            )),
            RefusalCode::WrongCluster
        );
        assert_eq!(
            code(ask(ConnRequest { to: 2, ..req() }, KEY, 7)),
            RefusalCode::WrongNode
        );
        assert_eq!(
            code(ask(ConnRequest { from: 3, ..req() }, KEY, 7)),
            RefusalCode::WrongNode
        );
        assert_eq!(
            code(ask(ConnRequest { from: 9, ..req() }, KEY, 7)),
            RefusalCode::WrongNode
        );
        assert_eq!(
            code(answer(b"GET / HTTP/1.1", cluster, KEY, 3, 7, known)),
            RefusalCode::Malformed
        );
    }
}
