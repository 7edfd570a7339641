//! The control channel between followers (catch-up, view change) and from
//! the CLI (`lockstep status`): length-prefixed frames over a TCP stream
//! that passed the handshake.
//!
//! Frame: `len u32 LE | tag u8 | body`. Tag `J`: a JSON [`Request`] or
//! [`Response`]. Tag `E`: a batch of log entries, each
//! `seq u64 | pos u64 | len u32 | bytes`, answering a `Fetch`; an empty
//! batch ends the answer.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

/// Largest frame accepted (a garbage length must not allocate gigabytes).
pub const MAX_FRAME: usize = 64 << 20;

/// A request to a follower.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Report this node's state.
    Status,
    /// Send stored entries with seq in `from..=to` (to = 0: up to the last).
    Fetch {
        /// First seq wanted.
        from: u64,
        /// Last seq wanted (0: all).
        to: u64,
    },
    /// View change, phase 1: fence every view below `view` and report the
    /// log (answered by `Promise`).
    Prepare {
        /// The view being started.
        view: u64,
        /// Its candidate.
        candidate: u64,
    },
    /// View change, phase 2: make the log equal to the new leader's (cut
    /// back to the own commit point, fetch the rest from `leader`), follow
    /// `leader` in `view` (answered by `Synced`).
    NewView {
        /// The view.
        view: u64,
        /// Its leader.
        leader: u64,
        /// The new leader's log ends here (its VIEW entry).
        last: u64,
    },
}

/// One node's state, as `lockstep status` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// Node id.
    pub node: u64,
    /// Current view.
    pub view: u64,
    /// Leader of the current view (0: none).
    pub leader: u64,
    /// "leader", "backup", "joining" or "stale".
    pub role: String,
    /// Why a stale node must be restarted (None unless stale).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_reason: Option<String>,
    /// Highest seq stored durably.
    pub persisted: u64,
    /// Highest seq known committed.
    pub committed: u64,
    /// Highest seq applied to the local server (the leader's server
    /// consumed everything it logged: applied = persisted there).
    pub applied: u64,
    /// Output divergences detected against the leader.
    pub divergences: u64,
    /// Pid of the server attached to the region (0: none).
    pub server_pid: u64,
    /// Pid of the follower process answering.
    pub follower_pid: u64,
}

/// What a node reports when it fences the views below a candidate's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Promise {
    /// The promising node.
    pub node: u64,
    /// The view whose leader its log follows.
    pub log_view: u64,
    /// Its last stored seq.
    pub last_seq: u64,
    /// Its highest seq known committed.
    pub committed: u64,
    /// Set when it led `log_view` and stopped: that view and the highest
    /// seq its server was handed (exact: hand-overs are fenced).
    #[serde(default)]
    pub led: Option<(u64, u64)>,
}

/// A follower's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// Answer to `Status`.
    Status(NodeStatus),
    /// Entry batches follow (tag `E` frames), then an empty batch.
    Entries,
    /// The request failed.
    Error(String),
    /// Answer to `Prepare`: views below it are fenced here now.
    Promise(Promise),
    /// Answer to `NewView`: the log now ends at `last`.
    Synced {
        /// Last stored seq.
        last: u64,
    },
    /// Answer to `Prepare` or `NewView` of an older view: this node
    /// promised view `promised` already. A candidate tries a view above
    /// it next (a promised view that never starts must not stall the
    /// cluster).
    Outdated {
        /// The view this node promised.
        promised: u64,
    },
}

/// An entry as shipped by `Fetch`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchedEntry {
    /// Its seq.
    pub seq: u64,
    /// Its ring position.
    pub pos: u64,
    /// The encoded entry.
    pub bytes: Vec<u8>,
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Writes one frame.
pub fn write_frame(w: &mut impl Write, tag: u8, body: &[u8]) -> io::Result<()> {
    let len = (body.len() + 1) as u32;
    let mut head = [0u8; 5];
    head[..4].copy_from_slice(&len.to_le_bytes());
    head[4] = tag;
    w.write_all(&head)?;
    w.write_all(body)
}

/// Reads one frame: (tag, body).
pub fn read_frame(r: &mut impl Read) -> io::Result<(u8, Vec<u8>)> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len == 0 || len > MAX_FRAME {
        return Err(bad(format!("control frame of {len} bytes")));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    let tag = body.remove(0);
    Ok((tag, body))
}

