//! A minimal RESP (Redis protocol) client for the tests, shared by the
//! cluster harness and the preload tests (each includes this file).
#![allow(dead_code)]

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A reply from Redis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// +simple
    Status(String),
    /// -error
    Error(String),
    /// :integer
    Int(i64),
    /// $bulk (None: nil)
    Bulk(Option<Vec<u8>>),
    /// *array (None: nil)
    Array(Option<Vec<Reply>>),
}

/// Encodes a command as a RESP array of bulk strings.
pub fn resp_encode(args: &[&[u8]]) -> Vec<u8> {
    let mut b = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        b.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        b.extend_from_slice(a);
        b.extend_from_slice(b"\r\n");
    }
    b
}

/// A RESP connection that remembers every byte it sent (the preload tests
/// compare it with what the server consumed).
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

    /// Connects with a bound on the connect itself (an address behind a
    /// downed link never answers a SYN) and the given read/write timeout:
    /// a reply that does not come in time fails with `WouldBlock`/`TimedOut`.
    pub fn connect_with(addr: SocketAddr, connect: Duration, read: Duration) -> io::Result<Resp> {
        let s = TcpStream::connect_timeout(&addr, connect)?;
        s.set_read_timeout(Some(read))?;
        s.set_write_timeout(Some(read))?;
        s.set_nodelay(true)?;
        Ok(Resp::on(s))
    }

    /// Wraps a connected stream.
    pub fn on(s: TcpStream) -> Resp {
        Resp {
            r: BufReader::new(s),
            sent: Vec::new(),
        }
    }

    /// Sends a command and reads its reply.
    pub fn cmd(&mut self, args: &[&[u8]]) -> io::Result<Reply> {
        self.send(args)?;
        self.read()
    }

    /// Sends one command without reading.
    pub fn send(&mut self, args: &[&[u8]]) -> io::Result<()> {
        let b = resp_encode(args);
        self.r.get_mut().write_all(&b)?;
        self.sent.extend_from_slice(&b);
        Ok(())
    }

    /// Reads one reply.
    pub fn read(&mut self) -> io::Result<Reply> {
        let mut line = String::new();
        if self.r.read_line(&mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        let line = line.trim_end_matches("\r\n");
        let bad = || {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad reply line {line:?}"),
            )
        };
        let (t, rest) = line.split_at(1.min(line.len()));
        Ok(match t {
            "+" => Reply::Status(rest.into()),
            "-" => Reply::Error(rest.into()),
            ":" => Reply::Int(rest.parse().map_err(|_| bad())?),
            "$" => {
                let n: i64 = rest.parse().map_err(|_| bad())?;
                if n < 0 {
                    Reply::Bulk(None)
                } else {
                    let mut b = vec![0u8; n as usize + 2];
                    self.r.read_exact(&mut b)?;
                    b.truncate(n as usize);
                    Reply::Bulk(Some(b))
                }
            }
            // A RESP3 map (HELLO 3): its keys and values, in order.
            "%" => {
                let n: i64 = rest.parse().map_err(|_| bad())?;
                let mut v = Vec::new();
                for _ in 0..2 * n.max(0) {
                    v.push(self.read()?);
                }
                Reply::Array(Some(v))
            }
            "*" => {
                let n: i64 = rest.parse().map_err(|_| bad())?;
                if n < 0 {
                    Reply::Array(None)
                } else {
                    let mut v = Vec::new();
                    for _ in 0..n {
                        v.push(self.read()?);
                    }
                    Reply::Array(Some(v))
                }
            }
            _ => return Err(bad()),
        })
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
