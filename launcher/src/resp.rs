//! The RESP (Redis protocol) client: one encoder and one reply reader for
//! the load of `lockstep bench redis` and for the tests, a connection that
//! remembers what it sent (the preload tests compare it with what the
//! server consumed), and a one-shot command for readiness checks.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::Context;

/// A reply from Redis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// `+simple string`
    Status(String),
    /// `-error`
    Error(String),
    /// `:integer`
    Int(i64),
    /// `$bulk` (None: nil)
    Bulk(Option<Vec<u8>>),
    /// `*array` (None: nil); also a RESP3 `%map` as its keys and values in
    /// order.
    Array(Option<Vec<Reply>>),
}

/// Appends a command, as a RESP array of bulk strings, to `out`.
pub fn encode(args: &[&[u8]], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// A command as a RESP array of bulk strings.
pub fn resp_encode(args: &[&[u8]]) -> Vec<u8> {
    let mut b = Vec::new();
    encode(args, &mut b);
    b
}

/// Reads one reply (nested arrays and RESP3 maps included).
pub fn read_reply(r: &mut impl BufRead) -> io::Result<Reply> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the server closed the connection",
        ));
    }
    let line = line.trim_end_matches("\r\n");
    let bad = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad reply line {line:?}"),
        )
    };
    let (kind, rest) = line.split_at(1.min(line.len()));
    Ok(match kind {
        "+" => Reply::Status(rest.into()),
        "-" => Reply::Error(rest.into()),
        ":" => Reply::Int(rest.parse().map_err(|_| bad())?),
        "$" => {
            let n: i64 = rest.parse().map_err(|_| bad())?;
            if n < 0 {
                Reply::Bulk(None)
            } else {
                let mut b = vec![0u8; n as usize + 2];
                r.read_exact(&mut b)?;
                b.truncate(n as usize);
                Reply::Bulk(Some(b))
            }
        }
        // A RESP3 map (HELLO 3): its keys and values, in order.
        "%" => {
            let n: i64 = rest.parse().map_err(|_| bad())?;
            let mut v = Vec::new();
            for _ in 0..2 * n.max(0) {
                v.push(read_reply(r)?);
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
                    v.push(read_reply(r)?);
                }
                Reply::Array(Some(v))
            }
        }
        _ => return Err(bad()),
    })
}

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
pub fn command(addr: SocketAddr, args: &[&str], timeout: Duration) -> anyhow::Result<Reply> {
    let mut s = connect_stream(addr, timeout.min(Duration::from_secs(5)), timeout)
        .with_context(|| format!("cannot connect to {addr}"))?;
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    s.write_all(&resp_encode(&args))?;
    Ok(read_reply(&mut BufReader::new(s))?)
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
        read_reply(&mut self.r)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_bulk_strings() {
        assert_eq!(
            resp_encode(&[b"SET", b"k", b"xyz"]),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nxyz\r\n"
        );
    }

    #[test]
    fn reads_every_reply_kind() {
        let mut r: &[u8] =
            b"+OK\r\n-ERR no\r\n:7\r\n$3\r\nabc\r\n$-1\r\n*2\r\n:1\r\n$0\r\n\r\n%1\r\n+a\r\n:2\r\n";
        assert_eq!(read_reply(&mut r).unwrap(), Reply::Status("OK".into()));
        assert_eq!(read_reply(&mut r).unwrap(), Reply::Error("ERR no".into()));
        assert_eq!(read_reply(&mut r).unwrap(), Reply::Int(7));
        assert_eq!(
            read_reply(&mut r).unwrap(),
            Reply::Bulk(Some(b"abc".to_vec()))
        );
        assert_eq!(read_reply(&mut r).unwrap(), Reply::Bulk(None));
        assert_eq!(
            read_reply(&mut r).unwrap(),
            Reply::Array(Some(vec![Reply::Int(1), Reply::Bulk(Some(Vec::new()))]))
        );
        assert_eq!(
            read_reply(&mut r).unwrap(),
            Reply::Array(Some(vec![Reply::Status("a".into()), Reply::Int(2)]))
        );
        assert!(read_reply(&mut r).is_err());
    }
}
