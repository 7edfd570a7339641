//! Which control requests a follower serves, and from whom: a decision
//! free of I/O.
//!
//! The handshake ([`lockstep_common::handshake`]) proves that a connection
//! knows the cluster key and fixes the node id it claims for the whole
//! connection (0: a CLI client such as `lockstep status`). On top of it a
//! follower serves
//!
//! - `Status` to anyone who passed the handshake (read-only);
//! - `Fetch` (log transfer) only to another member of the config;
//! - `Prepare` only from its candidate, and `NewView` only from its leader,
//!   each a member of the config other than this node.
//!
//! So a view change or a log transfer that names a node id outside the
//! config, or that comes from a connection speaking for another node (a
//! CLI client's identity, or a member relaying for a stranger), is refused:
//! the view change protocol counts promises per node id, and a stranger's
//! view would fence the cluster's writes for a leader that does not exist.
//! The same holds for region writes (the tcp transport): only another
//! member writes into this node's region.

use std::fmt;

use lockstep_common::control::Request;

/// Why a request is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A node id the request names is not in the config.
    NotMember {
        /// What the id is in the request ("candidate", "leader", "peer").
        role: &'static str,
        /// The id.
        id: u64,
        /// The config's ids.
        members: Vec<u64>,
    },
    /// The request speaks for node `id`, the connection for node `peer`.
    NotFrom {
        /// What `id` is in the request.
        role: &'static str,
        /// The node the request speaks for.
        id: u64,
        /// The node the connection proved it speaks for (0: a CLI client).
        peer: u64,
    },
    /// The connection claims to be this very node.
    Myself {
        /// This node's id.
        me: u64,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NotMember { role, id, members } => {
                let ids: Vec<String> = members.iter().map(|m| m.to_string()).collect();
                if *id == 0 {
                    write!(
                        f,
                        "{role} 0 (a CLI client) is not a member of the cluster (members: {})",
                        ids.join(", ")
                    )
                } else {
                    write!(
                        f,
                        "{role} {id} is not a member of the cluster (members: {})",
                        ids.join(", ")
                    )
                }
            }
            Refusal::NotFrom { role, id, peer } => write!(
                f,
                "a request of {role} {id} must come from node {id}, this connection is node {peer}'s"
            ),
            Refusal::Myself { me } => write!(
                f,
                "the connection claims to be node {me}, which is this node itself"
            ),
        }
    }
}

/// Whether node `me` (a member of `members`) serves `req` on a control
/// connection whose handshake proved node id `peer`.
pub fn admit(members: &[u64], me: u64, peer: u64, req: &Request) -> Result<(), Refusal> {
    let (role, id) = match req {
        // Operators' requests (the cluster key is proven already).
        Request::Status | Request::Snapshot => return Ok(()),
        Request::Fetch { .. } | Request::SnapshotMeta | Request::SnapshotChunk { .. } => {
            return admit_peer(members, me, peer)
        }
        Request::Prepare { candidate, .. } => ("candidate", *candidate),
        Request::NewView { leader, .. } => ("leader", *leader),
    };
    if !members.contains(&id) {
        return Err(Refusal::NotMember {
            role,
            id,
            members: members.to_vec(),
        });
    }
    if id != peer {
        return Err(Refusal::NotFrom { role, id, peer });
    }
    admit_peer(members, me, peer)
}

/// Whether node `me` accepts a connection from node `peer` for something
/// only members do (log transfer, region writes).
pub fn admit_peer(members: &[u64], me: u64, peer: u64) -> Result<(), Refusal> {
    if !members.contains(&peer) {
        return Err(Refusal::NotMember {
            role: "peer",
            id: peer,
            members: members.to_vec(),
        });
    }
    if peer == me {
        return Err(Refusal::Myself { me });
    }
    Ok(())
}

