//! Ordered replay of committed entries into the local server.
//!
//! Each logged connection becomes a `ReplayConn`: a TCP connection from the
//! node's replay address to the server's app address. Before connecting,
//! the replayer claims a replay slot in the region with its source port, so
//! the passive preload recognises the connection and counts the bytes the
//! server reads from it. Cross-connection order is kept by waiting, before
//! an entry of another connection is applied, until the server consumed
//! everything written to the previous one.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;
use lockstep_common::entry::{EntryHeader, Kind};
use lockstep_common::region::{Region, REPLAY_SLOTS};
use socket2::{Domain, Socket, Type};

use crate::divergence::{Checked, OutputChecker};

/// How long to wait for the server to consume bytes before declaring the
/// connection dead (the server closed it, or it hung).
const CONSUME_TIMEOUT: Duration = Duration::from_secs(30);

/// One replayed client connection.
struct ReplayConn {
    stream: TcpStream,
    slot: usize,
    written: u64,
    checker: OutputChecker,
    closed_by_server: bool,
}

/// Applies entries to the local server, in log order.
pub struct Replayer {
    app: SocketAddr,
    region: Arc<Region>,
    conns: HashMap<u64, ReplayConn>,
    last_conn: Option<u64>,
    buf: Vec<u8>,
    stop: Arc<AtomicBool>,
    /// Output checks that matched / diverged so far.
    pub checked: Checked,
}

impl Replayer {
    /// A replayer into the server at `app`.
    pub fn new(app: SocketAddr, region: Arc<Region>, stop: Arc<AtomicBool>) -> Self {
        Replayer {
            app,
            region,
            conns: HashMap::new(),
            last_conn: None,
            buf: vec![0u8; 64 * 1024],
            stop,
            checked: Checked::default(),
        }
    }

    /// Applies one entry.
    pub fn apply(&mut self, hdr: &EntryHeader, payload: &[u8]) -> io::Result<()> {
        if matches!(hdr.kind, Kind::Data | Kind::Close) && self.last_conn != Some(hdr.conn) {
            self.wait_consumed_last()?;
        }
        match hdr.kind {
            Kind::Accept => {
                self.wait_consumed_last()?;
                let conn = self.connect()?;
                self.conns.insert(hdr.seq, conn);
                self.last_conn = Some(hdr.seq);
            }
            Kind::Data => {
                let Some(c) = self.conns.get_mut(&hdr.conn) else {
                    log::warn!("DATA for unknown connection {} (seq {})", hdr.conn, hdr.seq);
                    return Ok(());
                };
                let v = c.checker.expect(hdr.out_hash);
                self.checked.matched += v.matched;
                self.checked.diverged += v.diverged;
                if !c.closed_by_server {
                    write_all_draining(c, payload, &mut self.buf, &mut self.checked, &self.stop)?;
                }
                self.last_conn = Some(hdr.conn);
            }
            Kind::Close => {
                self.wait_consumed(hdr.conn)?;
                if let Some(mut c) = self.conns.remove(&hdr.conn) {
                    let _ = c.stream.shutdown(std::net::Shutdown::Write);
                    drain(&mut c, &mut self.buf, &mut self.checked);
                    self.region.replay_slot(c.slot).release();
                }
                self.last_conn = None;
            }
            Kind::View => {
                // The last connection's bytes must be read before the view
                // starts (the new leader serves right after this entry).
                self.wait_consumed_last()?;
                self.close_all()
            }
            Kind::Noop | Kind::Wrap => {}
        }
        Ok(())
    }

    /// Closes every replay connection (view change, shutdown).
    pub fn close_all(&mut self) {
        for (_, c) in self.conns.drain() {
            let _ = c.stream.shutdown(std::net::Shutdown::Both);
            self.region.replay_slot(c.slot).release();
        }
        self.last_conn = None;
    }

    /// Reads whatever output the server produced on every connection.
    pub fn drain_all(&mut self) {
        for c in self.conns.values_mut() {
            drain(c, &mut self.buf, &mut self.checked);
        }
    }

