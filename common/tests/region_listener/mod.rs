//! A region listener for the tcp transport's tests: listens, runs the
//! handshake for every connection in a thread of its own, serves region
//! channels into a region with [`RegionServer`] and refuses control
//! channels. (The follower serves region channels from its own control
//! dispatcher.)

use std::collections::HashMap;
use std::io;
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use lockstep_common::handshake::{self, Channel};
use lockstep_common::region::Region;
use lockstep_common::transport::tcp::RegionServer;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct ListenerShared {
    stop: AtomicBool,
    conns: Mutex<HashMap<u64, TcpStream>>,
}

/// A running region listener (see [`spawn_listener`]). Stops on drop.
pub struct ListenerHandle {
    addr: SocketAddr,
    shared: Arc<ListenerShared>,
    thread: Option<JoinHandle<()>>,
}

impl ListenerHandle {
    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, closes every connection and waits for their
    /// threads. Idempotent.
    pub fn shutdown(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        {
            let conns = lock(&self.shared.conns);
            self.shared.stop.store(true, Ordering::SeqCst);
            for s in conns.values() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        // Wake the blocking accept with a connection of our own.
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
            });
        }
        match TcpStream::connect_timeout(&wake, Duration::from_secs(2)) {
            Ok(_) => {
                let _ = thread.join();
            }
            Err(e) => log::warn!("region listener {}: cannot wake it to stop: {e}", self.addr),
        }
    }
}

impl Drop for ListenerHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Listens on `addr` (port 0 picks one; see [`ListenerHandle::local_addr`]),
/// runs the handshake for every connection in a thread of its own, serves
/// region channels into `region` and refuses control channels.
pub fn spawn_listener<A: ToSocketAddrs>(
    addr: A,
    region: Arc<Region>,
    cluster: &str,
    key: &str,
) -> io::Result<ListenerHandle> {
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    let shared = Arc::new(ListenerShared {
        stop: AtomicBool::new(false),
        conns: Mutex::new(HashMap::new()),
    });
    let server = RegionServer::new(region);
    let cluster = cluster.to_string();
    let key = key.to_string();
    let sh = shared.clone();
    let thread = std::thread::Builder::new()
        .name("lockstep-region-listen".into())
        .spawn(move || accept_loop(listener, sh, server, cluster, key))?;
    Ok(ListenerHandle {
        addr: local,
        shared,
        thread: Some(thread),
    })
}

fn accept_loop(
    listener: TcpListener,
    shared: Arc<ListenerShared>,
    server: RegionServer,
    cluster: String,
    key: String,
) {
    let mut workers: Vec<JoinHandle<()>> = Vec::new();
    let mut next_id = 0u64;
    let cluster = Arc::new(cluster);
    let key = Arc::new(key);
    loop {
        let accepted = listener.accept();
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                log::warn!("region listener: accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        workers.retain(|h| !h.is_finished());
        let id = next_id;
        next_id += 1;
        let Ok(clone) = stream.try_clone() else {
            continue;
        };
        {
            let mut conns = lock(&shared.conns);
            if shared.stop.load(Ordering::SeqCst) {
                break;
            }
            conns.insert(id, clone);
        }
        let (sh, server, cluster, key) =
            (shared.clone(), server.clone(), cluster.clone(), key.clone());
        let spawned = std::thread::Builder::new()
            .name("lockstep-region-serve".into())
            .spawn(move || {
                let mut stream = stream;
                if let Ok(hello) =
                    handshake::accept_channels(&mut stream, &cluster, &key, &[Channel::Region])
                {
                    server.serve(stream, hello.node);
                }
                lock(&sh.conns).remove(&id);
            });
        match spawned {
            Ok(h) => workers.push(h),
            Err(e) => {
                log::warn!("region listener: cannot start a connection thread: {e}");
                lock(&shared.conns).remove(&id);
            }
        }
    }
    for h in workers {
        let _ = h.join();
    }
}
