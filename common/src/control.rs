//! The control channel between followers (catch-up, view change) and from
//! the CLI (`lockstep status`): length-prefixed frames over a TCP stream
//! that passed the handshake.
//!
//! Frame: `len u32 LE | tag u8 | body`. Tag `J`: a JSON [`Request`] or
//! [`Response`]. Tag `E`: a batch of log entries, each
//! `seq u64 | pos u64 | len u32 | bytes`, answering a `Fetch`; an empty
//! batch ends the answer. Tag `S`: one piece of a snapshot's file,
//! `blake3 (32) | bytes`, answering a `SnapshotChunk`
//! ([`send_snapshot_chunk`], [`recv_snapshot_chunk`] checks the sum).

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
    /// The newest complete snapshot (answered by `SnapshotMeta`).
    SnapshotMeta,
    /// Bytes `offset..offset + len` of file `file` of the snapshot at
    /// `seq` (answered by one tag `S` frame, at most
    /// [`SNAPSHOT_CHUNK`] bytes, fewer at the file's end).
    SnapshotChunk {
        /// The snapshot's seq.
        seq: u64,
        /// The file's name in it.
        file: String,
        /// Where the piece starts.
        offset: u64,
        /// How many bytes.
        len: u32,
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
    /// Take a snapshot of this node's server now (a backup's; answered by
    /// `Snapshot` once it is complete, or `Error`).
    Snapshot,
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
    /// "leader", "backup", "catching-up" (a backup whose apply lag is
    /// beyond `max_apply_lag`), "joining" or "stale".
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
    /// Milliseconds the server needs to apply its backlog (committed but
    /// not applied) at its recent apply rate.
    #[serde(default)]
    pub lag_ms: u64,
    /// Entries per second the server applied recently (0 on the leader).
    #[serde(default)]
    pub apply_rate: u64,
    /// On a leader that goes on although fewer than a majority of the
    /// nodes can apply: which cannot, and that a failover now inherits a
    /// backlog that grows (None otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover_backlog: Option<String>,
    /// Pid of the server attached to the region (0: none).
    pub server_pid: u64,
    /// Pid of the follower process answering.
    pub follower_pid: u64,
    /// ZooKeeper election: how long this node has been without a
    /// ZooKeeper session, in ms (None: connected, or not using ZooKeeper).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zookeeper_down_ms: Option<u64>,
    /// As leader: how long its oldest uncommitted entry has waited without
    /// the commit point moving, in ms (0: nothing waits; backups: 0).
    #[serde(default)]
    pub commit_wait_ms: u64,
    /// Seq of its newest complete snapshot (0: none).
    #[serde(default)]
    pub snapshot: u64,
    /// Bytes of that snapshot's image (0: none).
    #[serde(default)]
    pub snapshot_bytes: u64,
    /// The first seq its log still holds (entries below were compacted;
    /// 0 or 1: the whole log).
    #[serde(default)]
    pub oldest: u64,
    /// It is imaging its server now.
    #[serde(default)]
    pub snapshotting: bool,
    /// Bytes of log its server applied since its newest snapshot.
    #[serde(default)]
    pub bytes_since_snapshot: u64,
    /// Why this node takes no snapshots although the config asks for them
    /// (its attempts fail, or it cannot take any: no CRIU), since when;
    /// None while they work or with `snapshot = "off"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_failing: Option<SnapshotFailing>,
    /// Entries its log holds (from `oldest` to `persisted`).
    #[serde(default)]
    pub log_entries: u64,
    /// Bytes its log takes in the store (RocksDB's tables and memtables).
    #[serde(default)]
    pub log_bytes: u64,
    /// Why the node is degraded, in words: its log holds more than
    /// `snapshot_degraded_after` times `snapshot_every` (None: it is not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degraded: Option<String>,
}

