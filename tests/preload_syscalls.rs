//! The less common input and output calls, driven directly: this test
//! binary re-runs itself under the preload as a tiny server that reads
//! with `readv`, `recv` (with and without MSG_PEEK), `recvmsg`, `recvfrom`
//! and `read`, and answers with `writev`, `send`, `sendmsg` and `write`.
//! The log must hold exactly the bytes the client sent (peeks not twice),
//! split at `max_entry`, with output digests of what was written so far.

use lockstep_testkit::preload_fixture as preload_support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::io::AsRawFd;
use std::process::Command;

use lockstep_common::entry::{Kind, OutputDigest};
use preload_support::*;

const CHILD_ENV: &str = "LOCKSTEP_TEST_SYSCALL_SERVER_PORT";

const MSG_A: &[u8] = b"readv-into-three-iovecs!";
const MSG_B: &[u8] = b"peeked-then-recvmsg-two-iovecs";
const MSG_C: &[u8] = b"recvfrom!!";

fn msg_d() -> Vec<u8> {
    (0..10_000u32).map(|i| b'0' + (i % 10) as u8).collect()
}

/// Reads exactly `n` bytes with `f` (which returns what one call read).
fn read_exact_with(n: usize, mut f: impl FnMut(usize) -> isize) -> usize {
    let mut got = 0;
    while got < n {
        let r = f(got);
        assert!(
            r > 0,
            "read returned {r}: {}",
            std::io::Error::last_os_error()
        );
        got += r as usize;
    }
    got
}

