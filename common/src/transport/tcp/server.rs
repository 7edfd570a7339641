//! The region server: applies the write frames of authenticated
//! region-channel connections to a region, refusing old views.

use std::io::{self, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;

use super::frames::{fenced_notice, FrameHeader, HEADER_LEN};
use super::KEEP_BUF;
use crate::region::Region;

const READ_BUF: usize = 256 << 10;

/// Applies the writes of authenticated region-channel connections to a
/// region.
#[derive(Clone, Debug)]
pub struct RegionServer {
    region: Arc<Region>,
}

/// How a served connection ended badly.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The socket failed (peer reset, listener stopped).
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The peer broke the frame rules.
    #[error("{0}")]
    Garbage(String),
}

/// What a connection did, once it ended cleanly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServeStats {
    /// Frames applied.
    pub applied: u64,
    /// Frames refused for an old view.
    pub fenced: u64,
}

impl RegionServer {
    /// Serves writes into `region`.
    pub fn new(region: Arc<Region>) -> Self {
        RegionServer { region }
    }

    /// The region written into.
    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }

    /// Serves one connection that passed [`handshake::accept`](crate::handshake::accept) with
    /// [`Channel::Region`](crate::handshake::Channel::Region) for node `peer`, until the peer closes it, the
    /// socket fails or the peer sends garbage (logged; the connection is
    /// closed). Returns when the connection is done.
    pub fn serve(&self, stream: TcpStream, peer: u64) {
        self.serve_draining(stream, peer, &|| false)
    }

    /// [`RegionServer::serve`], where a batch of writes is first offered
    /// to `drain`: the region's reader, run on this thread (true: it took
    /// the batch, and the doorbell is not rung). A backup's follower reads
    /// its ring here while its poll thread sleeps: a wake-up of that
    /// thread cost a context switch per batch on top of this thread's.
    pub fn serve_draining(&self, stream: TcpStream, peer: u64, drain: &dyn Fn() -> bool) {
        let who = match stream.peer_addr() {
            Ok(a) => format!("node {peer} ({a})"),
            Err(_) => format!("node {peer}"),
        };
        let _ = stream.set_nodelay(true);
        let mut rd = BufReader::with_capacity(READ_BUF, &stream);
        match self.apply_frames_draining(&mut rd, &mut &stream, drain) {
            Ok(s) => log::debug!(
                "region writes from {who}: connection closed after {} writes ({} fenced)",
                s.applied,
                s.fenced
            ),
            Err(ServeError::Garbage(what)) => {
                log::warn!("region writes from {who}: {what}; closing the connection")
            }
            Err(ServeError::Io(e)) => log::info!("region writes from {who}: {e}"),
        }
        let _ = stream.shutdown(Shutdown::Both);
    }

    /// The frame decoder of [`RegionServer::serve`] over any byte
    /// source: applies the frames read from `rd` (fence notices go to
    /// `notices`) until a clean end at a frame boundary or an error. A
    /// frame's buffer is allocated only once its header passed the checks
    /// (at most [`MAX_WRITE`](super::MAX_WRITE) bytes).
    pub fn apply_frames(
        &self,
        rd: &mut BufReader<impl Read>,
        notices: &mut impl Write,
    ) -> Result<ServeStats, ServeError> {
        self.apply_frames_draining(rd, notices, &|| false)
    }

    /// [`RegionServer::apply_frames`] with a batch offered to `drain`
    /// before the doorbell rings (see [`RegionServer::serve_draining`]).
    pub fn apply_frames_draining(
        &self,
        rd: &mut BufReader<impl Read>,
        notices: &mut impl Write,
        drain: &dyn Fn() -> bool,
    ) -> Result<ServeStats, ServeError> {
        // The doorbell rings once per batch the writer sent (when nothing
        // more is buffered, before a read that may block), not per frame:
        // an entry and its tail are one message to the poller.
        let mut unrung = false;
        let result = self.apply_each(rd, notices, &mut unrung, drain);
        if unrung {
            self.batch_done(drain);
        }
        result
    }

    /// A batch of writes landed: `drain` takes it, or the doorbell wakes
    /// whoever waits for it.
    fn batch_done(&self, drain: &dyn Fn() -> bool) {
        if !drain() {
            self.region.bell().ring();
        }
    }

    fn apply_each(
        &self,
        rd: &mut BufReader<impl Read>,
        notices: &mut impl Write,
        unrung: &mut bool,
        drain: &dyn Fn() -> bool,
    ) -> Result<ServeStats, ServeError> {
        let region = &*self.region;
        let mut hdr = [0u8; HEADER_LEN];
        let mut body: Vec<u8> = Vec::new();
        let mut told = 0u64;
        let mut stats = ServeStats::default();
        loop {
            if *unrung && rd.buffer().is_empty() {
                self.batch_done(drain);
                *unrung = false;
            }
            if !read_header(rd, &mut hdr)? {
                return Ok(stats);
            }
            let h = FrameHeader::decode(&hdr);
            h.check(region.remote_len()).map_err(ServeError::Garbage)?;
            let len = h.len as usize;
            if body.len() < len {
                body.resize(len, 0);
            }
            if let Err(e) = rd.read_exact(&mut body[..len]) {
                return Err(if e.kind() == io::ErrorKind::UnexpectedEof {
                    ServeError::Garbage(format!(
                        "connection ended inside a {len}-byte write at offset {}",
                        h.offset
                    ))
                } else {
                    ServeError::Io(e)
                });
            }
            let current = region.view();
            if h.view < current {
                stats.fenced += 1;
                if current > told {
                    told = current;
                    log::info!(
                        "refusing writes of view {} (region is in view {current})",
                        h.view
                    );
                    notices.write_all(&fenced_notice(current))?;
                }
                continue;
            }
            region
                .write_unrung(h.offset, &body[..len])
                .map_err(|e| ServeError::Garbage(e.to_string()))?;
            *unrung = true;
            stats.applied += 1;
            if body.len() > KEEP_BUF {
                body.truncate(KEEP_BUF);
                body.shrink_to(KEEP_BUF);
            }
        }
    }
}

