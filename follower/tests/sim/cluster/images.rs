//! Snapshots in the simulated cluster, carried out as the runtime carries
//! out the replica's decisions (`runtime/snapshots.rs`): a node's image is
//! its model server's state (the inputs it consumed) after a seq; taking
//! one pauses its server a few milliseconds and sometimes fails; a
//! compaction deletes the stored log's prefix; an install replaces the
//! server by a peer's image and keeps the log only where it continues the
//! image; a restarted node restores its newest image inside its log, or,
//! with none, waits for a peer's. Every round of the rules (each node on
//! its own, every [`ROUND_MS`]) sees the members' states as their status
//! reports them, partitions included.
//!
//! Checked as it happens: an image holds committed inputs only, and only
//! up to its seq; a compaction never passes the cluster's commit point nor
//! what a majority's images cover.

use lockstep_follower::protocol::snapshot::Member;
use lockstep_follower::protocol::SnapshotRound;

use super::*;

/// How often each node runs the snapshot rules (the runtime: once a
/// second, against session timeouts of seconds).
pub const ROUND_MS: Millis = 20;
/// Images kept on a node (the runtime's `KEEP`).
const KEEP: usize = 2;
/// How long a failed image keeps a node behind the others in the turn
/// order, in its peers' eyes; the node itself counts [`OWN_GRACE_MS`]
/// more (the rules' 60 s and 3 s, scaled as `ROUND_MS` is).
const RECENT_MS: Millis = 3000;
const OWN_GRACE_MS: Millis = 150;
/// Percent of images that fail (CRIU refuses, the server never idles).
const FAILING_PERCENT: u64 = 20;

/// A node's server image after `seq` (of `view`).
#[derive(Clone, Debug)]
pub struct Image {
    pub seq: u64,
    pub view: u64,
    /// The inputs the server consumed up to `seq`: (seq, view, value).
    pub server: Vec<(u64, u64, u64)>,
}

/// A node's snapshots: its images (on disk, kept across crashes), the one
/// being taken, its latest failure.
#[derive(Clone, Debug, Default)]
pub struct Snapshots {
    /// Complete images, oldest first.
    pub images: Vec<Image>,
    /// The image being taken and when it is done: the server applies
    /// nothing meanwhile.
    imaging: Option<(Millis, Image)>,
    /// When its latest attempt failed (None: it worked since).
    failed_at: Option<Millis>,
    /// Neither its log nor its images can rebuild its server: it applies
    /// nothing until a peer's image is installed.
    pub needy: bool,
}

/// What the snapshots of a run did, for the summary.
#[derive(Clone, Copy, Debug, Default)]
pub struct SnapshotCounts {
    /// Images complete.
    pub images: u64,
    /// Compactions that deleted entries.
    pub compactions: u64,
    /// Peers' images installed.
    pub installs: u64,
    /// Servers restored from an own image at a restart.
    pub restores: u64,
}

impl Snapshots {
    /// The newest complete image's seq (0: none).
    pub fn newest(&self) -> u64 {
        self.images.last().map_or(0, |i| i.seq)
    }

    /// Whether the server may apply now.
    pub fn lets_apply(&self) -> bool {
        self.imaging.is_none() && !self.needy
    }

    fn keep(&mut self, image: Image) {
        self.images.retain(|i| i.seq != image.seq);
        self.images.push(image);
        self.images.sort_by_key(|i| i.seq);
        let extra = self.images.len().saturating_sub(KEEP);
        self.images.drain(..extra);
    }
}

impl Cluster {
    /// Node `id`'s state as `asker`'s round reads it (its status; a node
    /// it cannot reach is not live).
    fn member(&self, asker: u64, id: u64) -> Member {
        let n = &self.nodes[id as usize - 1];
        let Some(r) = n.replica.as_ref().filter(|_| self.reachable(asker, id)) else {
            return Member {
                node: id,
                ..Member::default()
            };
        };
        let role = r.role();
        let stale = n.stale || r.stale().is_some();
        let last = n.storage.last().0;
        let recent = RECENT_MS + if asker == id { OWN_GRACE_MS } else { 0 };
        Member {
            node: id,
            live: true,
            leader: !stale && role == Role::Leader,
            backup: !stale && role == Role::Backup,
            stale,
            failing: n.snapshots.failed_at.is_some_and(|t| self.now - t < recent),
            taking: n.snapshots.imaging.is_some(),
            // As the status shows it: no further than the commit point.
            applied: if role == Role::Leader {
                last.min(r.committed())
            } else {
                r.applied().min(r.committed())
            },
            last,
            committed: r.committed(),
            oldest: n.storage.compacted.0 + 1,
            snapshot: n.snapshots.newest(),
            bytes_since: 0,
            image_bytes: 0,
        }
    }

    /// One round of node `id`'s snapshot rules.
    pub(super) fn snapshot_round(&mut self, id: u64) {
        let members = (1..=self.nodes.len() as u64)
            .map(|m| self.member(id, m))
            .collect();
        let can_rebuild = !self.nodes[id as usize - 1].snapshots.needy;
        let round = SnapshotRound {
            members,
            can_rebuild,
        };
        self.step_node(id, Event::SnapshotRound(round));
    }

    /// Images due now are complete (or fail).
    pub(super) fn finish_images(&mut self) {
        let now = self.now;
        for i in 0..self.nodes.len() {
            let due = matches!(self.nodes[i].snapshots.imaging, Some((at, _)) if at <= now);
            if !due {
                continue;
            }
            let failed = self.rng.percent(FAILING_PERCENT);
            let s = &mut self.nodes[i].snapshots;
            let Some((_, image)) = s.imaging.take() else {
                continue;
            };
            if failed {
                s.failed_at = Some(now);
                continue;
            }
            s.failed_at = None;
            let id = self.nodes[i].id;
            self.check_image(id, &image);
            self.snapshot_counts.images += 1;
            self.nodes[i].snapshots.keep(image);
        }
    }

