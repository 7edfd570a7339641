//! A send that never blocks: what a flush pushes onto the wire from the
//! writer's own thread (often the preloaded server's), so that a turn's
//! frames need no wake-up of the sender thread when the socket has room.

use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;

/// Sends as much of `bytes` as the socket takes now. Returns how many
/// bytes went out (possibly 0 when the socket's buffer is full); an error
/// means the connection is broken.
pub(super) fn send_now(stream: &TcpStream, bytes: &[u8]) -> io::Result<usize> {
    let mut sent = 0;
    while sent < bytes.len() {
        let rest = &bytes[sent..];
        // SAFETY: `rest` is a live slice for the call's duration and the
        // fd belongs to `stream`, borrowed for the call; MSG_DONTWAIT makes
        // this one call non-blocking without touching the fd's flags (the
        // sender thread writes the same socket blocking), MSG_NOSIGNAL
        // turns a closed peer into EPIPE instead of a SIGPIPE.
        let n = unsafe {
            libc::send(
                stream.as_raw_fd(),
                rest.as_ptr().cast(),
                rest.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n >= 0 {
            sent += n as usize;
            continue;
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock => break,
            io::ErrorKind::Interrupted => continue,
            _ => return Err(e),
        }
    }
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::TcpListener;

    #[test]
    fn sends_what_fits_and_stops_without_blocking() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let tx = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut rx, _) = l.accept().unwrap();
        assert_eq!(send_now(&tx, b"hello").unwrap(), 5);
        let mut got = [0u8; 5];
        rx.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello");
        // Nobody reads: the kernel's buffers fill and a send takes less
        // than asked, without blocking.
        let big = vec![7u8; 64 << 20];
        let n = send_now(&tx, &big).unwrap();
        assert!(n < big.len(), "{n}");
        assert_eq!(send_now(&tx, &big).unwrap(), 0);
    }

    #[test]
    fn a_closed_peer_is_an_error_not_a_signal() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let tx = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (rx, _) = l.accept().unwrap();
        drop(rx);
        let mut failed = false;
        for _ in 0..100 {
            if send_now(&tx, &[1u8; 4096]).is_err() {
                failed = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(failed);
    }
}