/// A node's snapshots failing (see [`NodeStatus::snapshot_failing`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotFailing {
    /// Milliseconds since the first failure of this run (or since the
    /// follower started, when it cannot take any).
    pub for_ms: u64,
    /// Failed attempts since (0: none made, it cannot take any).
    pub failures: u64,
    /// Milliseconds since the latest failed attempt.
    #[serde(default)]
    pub last_ms: u64,
    /// The latest reason, one line.
    pub reason: String,
    /// What fixes it, one line.
    pub fix: String,
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
// One is built per control request and sent at once: the status's size
// (the largest variant) costs nothing worth a box on every status read.
#[allow(clippy::large_enum_variant)]
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
    /// Answer to `SnapshotMeta`: the newest complete snapshot's seq and
    /// its `meta.json` text (None: this node has none).
    SnapshotMeta(Option<(u64, String)>),
    /// Answer to `Prepare` or `NewView` of an older view: this node
    /// promised view `promised` already. A candidate tries a view above
    /// it next (a promised view that never starts must not stall the
    /// cluster).
    Outdated {
        /// The view this node promised.
        promised: u64,
    },
    /// Answer to `Snapshot`: a complete snapshot at `seq` is on disk.
    Snapshot {
        /// The last seq its server had applied.
        seq: u64,
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

impl FetchedEntry {
    /// Checks an entry a peer sent: its bytes are exactly one valid entry
    /// (at most `max_len` bytes of payload) with the seq it is labelled
    /// with, at an entry-aligned ring position. Returns its header.
    pub fn check(&self, max_len: u32) -> Result<crate::entry::EntryHeader, String> {
        let (h, _) = crate::entry::decode(&self.bytes, max_len).map_err(|e| e.to_string())?;
        if h.seq != self.seq {
            return Err(format!("entry {} labelled {}", h.seq, self.seq));
        }
        if self.bytes.len() != h.footprint() {
            return Err(format!(
                "{} bytes for an entry of footprint {}",
                self.bytes.len(),
                h.footprint()
            ));
        }
        let aligned = self.pos.is_multiple_of(crate::entry::ENTRY_ALIGN as u64);
        if !aligned || self.pos.checked_add(self.bytes.len() as u64).is_none() {
            return Err(format!(
                "ring position {} is not a place for an entry",
                self.pos
            ));
        }
        Ok(h)
    }
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Writes one frame; a body the peer would refuse (above
/// [`MAX_FRAME`] with its tag) is an error, not a frame.
pub fn write_frame(w: &mut impl Write, tag: u8, body: &[u8]) -> io::Result<()> {
    if body.len() >= MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a control frame of {} bytes is above the {MAX_FRAME}-byte limit",
                body.len() + 1
            ),
        ));
    }
    let len = (body.len() + 1) as u32;
    let mut head = [0u8; 5];
    head[..4].copy_from_slice(&len.to_le_bytes());
    head[4] = tag;
    w.write_all(&head)?;
    w.write_all(body)
}

/// Reads one frame: (tag, body). The body grows as its bytes arrive, so a
/// length field alone makes no allocation: memory follows what the peer
/// actually sent, and never passes [`MAX_FRAME`].
pub fn read_frame(r: &mut impl Read) -> io::Result<(u8, Vec<u8>)> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len == 0 || len > MAX_FRAME {
        return Err(bad(format!("control frame of {len} bytes")));
    }
    let mut tag = [0u8; 1];
    r.read_exact(&mut tag)?;
    let want = len - 1;
    let mut body = Vec::with_capacity(want.min(64 << 10));
    r.take(want as u64).read_to_end(&mut body)?;
    if body.len() < want {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "control frame ended after {} of {len} bytes",
                body.len() + 1
            ),
        ));
    }
    Ok((tag[0], body))
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

/// Bytes an entry takes in a batch frame besides its own.
const BATCHED_ENTRY_HEAD: usize = 20;

/// Sends a batch of entries (an empty batch ends a `Fetch` answer), in as
/// many frames as [`MAX_FRAME`] needs: the receiver reads batches until an
/// empty one, so a split is invisible to it. An entry too long for any
/// frame is an error.
pub fn send_entries(w: &mut impl Write, entries: &[FetchedEntry]) -> io::Result<()> {
    let fits = MAX_FRAME - 1;
    let mut start = 0;
    let mut bytes = 0;
    for (i, e) in entries.iter().enumerate() {
        let n = BATCHED_ENTRY_HEAD + e.bytes.len();
        if n > fits {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "entry {} of {} bytes does not fit a control frame",
                    e.seq,
                    e.bytes.len()
                ),
            ));
        }
        if bytes + n > fits {
            send_batch(w, &entries[start..i], bytes)?;
            start = i;
            bytes = 0;
        }
        bytes += n;
    }
    if start < entries.len() || entries.is_empty() {
        send_batch(w, &entries[start..], bytes)?;
    }
    Ok(())
}

