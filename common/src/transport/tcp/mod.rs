//! TCP transport: an emulated RNIC. Each node's follower runs a region
//! server that applies one-sided writes sent to it over TCP; writers post
//! writes into per-peer queues that sender threads push to the network.
//!
//! # Connection
//!
//! A writer connects to the peer's `control` address and runs the
//! [`handshake`](crate::handshake) with [`Channel::Region`](crate::handshake::Channel::Region); then the
//! stream carries write frames one way and fence notices the other way.
//!
//! # Frames (writer → region server), little-endian
//!
//! ```text
//! view u64 | offset u64 | len u32 | flags u32 (= 0) | len bytes
//! ```
//!
//! `len` is a non-zero multiple of 8 of at most [`MAX_WRITE`] (16 MiB;
//! [`TcpTransport`] splits longer writes into consecutive frames, the last
//! bytes still landing last), `offset` is 8-aligned, `offset + len` lies
//! inside the region and `offset` is not inside the identity words (the
//! first [`IDENTITY_BYTES`] bytes: magic, layout, node, ring size, cluster).
//! Every frame is thus a multiple of 8 bytes long.
//!
//! The server reads the whole frame into a buffer before it applies it with
//! [`Region::write`](crate::region::Region::write) (bounds-checked, last 8 bytes stored last with release
//! ordering, doorbell rung), so a frame is applied entirely or not at all.
//! Frames of one connection are applied in order. When no more is buffered
//! the batch is offered to the region's reader on the same thread
//! ([`RegionServer::serve_draining`]: a backup's follower stores and acks it
//! there) and the doorbell rings only if that reader did not take it.
//!
//! A frame whose `view` is older than the region's current view is not
//! applied. The server answers with a fence notice (below) the first time
//! it refuses a write for each newer region view on that connection, and
//! keeps the connection: later frames of a current view still land (a
//! leader that learns of a newer view stops by itself).
//!
//! Anything else that breaks the rules above (bad length, misaligned or
//! out-of-bounds offset, unknown flags, a connection ending inside a frame)
//! is garbage: the server logs a warning naming the peer, applies nothing of
//! that frame and closes the connection.
//!
//! # Notices (region server → writer), little-endian
//!
//! ```text
//! tag u32 (1 = fenced) | pad u32 (= 0) | view u64 (the region's view)
//! ```
//!
//! # Writer side
//!
//! [`TcpTransport::write`] never blocks on the network: it appends the frame
//! to the peer's queue (one mutex, no allocation once the buffers have
//! grown); [`Transport::flush`] sends each peer's queued frames, so what a
//! writer posts between two flushes (a leader's turn) goes out in one
//! send. The flush sends them itself, without blocking (`MSG_DONTWAIT`),
//! when no sender is writing and the socket takes them: a wake-up of the
//! sender thread and its context switch cost more than the send (2 cores,
//! Redis SET through tcp). What the socket does not take, and everything
//! while a connection is being set up, the sender thread sends. Writes to
//! the local node go straight into the local region.
//!
//! Each peer gets a sender thread, started lazily on the first write to that
//! peer (constructing a `TcpTransport` does no I/O and starts no thread, so
//! it is safe wherever a constructor may run), plus a reader thread per live
//! connection that collects fence notices and notices a closed connection.
//! The sender connects lazily, reconnects with backoff (20 ms doubling up to
//! 1 s) while the peer is down, and sends everything queued with one
//! `write_all` per batch (double-buffered: writers fill one buffer while the
//! sender sends the other). A peer that reads nothing for 10 s loses its
//! connection. The queue holds at most [`MAX_QUEUE`] bytes (64 MiB, or one
//! write if that alone is longer); writes posted while it is full are
//! dropped — like a lost one-sided write, which the protocol tolerates (the
//! reader catches up from a peer) — and a write is never reordered with
//! another within a connection. Writes queued when a connection breaks go
//! out on the next one; a batch that failed half-way is lost (the server
//! discards the truncated frame).
//!
//! Dropping the `TcpTransport` stops its threads: each sender sends what is
//! still queued if it has a connection (bounded by a 1 s send timeout), then
//! closes it, which ends the reader. Threads are detached; none keeps the
//! process alive. No code here panics on I/O errors: this transport runs
//! inside the preloaded server too.
//!
//! # Files
//!
//! `frames` (the wire format), `server` (the region server), `client` (the
//! writer: [`TcpTransport`]), `send_now` (the flush's non-blocking send). A listener for tests lives beside the tests
//! (`common/tests/region_listener`).

mod client;
mod frames;
mod send_now;
mod server;

pub use super::IDENTITY_BYTES;
pub use client::TcpTransport;
pub use frames::{FrameHeader, HEADER_LEN, MAX_WRITE, NOTICE_FENCED, NOTICE_LEN};
pub use server::{RegionServer, ServeError, ServeStats};

/// Most bytes queued per peer; writes beyond are dropped.
pub const MAX_QUEUE: usize = 64 << 20;

/// Buffers above this are shrunk back after use.
const KEEP_BUF: usize = 4 << 20;
