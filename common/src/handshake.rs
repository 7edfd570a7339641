//! The handshake every TCP connection to a follower starts with, for the
//! region-write channel of the tcp transport and for the control channel
//! alike (both are served on the node's `control` address).
//!
//! All integers are little-endian.
//!
//! ```text
//! client → server  hello:   magic "LKSTEPv1" (8) | channel u8 | node u64 | cluster hash u64
//! server → client  reply:   0u8 | nonce (32 random bytes)        — go on
//!                       or  1u8 | reason len u8 | reason (UTF-8) — refused
//! client → server  proof:   mac (32) = blake3::keyed_hash(
//!                               blake3::derive_key("lockstep cluster key v1", key),
//!                               nonce | node u64 | channel u8)
//! server → client  verdict: 0u8                                  — accepted
//!                       or  1u8 | reason len u8 | reason         — refused
//! ```
//!
//! `channel` is 1 for region writes and 2 for control; `node` is the
//! connecting node's id (0 for a CLI client, which may only use the control
//! channel). The cluster hash is [`crate::region::cluster_hash`] of the
//! cluster name. `key` is [`crate::Config::cluster_key`]: the configured
//! key, or on a one-host cluster without one the key generated in
//! `<data_dir>/cluster.key` — every transport, shm included, proves a real
//! key, so a local process that cannot read that file is refused too.
//!
//! The server refuses a wrong magic, cluster, channel or node id before it
//! sends a nonce, and a wrong MAC after; every refusal carries a short
//! reason, is logged with `log::warn!` and ends with the connection shut
//! down. Both sides use read and write timeouts during the exchange (a
//! silent peer cannot hang a thread) and clear them once it succeeded.
//!
//! Only the client proves that it knows the key; the server is not
//! authenticated to the client.

use std::fmt;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

use crate::region::{cluster_hash, MAX_NODES};

/// First bytes of every hello.
pub const MAGIC: [u8; 8] = *b"LKSTEPv1";
/// Timeout of each step of [`accept`].
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// Context string of the MAC key derivation.
const KEY_CONTEXT: &str = "lockstep cluster key v1";
const HELLO_LEN: usize = 8 + 1 + 8 + 8;
const NONCE_LEN: usize = 32;
const STATUS_OK: u8 = 0;
const STATUS_REFUSED: u8 = 1;

/// What a connection is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Channel {
    /// One-sided region writes (the tcp transport).
    Region,
    /// Control requests (catch-up, status).
    Control,
}

impl Channel {
    /// The channel byte on the wire.
    pub fn to_byte(self) -> u8 {
        match self {
            Channel::Region => 1,
            Channel::Control => 2,
        }
    }

    /// The channel of a wire byte, if known.
    pub fn from_byte(b: u8) -> Option<Channel> {
        match b {
            1 => Some(Channel::Region),
            2 => Some(Channel::Control),
            _ => None,
        }
    }
}

impl fmt::Display for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Channel::Region => "region",
            Channel::Control => "control",
        })
    }
}

/// Who connected, once [`accept`] let them in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The channel asked for.
    pub channel: Channel,
    /// The peer's node id (0: a CLI client).
    pub node: u64,
}

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The peer refused us (client side), with its reason.
    #[error("refused by peer {addr}: {reason}")]
    Refused {
        /// The peer's address.
        addr: String,
        /// The peer's reason.
        reason: String,
    },
    /// We refused the peer (server side); it was told why.
    #[error("refused peer {addr}: {reason}")]
    Rejected {
        /// The peer's address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The peer answered something that is not this protocol.
    #[error("peer {addr} does not speak the lockstep protocol: {what}")]
    Protocol {
        /// The peer's address.
        addr: String,
        /// What was wrong.
        what: String,
    },
    /// A socket operation failed (timeouts included).
    #[error("handshake with {addr}: {op}: {source}")]
    Io {
        /// The peer's address.
        addr: String,
        /// What was being done.
        op: &'static str,
        /// The OS error.
        source: io::Error,
    },
}

fn io_err<'a>(addr: &'a str, op: &'static str) -> impl FnOnce(io::Error) -> HandshakeError + 'a {
    move |source| HandshakeError::Io {
        addr: addr.to_string(),
        op,
        source,
    }
}