/// One batch frame of `bytes` body bytes.
fn send_batch(w: &mut impl Write, entries: &[FetchedEntry], bytes: usize) -> io::Result<()> {
    let mut body = Vec::with_capacity(bytes);
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

/// Largest piece of a snapshot's file one `SnapshotChunk` answers.
pub const SNAPSHOT_CHUNK: u32 = 1 << 20;

/// Sends one piece of a snapshot's file with its BLAKE3 sum (tag `S`).
pub fn send_snapshot_chunk(w: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    if bytes.len() > SNAPSHOT_CHUNK as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a snapshot chunk of {} bytes is above {SNAPSHOT_CHUNK}",
                bytes.len()
            ),
        ));
    }
    let mut body = Vec::with_capacity(32 + bytes.len());
    body.extend_from_slice(blake3::hash(bytes).as_bytes());
    body.extend_from_slice(bytes);
    write_frame(w, b'S', &body)
}

/// Receives one piece of a snapshot's file; an error when its BLAKE3 sum
/// does not match (corrupted on the way) or it is longer than
/// [`SNAPSHOT_CHUNK`].
pub fn recv_snapshot_chunk(r: &mut impl Read) -> io::Result<Vec<u8>> {
    let (tag, mut body) = read_frame(r)?;
    if tag != b'S' {
        if tag == b'J' {
            if let Ok(Response::Error(e)) = serde_json::from_slice::<Response>(&body) {
                return Err(io::Error::other(e));
            }
        }
        return Err(bad(format!("expected a snapshot chunk, got tag {tag}")));
    }
    if body.len() < 32 || body.len() - 32 > SNAPSHOT_CHUNK as usize {
        return Err(bad(format!("snapshot chunk frame of {} bytes", body.len())));
    }
    let data = body.split_off(32);
    if blake3::hash(&data).as_bytes()[..] != body[..] {
        return Err(bad(format!(
            "snapshot chunk of {} bytes fails its checksum",
            data.len()
        )));
    }
    Ok(data)
}

/// Asks node `id`'s follower for its status over the control channel
/// (as a CLI client, node 0, proving [`crate::Config::existing_cluster_key`]:
/// whoever can read the key may ask); `timeout` bounds the connect and the answer.
pub fn query_status(
    config: &crate::Config,
    id: u64,
    timeout: std::time::Duration,
) -> Result<NodeStatus, String> {
    match ask(config, id, &Request::Status, timeout, timeout)? {
        Response::Status(st) => Ok(st),
        Response::Error(e) => Err(e),
        other => Err(format!("unexpected answer {other:?}")),
    }
}

/// Asks node `id`'s follower to snapshot its server now (see
/// [`Request::Snapshot`]); returns the snapshot's seq. `patience` bounds
/// the wait for the answer.
pub fn take_snapshot(
    config: &crate::Config,
    id: u64,
    patience: std::time::Duration,
) -> Result<u64, String> {
    // A node busy applying may take a moment to answer the handshake.
    let connect = std::time::Duration::from_secs(10);
    match ask(config, id, &Request::Snapshot, connect, patience)? {
        Response::Snapshot { seq } => Ok(seq),
        Response::Error(e) => Err(e),
        other => Err(format!("unexpected answer {other:?}")),
    }
}