    fn wait_consumed_last(&mut self) -> io::Result<()> {
        match self.last_conn {
            Some(conn) => self.wait_consumed(conn),
            None => Ok(()),
        }
    }

    /// Waits until the server read everything written on `conn`.
    fn wait_consumed(&mut self, conn: u64) -> io::Result<()> {
        let Some(c) = self.conns.get_mut(&conn) else {
            return Ok(());
        };
        let slot = self.region.replay_slot(c.slot);
        let start = Instant::now();
        let backoff = Backoff::new();
        while slot.consumed() < c.written && !c.closed_by_server {
            drain(c, &mut self.buf, &mut self.checked);
            if self.stop.load(Ordering::Relaxed) {
                return Err(io::Error::new(io::ErrorKind::Interrupted, "stopping"));
            }
            if start.elapsed() > CONSUME_TIMEOUT {
                log::error!(
                    "server consumed {} of {} bytes on replay connection {conn} within {:?}; giving up on it",
                    slot.consumed(),
                    c.written,
                    CONSUME_TIMEOUT
                );
                c.closed_by_server = true;
                break;
            }
            if backoff.is_completed() {
                std::thread::sleep(Duration::from_micros(20));
            } else {
                backoff.snooze();
            }
        }
        Ok(())
    }

    fn connect(&mut self) -> io::Result<ReplayConn> {
        let start = Instant::now();
        loop {
            let bind: SocketAddr = SocketAddr::new(self.app.ip(), 0);
            let sock = Socket::new(Domain::for_address(self.app), Type::STREAM, None)?;
            sock.bind(&bind.into())?;
            let port = sock
                .local_addr()?
                .as_socket()
                .map(|a| a.port())
                .unwrap_or(0);
            let slot = (0..REPLAY_SLOTS)
                .find(|&i| self.region.replay_slot(i).claim(port))
                .ok_or_else(|| io::Error::other("all replay slots are in use"))?;
            match sock.connect(&self.app.into()) {
                Ok(()) => {
                    sock.set_nodelay(true)?;
                    sock.set_nonblocking(true)?;
                    return Ok(ReplayConn {
                        stream: sock.into(),
                        slot,
                        written: 0,
                        checker: OutputChecker::default(),
                        closed_by_server: false,
                    });
                }
                Err(e) => {
                    self.region.replay_slot(slot).release();
                    if self.stop.load(Ordering::Relaxed) {
                        return Err(e);
                    }
                    if start.elapsed().as_secs().is_multiple_of(10)
                        && start.elapsed().subsec_millis() < 60
                    {
                        log::info!("waiting for the server at {}: {e}", self.app);
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }
}

/// Reads available output without blocking and feeds the checker.
fn drain(c: &mut ReplayConn, buf: &mut [u8], checked: &mut Checked) {
    loop {
        match c.stream.read(buf) {
            Ok(0) => {
                c.closed_by_server = true;
                return;
            }
            Ok(n) => {
                let v = c.checker.feed(&buf[..n]);
                checked.matched += v.matched;
                checked.diverged += v.diverged;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => {
                c.closed_by_server = true;
                return;
            }
        }
    }
}

fn write_all_draining(
    c: &mut ReplayConn,
    mut bytes: &[u8],
    buf: &mut [u8],
    checked: &mut Checked,
    stop: &AtomicBool,
) -> io::Result<()> {
    while !bytes.is_empty() {
        match c.stream.write(bytes) {
            Ok(n) => {
                c.written += n as u64;
                bytes = &bytes[n..];
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // The server is not reading; take its output so it can.
                drain(c, buf, checked);
                if c.closed_by_server || stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
                std::thread::sleep(Duration::from_micros(50));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                log::warn!("replay write failed: {e}");
                c.closed_by_server = true;
                return Ok(());
            }
        }
    }
    drain(c, buf, checked);
    Ok(())
}