    /// An image holds committed inputs only, all of them up to its seq
    /// and none past it.
    fn check_image(&self, id: u64, image: &Image) {
        assert!(
            image.seq <= self.commit_point(),
            "node {id} imaged its server at seq {}, past the commit point {}",
            image.seq,
            self.commit_point()
        );
        for &(s, v, val) in &image.server {
            assert!(
                s <= image.seq,
                "node {id}'s image at {} holds seq {s}",
                image.seq
            );
            assert_eq!(
                self.committed.get(s as usize - 1),
                Some(&(v, val)),
                "node {id}'s image at {} holds seq {s} unlike its committed entry",
                image.seq
            );
        }
    }

    /// [`Action::TakeSnapshot`]: as the apply thread, at the server's
    /// applied point (a node that does not apply now refuses).
    pub(super) fn take_snapshot(&mut self, id: u64) {
        let now = self.now;
        let pause = 1 + self.rng.below(5);
        let n = self.node(id);
        let Some(r) = &n.replica else { return };
        let applying = r.role() == Role::Backup && !n.stale && n.server_alive;
        if !applying || !n.snapshots.lets_apply() {
            return;
        }
        let seq = r.applied();
        let Some(view) = n.storage.get(seq).map(|e| e.view) else {
            // "seq N is not in the log": an attempt that failed.
            n.snapshots.failed_at = Some(now);
            return;
        };
        let image = Image {
            seq,
            view,
            server: n.server.clone(),
        };
        n.snapshots.imaging = Some((now + pause, image));
    }

    /// [`Action::Compact`]: deletes the log up to `through`, after
    /// checking that nothing committed can be lost by it.
    pub(super) fn compact(&mut self, id: u64, through: u64) {
        if through <= self.nodes[id as usize - 1].storage.compacted.0 {
            return;
        }
        assert!(
            through <= self.commit_point(),
            "node {id} deletes its log through {through}, past the commit point {}",
            self.commit_point()
        );
        let covering = self
            .nodes
            .iter()
            .filter(|n| n.snapshots.newest() >= through)
            .count();
        assert!(
            covering > self.nodes.len() / 2,
            "node {id} deletes its log through {through}: only {covering} images reach it"
        );
        self.node(id).storage.compact_through(through);
        self.snapshot_counts.compactions += 1;
    }

    /// [`Action::Install`]: `from`'s newest image replaces node `id`'s
    /// server (a transfer fails at the fault rate, or when `from` cannot
    /// be reached or has nothing past what this node holds).
    pub(super) fn install(&mut self, id: u64, from: u64) {
        let lost = self.rng.percent(self.faults.drop);
        let image = self.nodes[from as usize - 1]
            .snapshots
            .images
            .last()
            .cloned();
        let n = &self.nodes[id as usize - 1];
        let have = if n.snapshots.needy {
            0
        } else {
            n.storage.last().0.max(n.snapshots.newest())
        };
        let image = image.filter(|i| {
            !lost && self.up(from) && self.reachable(id, from) && n.server_alive && i.seq > have
        });
        let Some(image) = image else {
            self.step_node(id, Event::InstallFailed);
            return;
        };
        let seq = image.seq;
        let n = self.node(id);
        n.server = image.server.clone();
        // A new server: the checks compare it whole again.
        n.checked.applied = 0;
        n.checked.restarts += 1;
        n.checked.prefix_of = (0, 0, 0);
        let (last, _) = n.storage.last();
        let stored_view = if seq == n.storage.compacted.0 {
            Some(n.storage.compacted.1)
        } else {
            n.storage.get(seq).map(|e| e.view)
        };
        if n.storage.compacted.0 <= seq && seq <= last {
            // A log that holds the image's own entry (its seq and view)
            // holds its history below: kept for peers that still fetch
            // it (the compaction rule deletes it once none does). Another
            // log may differ there from what committed: deleted.
            if stored_view == Some(image.view) {
                n.storage.committed = n.storage.committed.max(seq);
            } else {
                n.storage.compact_through(seq);
            }
        } else {
            n.storage.restart_after(seq, image.view);
            n.checked.agree = n.checked.agree.min(seq);
            n.checked.recorded = n.checked.recorded.min(seq);
        }
        n.snapshots.keep(image);
        n.snapshots.needy = false;
        n.snapshots.imaging = None;
        n.reader = None;
        self.snapshot_counts.installs += 1;
        self.step_node(id, Event::Installed { seq });
    }

    /// At a start: the server restored from the newest image inside the
    /// log (the runtime's `restore_newest`); with none, a node whose log
    /// was compacted waits for a peer's.
    pub(super) fn restore(&mut self, id: u64) {
        let n = self.node(id);
        n.snapshots.imaging = None;
        let (last, _) = n.storage.last();
        let oldest = n.storage.compacted.0 + 1;
        let usable = n
            .snapshots
            .images
            .iter()
            .rev()
            .find(|i| i.seq <= last && i.seq + 1 >= oldest)
            .cloned();
        n.snapshots.needy = usable.is_none() && oldest > 1;
        if let Some(image) = usable {
            n.server = image.server;
            self.snapshot_counts.restores += 1;
            self.step_node(id, Event::Applied { seq: image.seq });
        }
    }
}