/// One request to node `id`'s follower as a CLI client (node 0).
fn ask(
    config: &crate::Config,
    id: u64,
    req: &Request,
    connect: std::time::Duration,
    answer: std::time::Duration,
) -> Result<Response, String> {
    use crate::handshake::{self, Channel};
    let addr = config.node(id).map_err(|e| e.0)?.control;
    let key = config.existing_cluster_key().map_err(|e| e.to_string())?;
    let mut s = handshake::connect(addr, &config.cluster, key, 0, Channel::Control, connect)
        .map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(answer))
        .map_err(|e| e.to_string())?;
    send_json(&mut s, req).map_err(|e| e.to_string())?;
    recv_json::<Response>(&mut s).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry;

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
    fn a_fetch_answer_longer_than_a_frame_is_split() {
        // 1024 entries of 64 KiB (the default max_entry), one store batch,
        // are more than one frame holds.
        let big = FetchedEntry {
            seq: 1,
            pos: 0,
            bytes: vec![7; entry::footprint(64 << 10)],
        };
        let es: Vec<FetchedEntry> = (1..=1024)
            .map(|seq| FetchedEntry { seq, ..big.clone() })
            .collect();
        assert!(es.iter().map(|e| 20 + e.bytes.len()).sum::<usize>() > MAX_FRAME);
        let mut buf = Vec::new();
        send_entries(&mut buf, &es).unwrap();
        send_entries(&mut buf, &[]).unwrap();
        let mut r = &buf[..];
        let mut got = Vec::new();
        let mut frames = 0;
        loop {
            let b = recv_entries(&mut r).unwrap();
            if b.is_empty() {
                break;
            }
            frames += 1;
            got.extend(b);
        }
        assert_eq!(frames, 2);
        assert_eq!(got, es);
        assert!(r.is_empty());
        // An entry no frame holds is refused before anything is sent.
        let huge = FetchedEntry {
            seq: 9,
            pos: 0,
            bytes: vec![0; MAX_FRAME],
        };
        let mut buf = Vec::new();
        assert!(send_entries(&mut buf, &[huge]).is_err());
        assert!(buf.is_empty());
        assert!(write_frame(&mut buf, b'J', &vec![0; MAX_FRAME]).is_err());
    }

    #[test]
    fn fetched_entries_are_checked() {
        let bytes = entry::encode(
            &entry::EntryHeader::new(entry::Kind::Data, 2, 7, 1, 3),
            b"abc",
        );
        let good = FetchedEntry {
            seq: 7,
            pos: 4096,
            bytes: bytes.clone(),
        };
        assert_eq!(good.check(64).unwrap().seq, 7);
        assert!(good.check(2).unwrap_err().contains("exceeds the maximum"));
        let e = FetchedEntry {
            seq: 8,
            ..good.clone()
        }
        .check(64)
        .unwrap_err();
        assert_eq!(e, "entry 7 labelled 8");
        let mut long = bytes.clone();
        long.extend_from_slice(&[0; 64]);
        let e = FetchedEntry {
            bytes: long,
            ..good.clone()
        }
        .check(64)
        .unwrap_err();
        assert!(e.contains("footprint"), "{e}");
        for pos in [4100, u64::MAX - 63] {
            let e = FetchedEntry {
                pos,
                ..good.clone()
            }
            .check(64)
            .unwrap_err();
            assert!(e.contains("not a place for an entry"), "{e}");
        }
    }

    #[test]
    fn a_snapshot_chunk_carries_its_checksum_and_a_flipped_bit_is_refused() {
        let data: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let mut buf = Vec::new();
        send_snapshot_chunk(&mut buf, &data).unwrap();
        assert_eq!(recv_snapshot_chunk(&mut &buf[..]).unwrap(), data);
        let last = buf.len() - 1;
        buf[last] ^= 1;
        let e = recv_snapshot_chunk(&mut &buf[..]).unwrap_err().to_string();
        assert!(e.contains("fails its checksum"), "{e}");
        // A refusal in its place reads as that refusal.
        let mut buf = Vec::new();
        send_json(&mut buf, &Response::Error("no snapshot 9".into())).unwrap();
        let e = recv_snapshot_chunk(&mut &buf[..]).unwrap_err().to_string();
        assert_eq!(e, "no snapshot 9");
        let big = vec![0; SNAPSHOT_CHUNK as usize + 1];
        assert!(send_snapshot_chunk(&mut Vec::new(), &big).is_err());
    }

    #[test]
    fn outdated_round_trips() {
        let mut buf = Vec::new();
        send_json(&mut buf, &Response::Outdated { promised: 1003 }).unwrap();
        assert_eq!(
            recv_json::<Response>(&mut &buf[..]).unwrap(),
            Response::Outdated { promised: 1003 }
        );
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
