//! The region owner's side: a thread that answers connect requests for
//! this node's region, and fences writers of older views by revoking their
//! queue pairs' remote-write access.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::verbs::{
    event, CmEvent, CmId, CompletionQueue, Device, ProtectionDomain, QpCaps, RegisteredRegion,
};
use super::wire::{self, ConnAccept, Refusal, RefusalCode};
use crate::region::Region;

/// How often the thread looks at the region's view (and at `stop`).
const TICK: Duration = Duration::from_millis(20);

/// What the thread needs to answer requests.
pub(super) struct Owner {
    pub me: u64,
    pub cluster: u64,
    pub key: String,
    pub known: Vec<u64>,
    pub local: Arc<Region>,
    pub device: Arc<Device>,
    pub pd: Arc<ProtectionDomain>,
    pub registered: RegisteredRegion,
    pub cq: Arc<CompletionQueue>,
}

/// A writer's connection into this region.
struct Accepted {
    id: CmId,
    from: u64,
    view: u64,
    established: bool,
    revoked: bool,
}

/// The running listener; stops (and closes every accepted connection) on
/// drop.
pub(super) struct Listener {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Listener {
    /// Starts listening on the device's anchor id (already bound).
    pub fn start(owner: Owner) -> Result<Listener, super::verbs::RdmaError> {
        owner.device.anchor().listen(64)?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("lockstep-rdma-listen".into())
            .spawn(move || owner.run(&s))
            .map_err(super::verbs::RdmaError::Listen)?;
        Ok(Listener {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Owner {
    fn run(self, stop: &AtomicBool) {
        let channel = self.device.anchor().channel().clone();
        let mut accepted: Vec<Accepted> = Vec::new();
        let mut view = self.local.view();
        while !stop.load(Ordering::Acquire) {
            match channel.next_event(TICK) {
                Ok(Some(ev)) => {
                    if !self.handle(ev, &mut accepted) {
                        break;
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    log::warn!("rdma listener: {e}");
                    std::thread::sleep(TICK * 5);
                }
            }
            let now = self.local.view();
            if now > view {
                view = now;
                self.fence(&mut accepted, view);
            }
        }
        // Accepted ids (and their queue pairs) go before the device.
        drop(accepted);
    }

    /// Handles one event; false when the listener must stop.
    fn handle(&self, mut ev: CmEvent, accepted: &mut Vec<Accepted>) -> bool {
        match ev.kind {
            event::RDMA_CM_EVENT_CONNECT_REQUEST => {
                if let Some(id) = ev.take_request() {
                    if let Some(a) = self.answer(id, &ev.private_data) {
                        accepted.push(a);
                    }
                }
            }
            event::RDMA_CM_EVENT_ESTABLISHED => {
                if let Some(a) = accepted.iter_mut().find(|a| a.id.key() == ev.id) {
                    a.established = true;
                    log::info!(
                        "rdma: node {} writes into this region (connected in view {})",
                        a.from,
                        a.view
                    );
                }
            }
            event::RDMA_CM_EVENT_DISCONNECTED
            | event::RDMA_CM_EVENT_REJECTED
            | event::RDMA_CM_EVENT_CONNECT_ERROR
            | event::RDMA_CM_EVENT_UNREACHABLE => {
                if let Some(i) = accepted.iter().position(|a| a.id.key() == ev.id) {
                    let a = accepted.swap_remove(i);
                    if a.established {
                        log::info!("rdma: node {} disconnected ({})", a.from, ev.name());
                    } else {
                        log::warn!(
                            "rdma: connection from node {} failed before it was established ({}, status {})",
                            a.from,
                            ev.name(),
                            ev.status
                        );
                    }
                }
            }
            event::RDMA_CM_EVENT_DEVICE_REMOVAL => {
                log::error!(
                    "rdma: device {} was removed: this node takes no more rdma writes",
                    self.device.name
                );
                return false;
            }
            _ => log::debug!("rdma listener: {} (status {})", ev.name(), ev.status),
        }
        true
    }

    /// Accepts or refuses a connect request; returns the accepted
    /// connection.
    fn answer(&self, mut id: CmId, data: &[u8]) -> Option<Accepted> {
        let view = self.local.view();
        let refuse = |id: &CmId, r: Refusal, who: String| {
            log::warn!("rdma: refused a connection from {who}: {r}");
            if let Err(e) = id.reject(&r.encode()) {
                log::warn!("rdma: {e}");
            }
        };
        let req = match wire::answer(data, self.cluster, &self.key, self.me, view, |n| {
            self.known.contains(&n)
        }) {
            Ok(r) => r,
            Err(r) => {
                let who = match wire::ConnRequest::decode(data) {
                    Ok((q, _)) => format!("node {} (view {})", q.from, q.view),
                    Err(e) => format!("an unknown peer ({e})"),
                };
                refuse(&id, r, who);
                return None;
            }
        };
        let internal = Refusal {
            code: RefusalCode::Internal,
            view,
        };
        if !id.same_device(&self.pd) {
            log::error!(
                "rdma: node {}'s request arrived on another device than {} (give each node one RDMA device and a control address on it)",
                req.from,
                self.device.name
            );
            refuse(&id, internal, format!("node {}", req.from));
            return None;
        }
        // The owner never posts: a minimal send queue.
        let caps = QpCaps {
            max_send_wr: 1,
            max_inline: 0,
        };
        if let Err(e) = id.create_qp(&self.pd, &self.cq, caps) {
            log::error!("rdma: cannot accept node {}: {e}", req.from);
            refuse(&id, internal, format!("node {}", req.from));
            return None;
        }
        let acc = ConnAccept {
            node: self.me,
            view,
            addr: self.registered.addr(),
            len: self.registered.len(),
            rkey: self.registered.rkey(),
        };
        if let Err(e) = id.accept(&acc.encode()) {
            log::warn!("rdma: accepting node {}: {e}", req.from);
            return None;
        }
        Some(Accepted {
            id,
            from: req.from,
            view: req.view,
            established: false,
            revoked: false,
        })
    }

    /// The region moved to `view`: writers connected in older views lose
    /// their write access (their next WRITE fails and they reconnect,
    /// learning the new view if theirs is older).
    fn fence(&self, accepted: &mut [Accepted], view: u64) {
        for a in accepted.iter_mut().filter(|a| a.view < view && !a.revoked) {
            match a.id.set_remote_write(false) {
                Ok(()) => {
                    a.revoked = true;
                    log::info!(
                        "rdma: region moved to view {view}: revoked node {}'s write access (connected in view {})",
                        a.from,
                        a.view
                    );
                }
                Err(e) => {
                    // Cannot revoke: cut the connection instead.
                    log::warn!(
                        "rdma: revoking node {}'s write access: {e}; disconnecting it",
                        a.from
                    );
                    a.id.disconnect();
                    a.revoked = true;
                }
            }
        }
    }
}
