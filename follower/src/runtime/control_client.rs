//! The client side of the control channel: connecting to a peer, and a
//! view change round sent to every peer at once.

use std::net::TcpStream;
use std::time::Duration;

use lockstep_common::control::{self, Request, Response};
use lockstep_common::handshake::{self, Channel};

use super::Node;

/// Timeout of one control-channel exchange.
pub(super) const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);
/// Connect timeout of a view change's requests: a dead or cut-off peer
/// must not hold the candidate up for long.
pub(super) const ROUND_CONNECT: Duration = Duration::from_millis(500);

impl Node {
    pub(crate) fn control_connect(
        &self,
        peer: u64,
        connect_timeout: Duration,
    ) -> anyhow::Result<TcpStream> {
        let addr = self.config.node(peer)?.control;
        let s = handshake::connect(
            addr,
            &self.config.cluster,
            self.config.cluster_key()?,
            self.me,
            Channel::Control,
            connect_timeout,
        )?;
        s.set_read_timeout(Some(CONTROL_TIMEOUT))?;
        s.set_write_timeout(Some(CONTROL_TIMEOUT))?;
        Ok(s)
    }

    /// Sends `req` to every other node at once; their answers.
    pub(super) fn round(&self, req: &Request) -> Vec<(u64, anyhow::Result<Response>)> {
        let peers: Vec<u64> = self.config.ids().filter(|&i| i != self.me).collect();
        std::thread::scope(|s| {
            let handles: Vec<_> = peers
                .iter()
                .map(|&peer| {
                    (
                        peer,
                        s.spawn(move || -> anyhow::Result<Response> {
                            let mut c = self.control_connect(peer, ROUND_CONNECT)?;
                            control::send_json(&mut c, req)?;
                            Ok(control::recv_json::<Response>(&mut c)?)
                        }),
                    )
                })
                .collect();
            handles
                .into_iter()
                .map(|(peer, h)| {
                    (
                        peer,
                        h.join()
                            .unwrap_or_else(|_| Err(anyhow::anyhow!("request thread panicked"))),
                    )
                })
                .collect()
        })
    }
}
