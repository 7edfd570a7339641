//! The server's listeners against this node's app address: a server that
//! listens in the wrong place stops before it serves anyone (fail closed).
//!
//! Three mistakes a person starting a node by hand makes, each of which
//! used to leave a server answering clients that nothing replicates:
//! - a config that does not load, or a `LOCKSTEP_NODE` it does not name:
//!   stopped at the server's first `listen`, not at its first client (a
//!   supervisor saw a healthy process until traffic came);
//! - a listener on *another* node's app address (`LOCKSTEP_NODE=1` on node
//!   2's port): stopped at that `listen`, naming the node it belongs to;
//! - no listener on the app address at all: stopped when the thread that
//!   set up its listeners comes to wait in its event loop, which a server
//!   does only once its listeners are open.
//!
//! Other listeners beside the app listener (a unix socket for admin tools,
//! a metrics port) stay allowed: their clients are not replicated, as
//! docs/guide/your-server.md says.

use std::cell::Cell;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::setup::{self, Settings};

/// The server listens on its app address.
static APP_LISTENER: AtomicBool = AtomicBool::new(false);
/// A thread that opened a listener came to wait: the verdict is made.
static CHECKED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// A TCP listener this thread opened that is not the app address.
    static OTHER: Cell<Option<SocketAddr>> = const { Cell::new(None) };
}

/// What a new TCP listener on `local` means for node `s.me`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listener {
    /// The node's app listener.
    App,
    /// Another node's app address: the node id is wrong (the reason).
    OtherNode(String),
    /// Some other address (allowed beside the app listener).
    Other,
}

/// Classifies a listener bound to `local` (pure).
pub fn classify(s: &Settings, local: SocketAddr) -> Listener {
    if setup::is_app_addr(local, s.app) {
        return Listener::App;
    }
    match s
        .config
        .nodes
        .iter()
        .find(|n| n.id != s.me && setup::is_app_addr(local, n.app))
    {
        Some(n) => Listener::OtherNode(format!(
            "the server listens on {local}, node {}'s app address, but LOCKSTEP_NODE={} (whose app address is {}): start it with LOCKSTEP_NODE={}, or on node {}'s address",
            n.id, s.me, s.app, n.id, s.me
        )),
        None => Listener::Other,
    }
}

/// After the server's successful `listen(fd)`: a config that does not
/// load, or a listener on another node's address, stops the server now
/// (see [`setup::cannot_replicate`]). Returns whether `fd` is the app
/// listener (false also when the library is off).
pub fn after_listen(local: Option<SocketAddr>) -> bool {
    let s = match setup::settings() {
        None => return false,
        Some(Err(reason)) => {
            setup::cannot_replicate(reason);
            return false;
        }
        Some(Ok(s)) => s,
    };
    // A unix socket (no address) is some other listener.
    let Some(local) = local else {
        return false;
    };
    match classify(s, local) {
        Listener::App => {
            APP_LISTENER.store(true, Ordering::Release);
            true
        }
        Listener::OtherNode(reason) => {
            setup::cannot_replicate(&reason);
            false
        }
        Listener::Other => {
            OTHER.with(|o| {
                if o.get().is_none() {
                    o.set(Some(local));
                }
            });
            false
        }
    }
}

/// Before a server thread waits in its event loop: once the thread that
/// opened a listener elsewhere waits, a server without an app listener
/// stops. One relaxed load once decided.
#[inline]
pub fn before_wait() {
    if CHECKED.load(Ordering::Relaxed) {
        return;
    }
    let Some(other) = OTHER.with(Cell::get) else {
        return;
    };
    CHECKED.store(true, Ordering::Relaxed);
    if APP_LISTENER.load(Ordering::Acquire) {
        return;
    }
    if let Some(Ok(s)) = setup::settings() {
        let reason = format!(
            "the server listens on {other} but not on node {}'s app address {}: give it that address, or start it with the LOCKSTEP_NODE whose app address it is",
            s.me, s.app
        );
        setup::cannot_replicate(&reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_common::Config;

    fn settings(me: u64) -> Settings {
        let text = lockstep_testkit::config_fixture::ThreeNodeConfig::new(
            "cluster = \"listeners\"\ndata_dir = \"/tmp/lockstep-listeners-test\"\n",
        )
        .text();
        let config = Config::parse(&text).expect("test config");
        let app = config.node(me).unwrap().app;
        Settings { config, me, app }
    }

    #[test]
    fn a_listener_is_the_apps_another_nodes_or_some_other() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        let s = settings(1);
        assert_eq!(classify(&s, a("127.0.0.1:7001")), Listener::App);
        assert_eq!(classify(&s, a("0.0.0.0:7001")), Listener::App);
        assert_eq!(classify(&s, a("127.0.0.1:9999")), Listener::Other);
        match classify(&s, a("0.0.0.0:7002")) {
            Listener::OtherNode(why) => {
                assert!(why.contains("node 2's app address"), "{why}");
                assert!(why.contains("LOCKSTEP_NODE=2"), "{why}");
                assert!(!why.contains('\n'));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(classify(&settings(2), a("127.0.0.1:7002")), Listener::App);
    }
}
