//! The client side of the control channel: the replica's requests to
//! peers ([`crate::protocol::Action::Send`]), each carried out in a thread
//! of its own; the answer comes back to the replica as an
//! [`Event::Message`], a failure as [`Event::Unanswered`].

use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use lockstep_common::control::{self, NodeStatus, Request, Response};
use lockstep_common::entry::EntryHeader;
use lockstep_common::handshake::{self, Channel};

use crate::protocol::{EntryMeta, Event, Message};

use super::carried::Carried;
use super::Node;

/// Timeout of one control-channel exchange.
pub(super) const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the replica waits for a request's outcome before it drops
/// the job that sent it. A backstop: every request ends in an answer or
/// `Unanswered` by its own timeouts (connect, [`CONTROL_TIMEOUT`] per
/// read); a fetch's chunks each give it this long again.
pub(super) const REQUEST_PATIENCE: Duration = Duration::from_secs(60);
/// Connect timeout of a view change's requests: a dead or cut-off peer
/// must not hold the candidate up for long.
pub(super) const ROUND_CONNECT: Duration = Duration::from_millis(500);

impl Node {
    pub(super) fn control_connect(
        &self,
        peer: u64,
        connect_timeout: Duration,
    ) -> anyhow::Result<TcpStream> {
        let addr = self.config.node(peer)?.control;
        let s = handshake::connect(
            addr,
            &self.config.cluster,
            self.config.cluster_key()?,
            self.me,
            Channel::Control,
            connect_timeout,
        )?;
        s.set_read_timeout(Some(CONTROL_TIMEOUT))?;
        s.set_write_timeout(Some(CONTROL_TIMEOUT))?;
        Ok(s)
    }

    /// Node `peer`'s status, asked with `patience` for the connection and
    /// the answer each.
    pub(super) fn peer_status(&self, peer: u64, patience: Duration) -> anyhow::Result<NodeStatus> {
        let mut s = self.control_connect(peer, patience)?;
        s.set_read_timeout(Some(patience))?;
        control::send_json(&mut s, &Request::Status)?;
        match control::recv_json::<Response>(&mut s)? {
            Response::Status(st) => Ok(st),
            other => bail!("node {peer} answered {other:?}"),
        }
    }

    /// The statuses of the other nodes that answer within
    /// [`ROUND_CONNECT`], asked at once (the sentinel's check that the
    /// leader can commit; a dead or stopped peer only drops out).
    pub(crate) fn peer_statuses(&self) -> Vec<NodeStatus> {
        let ask = |id: u64| self.peer_status(id, ROUND_CONNECT);
        std::thread::scope(|scope| {
            let asks: Vec<_> = self
                .config
                .ids()
                .filter(|&id| id != self.me)
                .map(|id| (id, scope.spawn(move || ask(id))))
                .collect();
            asks.into_iter()
                .filter_map(|(id, h)| match h.join() {
                    Ok(Ok(st)) => Some(st),
                    Ok(Err(e)) => {
                        log::debug!("status of node {id}: {e:#}");
                        None
                    }
                    Err(_) => None,
                })
                .collect()
        })
    }

