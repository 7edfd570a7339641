//! Hosts in network namespaces, and partitions between them: real
//! namespaces, a real bridge, real TCP. Needs the `ip` tool and
//! CAP_NET_ADMIN (root); without them the tests fail, naming what is
//! missing (they never pass by skipping).
//!
//! No assertion depends on wall-clock time: durations only bound how long
//! a test waits before it reports a hang, and how long a connect may take
//! before it counts as failed.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use lockstep_launcher::netns::{in_netns, Net, CLIENT};

/// Prefix of every namespace this file creates (`<prefix><pid>-…`).
const PREFIX: &str = "lockstep-lnt-";
/// The port every test server listens on, in its host's namespace.
const PORT: u16 = 7000;
/// Bound on every wait: reaching it means a hang, not slowness.
const HANG: Duration = Duration::from_secs(60);
/// How long a connect may take before it counts as failed.
const CONNECT: Duration = Duration::from_secs(2);

/// A server inside a host's namespace that answers every connection with
/// the host's name; stopped on drop.
struct Server {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    fn start(net: &Net, host: &str) -> Server {
        let addr = SocketAddr::from((net.host_ip(host).expect("a host"), PORT));
        let path = net.host_path(host).expect("a host");
        // The socket belongs to the namespace it was made in, wherever it
        // is used afterwards.
        let listener = in_netns(path, move || TcpListener::bind(addr))
            .expect("enter the host's namespace")
            .join()
            .expect("bind thread")
            .unwrap_or_else(|e| panic!("bind {addr}: {e}"));
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let name = host.to_string();
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((mut conn, _)) => {
                            conn.set_nonblocking(false).unwrap();
                            let _ = conn.write_all(name.as_bytes());
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        Err(e) => panic!("accept on {addr}: {e}"),
                    }
                }
            })
        };
        Server {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Connects from host `from`'s namespace to host `to`'s server: Ok with
/// what it answered (its name), or Err with why not.
fn reach(net: &Net, from: &str, to: &str) -> Result<String, String> {
    let addr = SocketAddr::from((net.host_ip(to).expect("a host"), PORT));
    in_netns(net.host_path(from).expect("a host"), move || {
        let mut conn = TcpStream::connect_timeout(&addr, CONNECT).map_err(|e| e.to_string())?;
        conn.set_read_timeout(Some(HANG)).unwrap();
        let mut answer = String::new();
        conn.read_to_string(&mut answer)
            .map_err(|e| e.to_string())?;
        Ok(answer)
    })
    .expect("enter the host's namespace")
    .join()
    .expect("connect thread")
}

fn assert_reaches(net: &Net, from: &str, to: &str, when: &str) {
    assert_eq!(
        reach(net, from, to).as_deref(),
        Ok(to),
        "{when}: {from} must reach {to}"
    );
}

/// [`assert_reaches`], allowing the time a link that just came up takes
/// to carry traffic (its neighbours resolved again), up to [`HANG`].
fn eventually_reaches(net: &Net, from: &str, to: &str, when: &str) {
    let start = std::time::Instant::now();
    loop {
        match reach(net, from, to) {
            Ok(got) if got == to => return,
            got if start.elapsed() > HANG => {
                panic!("{when}: {from} must reach {to}, still {got:?} after {HANG:?}")
            }
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

fn assert_cut(net: &Net, from: &str, to: &str, when: &str) {
    let got = reach(net, from, to);
    assert!(got.is_err(), "{when}: {from} reached {to}: {got:?}");
}

/// The blackhole routes of the namespace this process runs in.
fn own_blackholes() -> String {
    let out = std::process::Command::new("ip")
        .args(["-4", "route", "show", "type", "blackhole"])
        .output()
        .expect("run ip");
    assert!(out.status.success(), "ip route show: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn partition_cuts_the_groups_apart_and_heal_joins_them() {
    let ours = own_blackholes();
    let net = Net::required(PREFIX, 81, 2, &[("zk", 200)]);
    let hosts: Vec<String> = net.host_names().map(str::to_string).collect();
    assert_eq!(hosts, ["1", "2", "zk", CLIENT]);
    assert_eq!(net.host_ip("1"), Some([10, 213, 81, 1].into()));
    assert_eq!(net.host_ip("zk"), Some([10, 213, 81, 200].into()));
    assert_eq!(net.host_ip(CLIENT), Some([10, 213, 81, 100].into()));
    assert_eq!(net.host_ns("2"), Some(net.node_ns[1].as_str()));
    assert_eq!(net.host_ns(CLIENT), Some(net.client_ns.as_str()));
    assert_eq!(net.host_ip("3"), None);
    assert_eq!(net.host_ns("nope"), None);

    let _servers: Vec<Server> = hosts.iter().map(|h| Server::start(&net, h)).collect();
    for from in &hosts {
        for to in &hosts {
            assert_reaches(&net, from, to, "before the partition");
        }
    }

    // A connection made before the partition: it must see loss, not an
    // error, and carry on after the heal, as on a real network.
    let zk_addr = SocketAddr::from((net.host_ip("zk").unwrap(), PORT + 1));
    let zk_listener = in_netns(net.host_path("zk").unwrap(), move || {
        TcpListener::bind(zk_addr)
    })
    .unwrap()
    .join()
    .unwrap()
    .expect("bind the second zk port");
    let mut from_1 = in_netns(net.host_path("1").unwrap(), move || {
        TcpStream::connect_timeout(&zk_addr, CONNECT)
    })
    .unwrap()
    .join()
    .unwrap()
    .expect("node 1 connects to zk");
    let (mut at_zk, _) = zk_listener.accept().unwrap();

    // Bad groupings change nothing.
    let err = net.partition(&[&["1"], &["nope"]]).unwrap_err();
    assert!(err.to_string().contains("nope"), "{err:#}");
    let err = net.partition(&[&["1"], &["zk", "1"]]).unwrap_err();
    assert!(err.to_string().contains("twice"), "{err:#}");
    assert_reaches(&net, "1", "zk", "after refused partitions");

    // Node 1 loses ZooKeeper, and only ZooKeeper.
    net.partition(&[&["1"], &["zk"]]).expect("partition");
    net.partition(&[&["1"], &["zk"]])
        .expect("the same partition again");
    assert_cut(&net, "1", "zk", "1 | zk");
    assert_cut(&net, "zk", "1", "1 | zk");
    for third in ["2", CLIENT] {
        for cut in ["1", "zk"] {
            assert_reaches(&net, third, cut, "1 | zk");
            assert_reaches(&net, cut, third, "1 | zk");
        }
    }
    assert_reaches(&net, "1", "1", "1 | zk");

    from_1.write_all(b"during").expect("a write is only queued");
    at_zk.set_read_timeout(Some(CONNECT)).unwrap();
    let mut buf = [0u8; 6];
    let lost = at_zk.read(&mut buf);
    assert!(
        matches!(&lost, Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)),
        "zk received across the partition: {lost:?}"
    );

    net.heal().expect("heal");
    for from in &hosts {
        for to in &hosts {
            assert_reaches(&net, from, to, "after the heal");
        }
    }
    // The write queued during the partition arrives (retransmitted).
    at_zk.set_read_timeout(Some(HANG)).unwrap();
    at_zk
        .read_exact(&mut buf)
        .expect("the queued write arrives after the heal");
    assert_eq!(&buf, b"during");

    // Three groups: every pair cut, the client outside them all.
    net.partition(&[&["1"], &["2"], &["zk"]])
        .expect("partition");
    for a in ["1", "2", "zk"] {
        for b in ["1", "2", "zk"] {
            if a != b {
                assert_cut(&net, a, b, "1 | 2 | zk");
            }
        }
        assert_reaches(&net, CLIENT, a, "1 | 2 | zk");
        assert_reaches(&net, a, CLIENT, "1 | 2 | zk");
    }
    // A group of two stays joined.
    net.heal().expect("heal");
    net.partition(&[&["1", "2"], &["zk", CLIENT]])
        .expect("partition");
    assert_reaches(&net, "1", "2", "1 2 | zk client");
    assert_reaches(&net, "zk", CLIENT, "1 2 | zk client");
    assert_cut(&net, "2", CLIENT, "1 2 | zk client");
    assert_cut(&net, CLIENT, "1", "1 2 | zk client");
    net.heal().expect("heal");
    net.heal().expect("heal with nothing to heal");
    assert_reaches(&net, CLIENT, "1", "after the last heal");

    assert_eq!(
        own_blackholes(),
        ours,
        "the namespace this test runs in must not change"
    );
}

#[test]
fn link_takes_a_node_off_the_bridge() {
    let net = Net::required(PREFIX, 82, 2, &[]);
    let _servers: Vec<Server> = ["1", "2", CLIENT]
        .iter()
        .map(|h| Server::start(&net, h))
        .collect();
    assert!(net.link(0, false).is_err());
    assert!(net.link(3, false).is_err());
    net.link(1, false).expect("link down");
    assert_cut(&net, CLIENT, "1", "node 1's link down");
    assert_cut(&net, "1", "2", "node 1's link down");
    assert_reaches(&net, CLIENT, "2", "node 1's link down");
    net.link(1, true).expect("link up");
    eventually_reaches(&net, CLIENT, "1", "node 1's link up");
    eventually_reaches(&net, "1", "2", "node 1's link up");
}

#[test]
fn create_refuses_clashing_hosts() {
    for (extra, why) in [
        (&[("zk", 1)][..], "a node's address"),
        (&[("zk", 100)][..], "the client's address"),
        (&[("zk", 200), ("zk2", 200)][..], "a shared address"),
        (&[("client", 200)][..], "the client's name"),
        (&[("7", 200)][..], "a node's name"),
        (&[("../x", 200)][..], "a path"),
    ] {
        // Refused before any namespace exists: no root needed.
        assert!(
            Net::create(PREFIX, 83, 2, extra).is_err(),
            "{why}: {extra:?}"
        );
    }
    assert!(Net::create("", 83, 2, &[]).is_err(), "an empty prefix");
    assert!(Net::create(PREFIX, 83, 100, &[]).is_err(), "100 nodes");
}