/// A short description of a request for log lines.
pub fn describe(req: &Request) -> String {
    match req {
        Request::Status => "Status".into(),
        Request::Snapshot => "Snapshot".into(),
        Request::Fetch { from, to } => format!("Fetch {from}..={to}"),
        Request::SnapshotMeta => "SnapshotMeta".into(),
        Request::SnapshotChunk {
            seq, file, offset, ..
        } => format!("SnapshotChunk {seq} {file:?} at {offset}"),
        Request::Prepare { view, candidate } => {
            format!("Prepare of view {view} for candidate {candidate}")
        }
        Request::NewView { view, leader, last } => {
            format!("NewView {view} led by node {leader} (log ends at {last})")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: &[u64] = &[1, 2, 3];

    fn prepare(candidate: u64) -> Request {
        Request::Prepare {
            view: 1003,
            candidate,
        }
    }

    fn new_view(leader: u64) -> Request {
        Request::NewView {
            view: 4,
            leader,
            last: 10,
        }
    }

    #[test]
    fn status_is_for_everyone() {
        for peer in [0, 1, 2, 9] {
            assert_eq!(admit(M, 2, peer, &Request::Status), Ok(()));
        }
    }

    #[test]
    fn a_strangers_prepare_is_refused() {
        // The scenario of issue 14: candidate 9, over a CLI client's
        // connection.
        let e = admit(M, 2, 0, &prepare(9)).unwrap_err();
        assert_eq!(
            e,
            Refusal::NotMember {
                role: "candidate",
                id: 9,
                members: M.to_vec()
            }
        );
        assert_eq!(
            e.to_string(),
            "candidate 9 is not a member of the cluster (members: 1, 2, 3)"
        );
        // Even over a connection that proved id 9 (the key, not membership).
        assert!(matches!(
            admit(M, 2, 9, &prepare(9)),
            Err(Refusal::NotMember { id: 9, .. })
        ));
        assert!(matches!(
            admit(M, 2, 0, &prepare(0)),
            Err(Refusal::NotMember { id: 0, .. })
        ));
    }

    #[test]
    fn a_prepare_comes_from_its_candidate() {
        assert_eq!(admit(M, 2, 3, &prepare(3)), Ok(()));
        assert_eq!(
            admit(M, 2, 0, &prepare(3)),
            Err(Refusal::NotFrom {
                role: "candidate",
                id: 3,
                peer: 0
            })
        );
        assert!(matches!(
            admit(M, 2, 1, &prepare(3)),
            Err(Refusal::NotFrom { .. })
        ));
        // Nobody sends this node its own Prepare over the wire.
        assert_eq!(admit(M, 2, 2, &prepare(2)), Err(Refusal::Myself { me: 2 }));
    }

    #[test]
    fn a_new_view_comes_from_its_leader() {
        assert_eq!(admit(M, 3, 1, &new_view(1)), Ok(()));
        assert!(matches!(
            admit(M, 3, 1, &new_view(7)),
            Err(Refusal::NotMember {
                role: "leader",
                id: 7,
                ..
            })
        ));
        assert!(matches!(
            admit(M, 3, 2, &new_view(1)),
            Err(Refusal::NotFrom { .. })
        ));
        assert!(matches!(
            admit(M, 3, 3, &new_view(3)),
            Err(Refusal::Myself { .. })
        ));
    }

    #[test]
    fn only_other_members_fetch_or_write() {
        let fetch = Request::Fetch { from: 1, to: 0 };
        assert_eq!(admit(M, 1, 2, &fetch), Ok(()));
        let e = admit(M, 1, 0, &fetch).unwrap_err().to_string();
        assert!(e.contains("peer 0 (a CLI client) is not a member"), "{e}");
        assert!(admit(M, 1, 4, &fetch).is_err());
        assert!(admit(M, 1, 1, &fetch).is_err());
        assert_eq!(admit_peer(M, 1, 3), Ok(()));
        assert!(admit_peer(M, 1, 15).is_err());
    }

    #[test]
    fn every_refusal_names_the_id() {
        for (peer, req) in [(0, prepare(9)), (0, prepare(3)), (4, new_view(4))] {
            let e = admit(M, 2, peer, &req).unwrap_err().to_string();
            let id = match req {
                Request::Prepare { candidate, .. } => candidate,
                Request::NewView { leader, .. } => leader,
                _ => unreachable!(),
            };
            assert!(e.contains(&id.to_string()), "{e}");
        }
    }
}