/// The server side; runs only in the child process (under the preload).
#[test]
fn syscall_server_child() {
    let Ok(port) = std::env::var(CHILD_ENV) else {
        return;
    };
    let listener = TcpListener::bind(("127.0.0.1", port.parse::<u16>().unwrap())).unwrap();
    println!("listening");
    let (stream, _) = listener.accept().unwrap();
    let fd = stream.as_raw_fd();

    // A: readv into three buffers of odd sizes.
    let mut a = vec![0u8; MSG_A.len()];
    read_exact_with(a.len(), |off| {
        let rest = &mut a[off..];
        let (x, y) = rest.split_at_mut(rest.len().min(3));
        let split = y.len().min(5);
        let (y, z) = y.split_at_mut(split);
        let iov = [
            libc::iovec {
                iov_base: x.as_mut_ptr().cast(),
                iov_len: x.len(),
            },
            libc::iovec {
                iov_base: y.as_mut_ptr().cast(),
                iov_len: y.len(),
            },
            libc::iovec {
                iov_base: z.as_mut_ptr().cast(),
                iov_len: z.len(),
            },
        ];
        // SAFETY: three valid iovecs over live, disjoint buffers.
        unsafe { libc::readv(fd, iov.as_ptr(), 3) as isize }
    });
    assert_eq!(a, MSG_A);
    let reply = [libc::iovec {
        iov_base: b"1".as_ptr() as *mut _,
        iov_len: 1,
    }];
    // SAFETY: one valid iovec over a static byte.
    assert_eq!(unsafe { libc::writev(fd, reply.as_ptr(), 1) }, 1);

    // B: wait until all of it is there with MSG_PEEK, then recvmsg.
    let mut b = vec![0u8; MSG_B.len()];
    loop {
        // SAFETY: `b` is a live buffer of its length.
        let n = unsafe { libc::recv(fd, b.as_mut_ptr().cast(), b.len(), libc::MSG_PEEK) };
        assert!(n > 0);
        if n as usize == b.len() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    read_exact_with(b.len(), |off| {
        let rest = &mut b[off..];
        let half = rest.len() / 2;
        let (x, y) = rest.split_at_mut(half);
        let mut iov = [
            libc::iovec {
                iov_base: x.as_mut_ptr().cast(),
                iov_len: x.len(),
            },
            libc::iovec {
                iov_base: y.as_mut_ptr().cast(),
                iov_len: y.len(),
            },
        ];
        // SAFETY: msghdr is plain data; all-zero is valid.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = 2;
        // SAFETY: `msg` points at two valid iovecs over live buffers.
        unsafe { libc::recvmsg(fd, &mut msg, 0) as isize }
    });
    assert_eq!(b, MSG_B);
    // SAFETY: a static byte.
    assert_eq!(unsafe { libc::send(fd, b"2".as_ptr().cast(), 1, 0) }, 1);

    // C: recvfrom.
    let mut c = vec![0u8; MSG_C.len()];
    read_exact_with(c.len(), |off| {
        // SAFETY: a live buffer; null address arguments are allowed.
        unsafe {
            libc::recvfrom(
                fd,
                c[off..].as_mut_ptr().cast(),
                c.len() - off,
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            ) as isize
        }
    });
    assert_eq!(c, MSG_C);
    let mut out = [libc::iovec {
        iov_base: b"3".as_ptr() as *mut _,
        iov_len: 1,
    }];
    // SAFETY: as above.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = out.as_mut_ptr();
    msg.msg_iovlen = 1;
    // SAFETY: `msg` points at one valid iovec.
    assert_eq!(unsafe { libc::sendmsg(fd, &msg, 0) }, 1);

    // D: plain reads of a large message.
    let mut d = vec![0u8; msg_d().len()];
    let mut s = &stream;
    read_exact_with(d.len(), |off| s.read(&mut d[off..]).unwrap() as isize);
    assert_eq!(d, msg_d());
    s.write_all(b"4").unwrap();

    // EOF, then close.
    assert_eq!(s.read(&mut [0u8; 8]).unwrap(), 0);
    drop(stream);
    println!("server done");
}

#[test]
fn every_input_call_is_logged_once_with_the_output_since_the_previous_read() {
    let f = Fixture::new("syscalls", Options::default());
    let acker = Acker::start(&f);
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "syscall_server_child",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, f.port().to_string());
    f.preload_env(&mut cmd);
    let mut server = Server::spawn(cmd, f.port(), &f.dir, "child");
    wait_for("the child to listen", LIMIT, || {
        server.assert_running();
        server.output().contains("listening")
    });
    let mut c = connect(f.app()).unwrap();
    let mut ack = [0u8; 1];
    for (msg, expect) in [
        (MSG_A.to_vec(), b'1'),
        (MSG_B.to_vec(), b'2'),
        (MSG_C.to_vec(), b'3'),
        (msg_d(), b'4'),
    ] {
        // Byte by byte for the first message: many small reads.
        if expect == b'1' {
            for b in &msg {
                c.write_all(&[*b]).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        } else {
            c.write_all(&msg).unwrap();
        }
        c.read_exact(&mut ack).unwrap();
        assert_eq!(ack[0], expect, "{}", server.output());
    }
    drop(c);
    let st = server
        .wait_exit(LIMIT)
        .expect("child server did not finish");
    assert!(st.success(), "{}\n{}", server.output(), f.preload_log());
    assert!(server.output().contains("server done"));

    acker.wait_all_closed(&f);
    assert!(acker.errors().is_empty(), "{:?}", acker.errors());
    let entries = acker.entries();
    let s = check_log(&entries, true);
    assert_eq!(s.accepted, vec![1]);
    let all: Vec<u8> = [MSG_A, MSG_B, MSG_C, &msg_d()].concat();
    assert_eq!(s.data[&1], all, "the log holds each byte once, in order");
    assert_eq!(s.longest, f.config.max_entry as usize);

    // The first entry of each read carries the digest of the output since
    // the connection's previous read: the child acks each message once it
    // has read all of it, so that is the ack of the message that ended
    // where this read starts, or nothing. A read longer than max_entry
    // goes into several entries; the later ones carry no digest (0).
    let digest = |out: &[u8]| {
        let mut d = OutputDigest::default();
        d.update(out);
        d.pack()
    };
    let mut ends = Vec::new();
    let mut end = 0;
    for len in [MSG_A.len(), MSG_B.len(), MSG_C.len(), msg_d().len()] {
        end += len;
        ends.push(end);
    }
    let mut offset = 0;
    let mut prev_len = 0;
    for r in entries.iter().filter(|r| r.header.kind == Kind::Data) {
        if r.header.out_hash == 0 {
            assert_eq!(
                prev_len, f.config.max_entry as usize,
                "DATA at byte {offset} carries no digest but does not continue a long read"
            );
        } else {
            let out: &[u8] = match ends.iter().position(|&e| e == offset) {
                Some(k) => &b"1234"[k..k + 1],
                None => b"",
            };
            assert_eq!(r.header.out_hash, digest(out), "DATA at byte {offset}");
        }
        prev_len = r.payload.len();
        offset += r.payload.len();
    }
    let close = entries.last().unwrap();
    assert_eq!(close.header.kind, Kind::Close);
    assert_eq!(close.header.out_hash, digest(b"4"));
}