/// Sends a JSON message.
pub fn send_json<T: Serialize>(w: &mut impl Write, msg: &T) -> io::Result<()> {
    let body = serde_json::to_vec(msg).map_err(|e| bad(e.to_string()))?;
    write_frame(w, b'J', &body)
}

/// Receives a JSON message.
pub fn recv_json<T: for<'de> Deserialize<'de>>(r: &mut impl Read) -> io::Result<T> {
    let (tag, body) = read_frame(r)?;
    if tag != b'J' {
        return Err(bad(format!("expected a JSON frame, got tag {tag}")));
    }
    serde_json::from_slice(&body).map_err(|e| bad(format!("bad control message: {e}")))
}

/// Sends a batch of entries (an empty batch ends a `Fetch` answer).
pub fn send_entries(w: &mut impl Write, entries: &[FetchedEntry]) -> io::Result<()> {
    let mut body = Vec::with_capacity(entries.iter().map(|e| 20 + e.bytes.len()).sum());
    for e in entries {
        body.extend_from_slice(&e.seq.to_le_bytes());
        body.extend_from_slice(&e.pos.to_le_bytes());
        body.extend_from_slice(&(e.bytes.len() as u32).to_le_bytes());
        body.extend_from_slice(&e.bytes);
    }
    write_frame(w, b'E', &body)
}

/// Receives a batch of entries.
pub fn recv_entries(r: &mut impl Read) -> io::Result<Vec<FetchedEntry>> {
    let (tag, body) = read_frame(r)?;
    if tag != b'E' {
        return Err(bad(format!("expected an entry batch, got tag {tag}")));
    }
    let mut out = Vec::new();
    let mut at = 0;
    while at < body.len() {
        if body.len() - at < 20 {
            return Err(bad("truncated entry in batch"));
        }
        let seq = u64::from_le_bytes(body[at..at + 8].try_into().expect("8"));
        let pos = u64::from_le_bytes(body[at + 8..at + 16].try_into().expect("8"));
        let len = u32::from_le_bytes(body[at + 16..at + 20].try_into().expect("4")) as usize;
        at += 20;
        if body.len() - at < len {
            return Err(bad("truncated entry in batch"));
        }
        out.push(FetchedEntry {
            seq,
            pos,
            bytes: body[at..at + len].to_vec(),
        });
        at += len;
    }
    Ok(out)
}

/// Asks node `id`'s follower for its status over the control channel
/// (as a CLI client, node 0); `timeout` bounds the connect and the answer.
pub fn query_status(
    config: &crate::Config,
    id: u64,
    timeout: std::time::Duration,
) -> Result<NodeStatus, String> {
    use crate::handshake::{self, Channel};
    let addr = config.node(id).map_err(|e| e.0)?.control;
    let mut s = handshake::connect(
        addr,
        &config.cluster,
        config.key.as_deref(),
        0,
        Channel::Control,
        timeout,
    )
    .map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    send_json(&mut s, &Request::Status).map_err(|e| e.to_string())?;
    match recv_json::<Response>(&mut s).map_err(|e| e.to_string())? {
        Response::Status(st) => Ok(st),
        Response::Error(e) => Err(e),
        other => Err(format!("unexpected answer {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let mut buf = Vec::new();
        send_json(&mut buf, &Request::Fetch { from: 3, to: 9 }).unwrap();
        let es = vec![
            FetchedEntry {
                seq: 3,
                pos: 0,
                bytes: vec![1; 128],
            },
            FetchedEntry {
                seq: 4,
                pos: 128,
                bytes: vec![2; 64],
            },
        ];
        send_entries(&mut buf, &es).unwrap();
        send_entries(&mut buf, &[]).unwrap();
        let mut r = &buf[..];
        let req: Request = recv_json(&mut r).unwrap();
        assert_eq!(req, Request::Fetch { from: 3, to: 9 });
        assert_eq!(recv_entries(&mut r).unwrap(), es);
        assert!(recv_entries(&mut r).unwrap().is_empty());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let mut r: &[u8] = &[0xff, 0xff, 0xff, 0xff, b'J'];
        assert!(read_frame(&mut r).is_err());
        let mut buf = Vec::new();
        write_frame(&mut buf, b'J', b"{not json").unwrap();
        assert!(recv_json::<Request>(&mut &buf[..]).is_err());
        let mut buf = Vec::new();
        write_frame(&mut buf, b'E', &[1, 2, 3]).unwrap();
        assert!(recv_entries(&mut &buf[..]).is_err());
    }
}