fn peer_name(stream: &TcpStream) -> String {
    stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "(unknown)".into())
}

/// The MAC a client sends for `nonce`.
fn mac(key: &str, nonce: &[u8; NONCE_LEN], node: u64, channel: Channel) -> blake3::Hash {
    let k = blake3::derive_key(KEY_CONTEXT, key.as_bytes());
    let mut msg = [0u8; NONCE_LEN + 8 + 1];
    msg[..NONCE_LEN].copy_from_slice(nonce);
    msg[NONCE_LEN..NONCE_LEN + 8].copy_from_slice(&node.to_le_bytes());
    msg[NONCE_LEN + 8] = channel.to_byte();
    blake3::keyed_hash(&k, &msg)
}

fn set_timeouts(s: &TcpStream, t: Option<Duration>) -> io::Result<()> {
    s.set_read_timeout(t)?;
    s.set_write_timeout(t)
}

/// Client side: connects to `addr` as node `me` (0 for a CLI client) of
/// `cluster`, proves knowledge of `key`, and returns a stream ready for
/// `channel` (TCP_NODELAY set, no timeouts). Each step waits at most
/// `timeout`.
pub fn connect(
    addr: SocketAddr,
    cluster: &str,
    key: &str,
    me: u64,
    channel: Channel,
    timeout: Duration,
) -> Result<TcpStream, HandshakeError> {
    let name = addr.to_string();
    let timeout = timeout.max(Duration::from_millis(1));
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(io_err(&name, "connect"))?;
    s.set_nodelay(true)
        .map_err(io_err(&name, "set TCP_NODELAY"))?;
    set_timeouts(&s, Some(timeout)).map_err(io_err(&name, "set timeouts"))?;

    let mut hello = [0u8; HELLO_LEN];
    hello[..8].copy_from_slice(&MAGIC);
    hello[8] = channel.to_byte();
    hello[9..17].copy_from_slice(&me.to_le_bytes());
    hello[17..25].copy_from_slice(&cluster_hash(cluster).to_le_bytes());
    s.write_all(&hello).map_err(io_err(&name, "send hello"))?;

    read_status(&mut s, &name)?;
    let mut nonce = [0u8; NONCE_LEN];
    s.read_exact(&mut nonce)
        .map_err(io_err(&name, "read nonce"))?;
    let proof = mac(key, &nonce, me, channel);
    s.write_all(proof.as_bytes())
        .map_err(io_err(&name, "send proof"))?;
    read_status(&mut s, &name)?;

    set_timeouts(&s, None).map_err(io_err(&name, "clear timeouts"))?;
    Ok(s)
}

/// Reads a status byte; on a refusal reads the reason and returns it.
fn read_status(s: &mut TcpStream, name: &str) -> Result<(), HandshakeError> {
    let mut b = [0u8; 1];
    s.read_exact(&mut b).map_err(io_err(name, "read answer"))?;
    match b[0] {
        STATUS_OK => Ok(()),
        STATUS_REFUSED => {
            let mut len = [0u8; 1];
            s.read_exact(&mut len)
                .map_err(io_err(name, "read refusal"))?;
            let mut reason = vec![0u8; len[0] as usize];
            s.read_exact(&mut reason)
                .map_err(io_err(name, "read refusal"))?;
            Err(HandshakeError::Refused {
                addr: name.to_string(),
                reason: String::from_utf8_lossy(&reason).into_owned(),
            })
        }
        other => Err(HandshakeError::Protocol {
            addr: name.to_string(),
            what: format!("unexpected status byte {other:#04x}"),
        }),
    }
}

/// Server side: runs the handshake on an accepted stream for either
/// channel. On success the stream has no timeouts and the caller serves
/// [`Hello::channel`]; on failure the peer was told why (when it got that
/// far), the refusal was logged and the stream is shut down.
pub fn accept(stream: &mut TcpStream, cluster: &str, key: &str) -> Result<Hello, HandshakeError> {
    accept_channels(stream, cluster, key, &[Channel::Region, Channel::Control])
}