    /// Runs each request the replica sends in a thread of its own (the
    /// replica's requests to different peers run at once: a round).
    pub(super) fn dispatch_loop(self: Arc<Self>, requests: Receiver<(u64, Message)>) {
        while !self.stopping() {
            match requests.recv_timeout(Duration::from_millis(100)) {
                Ok((to, msg)) => {
                    let n = self.clone();
                    let spawned = std::thread::Builder::new()
                        .name("request".into())
                        .spawn(move || n.request(to, msg));
                    if let Err(e) = spawned {
                        log::warn!("cannot start a request to node {to}: {e}");
                        self.step(Event::Unanswered { to }, Carried::Nothing);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    /// Sends `msg` to `to` and steps the replica with the outcome.
    fn request(&self, to: u64, msg: Message) {
        if let Message::Fetch { from, to: upto } = msg {
            if let Err(e) = self.stream_fetch(to, from, upto) {
                log::info!("node {}: {msg:?} to node {to}: {e:#}", self.me);
                self.step(Event::Unanswered { to }, Carried::Nothing);
            }
            return;
        }
        match self.exchange(to, &msg) {
            Ok(answer) => self.step(
                Event::Message {
                    from: to,
                    msg: answer,
                },
                Carried::Nothing,
            ),
            Err(e) => {
                log::info!("node {}: {msg:?} to node {to}: {e:#}", self.me);
                self.step(Event::Unanswered { to }, Carried::Nothing);
            }
        }
    }

    /// Fetches `peer`'s entries `from..=to` (to = 0: all it has) and
    /// steps the replica with each chunk as it arrives (it stores them),
    /// so memory holds one chunk, never the whole answer. Stops reading
    /// once the replica left a chunk unstored (it no longer wants them).
    fn stream_fetch(&self, peer: u64, from: u64, to: u64) -> anyhow::Result<()> {
        self.metrics.catchups.fetch_add(1, Ordering::Relaxed);
        let mut s = self.open_fetch(peer, from, to)?;
        let (mut n, mut chunks, mut last) = (0u64, 0u64, None);
        loop {
            let chunk = control::recv_entries(&mut s)?;
            let mut metas = Vec::with_capacity(chunk.len());
            for e in &chunk {
                let h = match e.check(self.config.max_entry) {
                    Ok(h) => h,
                    Err(why) => bail!("node {peer} sent a bad entry {}: {why}", e.seq),
                };
                metas.push(EntryMeta {
                    seq: e.seq,
                    view: h.view,
                    last_committed: h.last_committed,
                });
            }
            let more = !chunk.is_empty();
            self.step(
                Event::Message {
                    from: peer,
                    msg: Message::Entries {
                        entries: metas,
                        more,
                    },
                },
                Carried::Fetched {
                    peer,
                    entries: &chunk,
                },
            );
            let Some(end) = chunk.last().map(|e| e.seq) else {
                break;
            };
            if self.store().last().seq < end {
                log::debug!(
                    "node {}: fetch from node {peer} dropped at seq {end}",
                    self.me
                );
                break;
            }
            n += chunk.len() as u64;
            chunks += 1;
            last = Some(end);
        }
        if let Some(last) = last {
            log::info!(
                "node {}: fetched {n} entries from node {peer} in {chunks} chunks, now at seq {last}",
                self.me
            );
        }
        Ok(())
    }

    /// One request and its answer.
    fn exchange(&self, to: u64, msg: &Message) -> anyhow::Result<Message> {
        let simple = |req: Request| -> anyhow::Result<Message> {
            let mut s = self.control_connect(to, ROUND_CONNECT)?;
            control::send_json(&mut s, &req)?;
            let answer = control::recv_json::<Response>(&mut s)?;
            Ok(message_of(answer))
        };
        match *msg {
            Message::Prepare { view, candidate } => simple(Request::Prepare { view, candidate }),
            Message::NewView { view, leader, last } => {
                simple(Request::NewView { view, leader, last })
            }
            Message::Peek { seq } => {
                let mut s = self.control_connect(to, CONTROL_TIMEOUT)?;
                control::send_json(&mut s, &Request::Fetch { from: seq, to: seq })?;
                match control::recv_json::<Response>(&mut s)? {
                    Response::Entries => {}
                    // An answer: it has no such entry (compacted: below
                    // every commit point, so only the probe that proves
                    // the source answers asks there).
                    Response::Error(_) => return Ok(Message::PeekAnswer { seq, view: None }),
                    other => bail!("node {to} answered {other:?}"),
                }
                let mut view = None;
                loop {
                    let chunk = control::recv_entries(&mut s)?;
                    if chunk.is_empty() {
                        break;
                    }
                    view = view.or(chunk
                        .iter()
                        .find(|e| e.seq == seq)
                        .and_then(|e| EntryHeader::parse(&e.bytes).ok())
                        .map(|h| h.view));
                }
                Ok(Message::PeekAnswer { seq, view })
            }
            _ => bail!("{msg:?} is no request"),
        }
    }

    /// Asks `peer` for its entries `from..=to` (to = 0: all it has); its
    /// chunks ([`control::recv_entries`]) follow on the stream returned,
    /// an empty one last.
    fn open_fetch(&self, peer: u64, from: u64, to: u64) -> anyhow::Result<TcpStream> {
        let mut s = self.control_connect(peer, CONTROL_TIMEOUT)?;
        control::send_json(&mut s, &Request::Fetch { from, to })?;
        match control::recv_json::<Response>(&mut s)? {
            Response::Entries => Ok(s),
            Response::Error(e) => bail!("node {peer} refused: {e}"),
            other => bail!("node {peer} answered {other:?}"),
        }
    }
}

/// A peer's answer to `Prepare` or `NewView`, as the replica reads it.
fn message_of(r: Response) -> Message {
    match r {
        Response::Promise(p) => Message::Promise(p),
        Response::Synced { last } => Message::Synced { last },
        Response::Outdated { promised } => Message::Outdated { promised },
        Response::Error(e) => {
            log::info!("a peer refused: {e}");
            Message::Refused
        }
        other => {
            log::info!("a peer answered {other:?}");
            Message::Refused
        }
    }
}
