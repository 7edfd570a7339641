//! The Redis client's connections, over the common RESP codec
//! ([`lockstep_common::resp`]): for the load of `lockstep bench redis` and
//! for the tests, a connection that remembers what it sent (the preload
//! tests compare it with what the server consumed), and a one-shot command
//! for readiness checks.

use std::io::{self, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::Context;
use lockstep_common::resp::{command_bytes, read_value, Value};

/// Opens a TCP connection with a bound on the connect itself (an address
/// behind a downed link never answers a SYN), the given read and write
/// timeout, and no Nagle delay.
pub fn connect_stream(addr: SocketAddr, connect: Duration, io: Duration) -> io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, connect)?;
    s.set_read_timeout(Some(io))?;
    s.set_write_timeout(Some(io))?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// Sends one command on a fresh connection and returns its reply (setup
/// and readiness checks, not load). Connecting may take `timeout` but at
/// most 5 s.
pub fn command(addr: SocketAddr, args: &[&str], timeout: Duration) -> anyhow::Result<Value> {
    let mut s = connect_stream(addr, timeout.min(Duration::from_secs(5)), timeout)
        .with_context(|| format!("cannot connect to {addr}"))?;
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    s.write_all(&command_bytes(&args))?;
    Ok(read_value(&mut BufReader::new(s))?)
}

/// A RESP connection that remembers every byte it sent.
pub struct Resp {
    r: BufReader<TcpStream>,
    /// Everything sent on this connection.
    pub sent: Vec<u8>,
}

impl Resp {
    /// Connects with generous timeouts (5 s to connect, 60 s per reply).
    pub fn connect(addr: SocketAddr) -> io::Result<Resp> {
        Self::connect_with(addr, Duration::from_secs(5), Duration::from_secs(60))
    }

    /// Connects with a bound on the connect itself and the given
    /// read/write timeout: a reply that does not come in time fails with
    /// `WouldBlock`/`TimedOut`.
    pub fn connect_with(addr: SocketAddr, connect: Duration, read: Duration) -> io::Result<Resp> {
        Ok(Resp::on(connect_stream(addr, connect, read)?))
    }

    /// Wraps a connected stream.
    pub fn on(s: TcpStream) -> Resp {
        Resp {
            r: BufReader::new(s),
            sent: Vec::new(),
        }
    }

    /// Sends a command and reads its reply.
    pub fn cmd(&mut self, args: &[&[u8]]) -> io::Result<Value> {
        self.send(args)?;
        self.read()
    }

    /// Sends one command without reading.
    pub fn send(&mut self, args: &[&[u8]]) -> io::Result<()> {
        let b = command_bytes(args);
        self.r.get_mut().write_all(&b)?;
        self.sent.extend_from_slice(&b);
        Ok(())
    }

    /// Reads one reply.
    pub fn read(&mut self) -> io::Result<Value> {
        read_value(&mut self.r)
    }

    /// Changes the read timeout of an open connection.
    pub fn set_read_timeout(&self, t: Duration) -> io::Result<()> {
        self.r.get_ref().set_read_timeout(Some(t))
    }

    /// The underlying stream.
    pub fn stream(&mut self) -> &mut TcpStream {
        self.r.get_mut()
    }
}