/// Like [`accept`], but refuses channels not in `allowed` (with a reason
/// the peer sees) before authenticating.
pub fn accept_channels(
    stream: &mut TcpStream,
    cluster: &str,
    key: &str,
    allowed: &[Channel],
) -> Result<Hello, HandshakeError> {
    let name = peer_name(stream);
    let result = accept_inner(stream, &name, cluster, key, allowed);
    match &result {
        Ok(_) => {
            if let Err(e) = set_timeouts(stream, None) {
                let _ = stream.shutdown(Shutdown::Both);
                return Err(io_err(&name, "clear timeouts")(e));
            }
        }
        Err(e) => {
            log::warn!("handshake: {e}");
            if matches!(e, HandshakeError::Rejected { .. }) {
                drain_before_close(stream);
            }
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
    result
}

fn accept_inner(
    s: &mut TcpStream,
    name: &str,
    cluster: &str,
    key: &str,
    allowed: &[Channel],
) -> Result<Hello, HandshakeError> {
    let _ = s.set_nodelay(true);
    set_timeouts(s, Some(TIMEOUT)).map_err(io_err(name, "set timeouts"))?;
    let mut hello = [0u8; HELLO_LEN];
    s.read_exact(&mut hello[..8])
        .map_err(io_err(name, "read hello"))?;
    if hello[..8] != MAGIC {
        return refuse(
            s,
            name,
            "bad magic: not a lockstep peer (or another protocol version)".into(),
        );
    }
    s.read_exact(&mut hello[8..])
        .map_err(io_err(name, "read hello"))?;
    let node = u64::from_le_bytes(hello[9..17].try_into().unwrap_or_default());
    let hash = u64::from_le_bytes(hello[17..25].try_into().unwrap_or_default());
    if hash != cluster_hash(cluster) {
        return refuse(
            s,
            name,
            format!("wrong cluster: this node belongs to cluster {cluster:?}"),
        );
    }
    let channel = match Channel::from_byte(hello[8]) {
        Some(c) if allowed.contains(&c) => c,
        Some(c) => return refuse(s, name, format!("the {c} channel is not served here")),
        None => return refuse(s, name, format!("unknown channel {}", hello[8])),
    };
    if node > MAX_NODES as u64 || (node == 0 && channel == Channel::Region) {
        return refuse(
            s,
            name,
            format!("node id {node} may not use the {channel} channel"),
        );
    }

    let mut nonce = [0u8; NONCE_LEN];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut nonce))
        .map_err(io_err(name, "read /dev/urandom"))?;
    let mut reply = [0u8; 1 + NONCE_LEN];
    reply[0] = STATUS_OK;
    reply[1..].copy_from_slice(&nonce);
    s.write_all(&reply).map_err(io_err(name, "send nonce"))?;

    let mut proof = [0u8; 32];
    s.read_exact(&mut proof)
        .map_err(io_err(name, "read proof"))?;
    // blake3::Hash equality is constant-time.
    if blake3::Hash::from(proof) != mac(key, &nonce, node, channel) {
        return refuse(
            s,
            name,
            format!("authentication failed for node {node}: wrong cluster key"),
        );
    }
    s.write_all(&[STATUS_OK])
        .map_err(io_err(name, "send verdict"))?;
    Ok(Hello { channel, node })
}

