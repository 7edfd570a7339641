//! The server side of the control channel: accepts connections, admits
//! members ([`crate::membership`]), serves region writes, status, view
//! change requests and fetches.

use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use lockstep_common::control::{self, FetchedEntry, Request, Response};
use lockstep_common::handshake::{self, Channel};

use crate::membership;
use crate::protocol::fence::ViewRefusal;

use super::Node;

/// Entries per catch-up batch.
pub(super) const FETCH_BATCH: usize = 1024;

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
                    self.region_server.serve(stream, hello.node)
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
                Request::Prepare { view, candidate } => {
                    control::send_json(s, &self.answer_prepare(view, candidate))?
                }
                Request::NewView { view, leader, last } => {
                    control::send_json(s, &self.answer_new_view(view, leader, last))?
                }
                Request::Fetch { from, to } => {
                    control::send_json(s, &Response::Entries)?;
                    let mut next = from.max(1);
                    loop {
                        let batch = match self.store().range(next, FETCH_BATCH) {
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
    /// [`crate::membership`]); the refusal is logged.
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

    /// Answers a `Prepare` (its sender was admitted).
    pub(crate) fn answer_prepare(&self, view: u64, candidate: u64) -> Response {
        match self.promise(view, candidate) {
            Ok(p) => Response::Promise(p),
            Err(e) => refusal(e),
        }
    }

    /// Answers a `NewView` (its sender was admitted).
    pub(crate) fn answer_new_view(&self, view: u64, leader: u64, last: u64) -> Response {
        match self.follow(view, leader, Some(last)) {
            Ok(last) => Response::Synced { last },
            Err(e) => refusal(e),
        }
    }
}

/// The answer to a view change request this node refused: `Outdated`
/// when it promised a newer view (the candidate then tries above it).
fn refusal(e: anyhow::Error) -> Response {
    match e.downcast_ref::<ViewRefusal>() {
        Some(ViewRefusal::Outdated { promised, .. }) => Response::Outdated {
            promised: *promised,
        },
        _ => Response::Error(format!("{e:#}")),
    }
}
