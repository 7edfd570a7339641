//! The server side of the control channel: accepts connections, admits
//! members ([`crate::protocol::membership`]), serves region writes, status, view
//! change requests and fetches.

use std::net::{TcpListener, TcpStream};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use lockstep_common::control::{self, FetchedEntry, Request, Response};
use lockstep_common::handshake::{self, Channel};

use crate::protocol::membership;
use crate::protocol::{Event, Message};
use crate::snapshot::transfer::read_chunk;

use super::carried::Carried;
use super::Node;

/// Entries per chunk of a fetch's answer.
pub(super) const FETCH_BATCH: usize = 1024;
/// Bytes of encoded entries per chunk of a fetch's answer (a chunk ends
/// after the entry that reaches it): what the fetching node holds in
/// memory at a time, with one frame on each side.
pub(super) const FETCH_CHUNK_BYTES: usize = 4 << 20;
/// How long a peer's view change request waits for the replica's answer:
/// less than the requester's own read timeout, so that it hears a refusal
/// rather than nothing.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(9);

impl Node {
    pub(super) fn accept_loop(self: Arc<Self>, listener: TcpListener) {
        while !self.stopping() {
            match listener.accept() {
                Ok((stream, from)) => {
                    let n = self.clone();
                    let _ = std::thread::Builder::new()
                        .name("peer".into())
                        .spawn(move || n.serve_peer(stream, from));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    log::warn!("control accept: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    pub(super) fn serve_peer(&self, mut stream: TcpStream, from: std::net::SocketAddr) {
        let _ = stream.set_nonblocking(false);
        // Resolved at start (see `Node::start`): no I/O here.
        let key = match self.config.cluster_key() {
            Ok(k) => k,
            Err(e) => {
                log::error!("refused a connection from {from}: {e}");
                return;
            }
        };
        let hello = match handshake::accept(&mut stream, &self.config.cluster, key) {
            Ok(h) => h,
            Err(e) => {
                log::warn!("refused a connection from {from}: {e}");
                return;
            }
        };
        match hello.channel {
            Channel::Region => {
                if self.admit_region_writer(hello.node, from) {
                    self.region_server
                        .serve_draining(stream, hello.node, &|| self.drain_ring())
                }
            }
            Channel::Control => {
                if let Err(e) = self.serve_control(&mut stream, hello.node, from) {
                    if e.kind() != std::io::ErrorKind::UnexpectedEof {
                        log::debug!("control connection from {from}: {e}");
                    }
                }
            }
        }
    }

    /// Serves the requests of a control connection from node `peer` (as
    /// its handshake proved; 0: a CLI client).
    pub(super) fn serve_control(
        &self,
        s: &mut TcpStream,
        peer: u64,
        from: std::net::SocketAddr,
    ) -> std::io::Result<()> {
        s.set_read_timeout(None)?;
        loop {
            let req: Request = control::recv_json(s)?;
            if let Some(refusal) = self.refuse_request(peer, from, &req) {
                control::send_json(s, &refusal)?;
                continue;
            }
            match req {
                Request::Status => control::send_json(s, &Response::Status(self.status()))?,
                Request::Snapshot => {
                    let answer = match self.request_snapshot() {
                        Ok(seq) => Response::Snapshot { seq },
                        Err(e) => Response::Error(e),
                    };
                    control::send_json(s, &answer)?
                }
                Request::SnapshotMeta => control::send_json(s, &self.newest_snapshot_meta())?,
                Request::SnapshotChunk {
                    seq,
                    file,
                    offset,
                    len,
                } => match read_chunk(&self.catalog, seq, &file, offset, len) {
                    Ok(bytes) => control::send_snapshot_chunk(s, &bytes)?,
                    Err(e) => control::send_json(s, &Response::Error(format!("{e:#}")))?,
                },
                Request::Prepare { view, candidate } => {
                    let msg = Message::Prepare { view, candidate };
                    control::send_json(s, &self.answer(peer, candidate, msg))?
                }
                Request::NewView { view, leader, last } => {
                    let msg = Message::NewView { view, leader, last };
                    control::send_json(s, &self.answer(peer, leader, msg))?
                }
                Request::Fetch { from, to } => {
                    let oldest = self.store().oldest();
                    if from < oldest {
                        let why = format!(
                            "entries below seq {oldest} were compacted (a snapshot covers them): install a snapshot"
                        );
                        control::send_json(s, &Response::Error(why))?;
                        continue;
                    }
                    control::send_json(s, &Response::Entries)?;
                    let mut next = from.max(1);
                    loop {
                        let chunk = self.store().chunk(next, FETCH_BATCH, FETCH_CHUNK_BYTES);
                        let batch = match chunk {
                            Ok(b) => b,
                            Err(e) => {
                                log::error!("serving fetch: {e}");
                                break;
                            }
                        };
                        let batch: Vec<FetchedEntry> = batch
                            .into_iter()
                            .take_while(|(seq, _)| to == 0 || *seq <= to)
                            .map(|(seq, e)| FetchedEntry {
                                seq,
                                pos: e.pos,
                                bytes: e.bytes,
                            })
                            .collect();
                        if batch.is_empty() {
                            break;
                        }
                        next = batch[batch.len() - 1].seq + 1;
                        control::send_entries(s, &batch)?;
                    }
                    control::send_entries(s, &[])?;
                }
            }
        }
    }

    /// The answer to a control request that node `peer` (as its
    /// handshake proved) may not make, if it may not (see
    /// [`crate::protocol::membership`]); the refusal is logged.
    pub(crate) fn refuse_request(
        &self,
        peer: u64,
        from: std::net::SocketAddr,
        req: &Request,
    ) -> Option<Response> {
        let members: Vec<u64> = self.config.ids().collect();
        let why = membership::admit(&members, self.me, peer, req).err()?;
        log::warn!(
            "node {}: refused {} from node {peer} at {from}: {why}",
            self.me,
            membership::describe(req)
        );
        Some(Response::Error(format!("refused: {why}")))
    }

    /// Whether node `peer` may write into this node's region (tcp
    /// transport); a refusal is logged.
    pub(crate) fn admit_region_writer(&self, peer: u64, from: std::net::SocketAddr) -> bool {
        let members: Vec<u64> = self.config.ids().collect();
        match membership::admit_peer(&members, self.me, peer) {
            Ok(()) => true,
            Err(why) => {
                log::warn!(
                    "node {}: refused region writes from node {peer} at {from}: {why}",
                    self.me
                );
                false
            }
        }
    }

    /// Hands a view change request of node `peer` (admitted) to the
    /// replica and waits for its answer to `to` (the request's candidate
    /// or leader): at once for a `Prepare`, after the log sync for a
    /// `NewView`.
    fn answer(&self, peer: u64, to: u64, msg: Message) -> Response {
        let (tx, rx) = mpsc::channel();
        self.waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(to, tx);
        self.step(Event::Message { from: peer, msg }, Carried::Nothing);
        match rx.recv_timeout(ANSWER_TIMEOUT) {
            Ok(Message::Promise(p)) => Response::Promise(p),
            Ok(Message::Synced { last }) => Response::Synced { last },
            Ok(Message::Outdated { promised }) => Response::Outdated { promised },
            Ok(other) => Response::Error(format!("refused: {other:?}")),
            Err(_) => Response::Error("the request came to nothing".into()),
        }
    }
}