/// Closing a socket with unread input sends a reset, which can destroy the
/// refusal before the peer read it: send FIN first and read (for at most a
/// second) what the peer still sends.
fn drain_before_close(s: &mut TcpStream) {
    let _ = s.shutdown(Shutdown::Write);
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
            return;
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// Tells the peer why it is refused (best effort) and returns the error.
fn refuse<T>(s: &mut TcpStream, name: &str, reason: String) -> Result<T, HandshakeError> {
    let mut cut = reason.len().min(255);
    while !reason.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut msg = Vec::with_capacity(2 + cut);
    msg.push(STATUS_REFUSED);
    msg.push(cut as u8);
    msg.extend_from_slice(&reason.as_bytes()[..cut]);
    let _ = s.write_all(&msg);
    Err(HandshakeError::Rejected {
        addr: name.to_string(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    const KEY: &str = "0123456789abcdef";

    /// Serves one handshake on a fresh listener; returns the address and
    /// the server's verdict.
    fn server(
        cluster: &'static str,
        key: &'static str,
    ) -> (SocketAddr, std::thread::JoinHandle<Result<Hello, String>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().map_err(|e| e.to_string())?;
            accept(&mut s, cluster, key).map_err(|e| e.to_string())
        });
        (addr, t)
    }

    const T: Duration = Duration::from_secs(10);

    #[test]
    fn good_handshake() {
        let (addr, t) = server("c1", KEY);
        let s = connect(addr, "c1", KEY, 3, Channel::Region, T).unwrap();
        assert_eq!(s.read_timeout().unwrap(), None);
        assert_eq!(
            t.join().unwrap().unwrap(),
            Hello {
                channel: Channel::Region,
                node: 3
            }
        );
    }

    #[test]
    fn cli_client_with_the_key() {
        let (addr, t) = server("c1", KEY);
        connect(addr, "c1", KEY, 0, Channel::Control, T).unwrap();
        assert_eq!(t.join().unwrap().unwrap().node, 0);
    }

    /// What a client without the key can prove (the MAC over the empty
    /// key, which keyless shm clusters once accepted) is refused.
    #[test]
    fn a_client_without_the_key_is_refused() {
        let (addr, t) = server("c1", KEY);
        let e = connect(addr, "c1", "", 0, Channel::Control, T)
            .unwrap_err()
            .to_string();
        assert!(e.contains("wrong cluster key"), "{e}");
        assert!(t.join().unwrap().unwrap_err().contains("wrong cluster key"));
    }

    #[test]
    fn wrong_key_cluster_channel_node() {
        let (addr, t) = server("c1", KEY);
        let e = connect(addr, "c1", "fedcba9876543210", 2, Channel::Region, T)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("refused by peer") && e.contains("wrong cluster key"),
            "{e}"
        );
        assert!(t.join().unwrap().unwrap_err().contains("wrong cluster key"));

        let (addr, t) = server("c1", KEY);
        let e = connect(addr, "c2", KEY, 2, Channel::Region, T)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("refused by peer") && e.contains("wrong cluster"),
            "{e}"
        );
        assert!(t.join().unwrap().is_err());

        let (addr, t) = server("c1", KEY);
        let e = connect(addr, "c1", KEY, 0, Channel::Region, T)
            .unwrap_err()
            .to_string();
        assert!(e.contains("node id 0"), "{e}");
        assert!(t.join().unwrap().is_err());

        let (addr, t) = server("c1", KEY);
        let mut s = TcpStream::connect(addr).unwrap();
        let mut hello = [0u8; HELLO_LEN];
        hello[..8].copy_from_slice(&MAGIC);
        hello[8] = 9;
        hello[17..25].copy_from_slice(&cluster_hash("c1").to_le_bytes());
        s.write_all(&hello).unwrap();
        let e = read_status(&mut s, "x").unwrap_err().to_string();
        assert!(e.contains("unknown channel 9"), "{e}");
        drop(s);
        assert!(t.join().unwrap().is_err());
    }

    #[test]
    fn bad_magic_is_refused_and_closed() {
        let (addr, t) = server("c1", KEY);
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        let e = read_status(&mut s, "x").unwrap_err().to_string();
        assert!(e.contains("bad magic"), "{e}");
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        assert!(rest.is_empty());
        drop(s);
        assert!(t.join().unwrap().unwrap_err().contains("bad magic"));
    }

    #[test]
    fn not_a_lockstep_server() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.write_all(b"SSH-2.0-OpenSSH\r\n").unwrap();
            let mut b = [0u8; HELLO_LEN];
            let _ = s.read_exact(&mut b);
        });
        let e = connect(addr, "c1", KEY, 1, Channel::Control, T)
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not speak the lockstep protocol"), "{e}");
        t.join().unwrap();
    }

    #[test]
    fn silent_peer_times_out() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let _keep = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            std::thread::sleep(Duration::from_secs(3));
            drop(s);
        });
        let e = connect(
            addr,
            "c1",
            KEY,
            1,
            Channel::Control,
            Duration::from_millis(200),
        )
        .unwrap_err();
        assert!(matches!(e, HandshakeError::Io { .. }), "{e}");
    }
}