/// Reads a frame header; `Ok(false)` at a clean end of stream.
fn read_header(rd: &mut impl Read, hdr: &mut [u8; HEADER_LEN]) -> Result<bool, ServeError> {
    let mut got = 0;
    while got < HEADER_LEN {
        match rd.read(&mut hdr[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => {
                return Err(ServeError::Garbage(format!(
                    "connection ended inside a frame header ({got} of {HEADER_LEN} bytes)"
                )))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ServeError::Io(e)),
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::region::{self, RegionSpec};

    /// A region, its server, and a stream of three 16-byte writes at the
    /// ring's start, the i-th filled with the byte i.
    fn three_writes() -> (Arc<Region>, RegionServer, Vec<u8>) {
        let r = Arc::new(
            Region::anonymous(&RegionSpec {
                cluster: "frames".into(),
                node: 2,
                ring_size: 1 << 20,
            })
            .unwrap(),
        );
        let mut stream = Vec::new();
        for i in 0..3u64 {
            let h = FrameHeader {
                view: 0,
                offset: region::ring_offset(i * 16),
                len: 16,
                flags: 0,
            };
            stream.extend_from_slice(&h.encode());
            stream.extend_from_slice(&[i as u8; 16]);
        }
        (r.clone(), RegionServer::new(r), stream)
    }

    #[test]
    fn a_batch_of_frames_rings_the_doorbell_once() {
        let (r, server, stream) = three_writes();
        let before = r.bell().value();
        let stats = server
            .apply_frames(&mut BufReader::new(&stream[..]), &mut Vec::new())
            .unwrap();
        assert_eq!(stats.applied, 3);
        assert_eq!(
            r.bell().value(),
            before.wrapping_add(1),
            "one ring for the batch"
        );
    }

    #[test]
    fn a_batch_a_drain_took_rings_nothing_and_one_it_left_rings_once() {
        let (r, server, stream) = three_writes();
        for (takes, rings) in [(true, 0u32), (false, 1)] {
            let offered = std::cell::Cell::new(0);
            let drain = || {
                offered.set(offered.get() + 1);
                // What the drain reads is in the region already.
                assert_eq!(
                    r.ring()[4].load(std::sync::atomic::Ordering::Acquire),
                    u64::from_ne_bytes([2; 8])
                );
                takes
            };
            let before = r.bell().value();
            server
                .apply_frames_draining(&mut BufReader::new(&stream[..]), &mut Vec::new(), &drain)
                .unwrap();
            assert_eq!(offered.get(), 1, "offered once per batch");
            assert_eq!(r.bell().value(), before.wrapping_add(rings));
        }
    }
}
