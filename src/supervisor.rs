//! What `lockstep up` decides about each node while it heals the cluster,
//! without doing any of it: one [`Observation`] of a node in, the
//! [`Command`]s to carry out back. The caller (`up::Cluster::heal`) gathers
//! the observation (reaped exits, the follower's status, whether the server
//! accepts connections) and performs the commands (signals, spawns), so
//! every restart rule is tested here with plain values and a clock the
//! test moves.
//!
//! A node is `Running` until its follower exits, its server exits without a
//! replacement, or its follower reports it `stale`; it is then stopped
//! (SIGTERM, SIGKILL after [`STOP_GRACE`]) and started again — follower
//! first, then the server once the follower answers — and counts as back
//! once it serves its role. Failed attempts are retried after a pause that
//! doubles ([`backoff`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use lockstep_common::control::NodeStatus;

/// How long a stopping process may take after SIGTERM before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// How long a node whose server exited waits for its (living) follower to
/// report `stale` before it is restarted anyway: the follower steps down
/// and leaves the election first, so the others do not wait for it.
pub const STALE_GRACE: Duration = Duration::from_secs(10);

/// How long a restarted follower may take to answer its control channel.
pub const FOLLOWER_LIMIT: Duration = Duration::from_secs(60);

/// How long a restarting node may go without applying anything new before
/// its restart counts as failed (a long log takes long to replay: only a
/// node that stopped making progress fails).
pub const REBUILD_STALL_LIMIT: Duration = Duration::from_secs(120);

/// The longest pause between two attempts to restart a node.
pub const BACKOFF_CAP: Duration = Duration::from_secs(30);

/// A restarted node that ran this long is healthy again: its next failure
/// is restarted at once, not after a pause.
pub const HEALTHY_AFTER: Duration = Duration::from_secs(60);

/// The pause before restart attempt number `failures + 1`: none for a
/// first failure, then 1 s, 2 s, 4 s, … at most [`BACKOFF_CAP`].
pub fn backoff(failures: u32) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    Duration::from_secs(1u64 << (failures - 1).min(16)).min(BACKOFF_CAP)
}

/// Why node status `s` says its server must be rebuilt (None: it need not).
pub fn stale_reason(s: &NodeStatus) -> Option<String> {
    if s.role == "stale" || s.stale_reason.is_some() {
        Some(
            s.stale_reason
                .clone()
                .unwrap_or_else(|| "no reason given".to_string()),
        )
    } else {
        None
    }
}

/// What the caller knows about one node at a heal step.
pub struct Observation<'a> {
    /// When the step runs.
    pub now: Instant,
    /// How its follower exited (`" (exit status: 1)"`), once reaped.
    pub follower_exited: Option<String>,
    /// How its server exited, once reaped.
    pub server_exited: Option<String>,
    /// Why a starting node failed: which of its processes exited first,
    /// how, and the last line of its log.
    pub exit_why: Option<String>,
    /// The pid of another server attached to its region after its own
    /// exited: its follower replaced the server by an installed snapshot.
    pub replacement: Option<u64>,
    /// Some process of the node still runs.
    pub alive: bool,
    /// Its follower's status, when asked for this step: always in the
    /// phases that [`Supervisor::wants_status`] names, now and then while
    /// it runs (staleness is checked only then).
    pub status: Option<Result<NodeStatus, String>>,
    /// Whether its server accepts connections on its client address (asked
    /// only once the status says it could serve).
    pub accepts: &'a dyn Fn() -> bool,
}

/// What the caller does for a node, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Tell the operator.
    Say(String),
    /// Watch the server its follower restored (pid) instead of the one
    /// that exited.
    Adopt(u64),
    /// SIGTERM to what is left of the node (and mark it stopped on purpose).
    Terminate,
    /// SIGKILL to what is left of the node.
    Kill,
    /// Forget its processes (all exited), killing what they left behind.
    Forget,
    /// Start its follower, with its data dir. On failure, the caller
    /// reports it through [`Supervisor::failed`].
    StartFollower,
    /// Start its server under the preload. On failure, as above.
    StartServer,
}

/// What the supervisor is doing about one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Running; watched for exits and staleness. `healed`: started by a
    /// restart (not by `up` itself).
    Running { since: Instant, healed: bool },
    /// Its server exited while its follower runs: waiting (at most
    /// [`STALE_GRACE`]) for the follower to report `stale`. `quick`: it
    /// failed soon after a restart.
    ServerGone {
        since: Instant,
        how: String,
        quick: bool,
    },
    /// What was left of it got SIGTERM at `since` (SIGKILL after
    /// [`STOP_GRACE`]); once gone, it is started at `start_at`.
    Stopping {
        since: Instant,
        killed: bool,
        start_at: Instant,
    },
    /// Stopped; started again at `until` (the pause after failures).
    Waiting { until: Instant },
    /// Its follower was started at `since`; waiting for it to answer.
    StartingFollower { since: Instant },
    /// Its server was started; waiting until the node serves its role.
    /// `applied`/`progress_at`: the log replay's last progress.
    /// `told_catching_up`: its catch-up progress was said.
    StartingServer {
        applied: u64,
        progress_at: Instant,
        told_catching_up: bool,
    },
}

/// One node's healing state.
#[derive(Clone, Debug)]
struct NodeHeal {
    phase: Phase,
    /// Failed restarts (and failures soon after a restart) in a row.
    failures: u32,
}

/// The restart decisions for every node `up` runs.
#[derive(Default)]
pub struct Supervisor {
    nodes: BTreeMap<u64, NodeHeal>,
}

impl Supervisor {
    /// Nothing watched yet.
    pub fn new() -> Supervisor {
        Supervisor::default()
    }

    /// Node `id` runs (started by `up` itself) from `now` on.
    pub fn watch(&mut self, id: u64, now: Instant) {
        self.nodes.insert(
            id,
            NodeHeal {
                phase: Phase::Running {
                    since: now,
                    healed: false,
                },
                failures: 0,
            },
        );
    }

    /// The nodes watched.
    pub fn nodes(&self) -> Vec<u64> {
        self.nodes.keys().copied().collect()
    }

    /// What the supervisor is doing about node `id`.
    pub fn phase(&self, id: u64) -> Option<&Phase> {
        self.nodes.get(&id).map(|h| &h.phase)
    }

    /// Whether the next step of node `id` needs its status whatever the
    /// caller's own polling: it is being started, or its server is gone.
    pub fn wants_status(&self, id: u64) -> bool {
        matches!(
            self.phase(id),
            Some(
                Phase::ServerGone { .. }
                    | Phase::StartingFollower { .. }
                    | Phase::StartingServer { .. }
            )
        )
    }

    /// One step for node `id`: the commands to carry out, in order.
    pub fn step(&mut self, id: u64, obs: &Observation) -> Vec<Command> {
        let Some(phase) = self.phase(id).cloned() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let next = self.decide(id, phase, obs, &mut out);
        if let Some(h) = self.nodes.get_mut(&id) {
            h.phase = next;
        }
        out
    }

    /// A command of node `id`'s last step failed (a spawn, an adoption):
    /// say why, stop what is left, and try again after a pause that
    /// doubles with each failure in a row.
    pub fn failed(&mut self, id: u64, why: &str, now: Instant) -> Vec<Command> {
        let mut out = Vec::new();
        let next = self.restart_failed(id, why, now, &mut out);
        if let Some(h) = self.nodes.get_mut(&id) {
            h.phase = next;
        }
        out
    }

    fn decide(
        &mut self,
        id: u64,
        phase: Phase,
        obs: &Observation,
        out: &mut Vec<Command>,
    ) -> Phase {
        let now = obs.now;
        let say = |out: &mut Vec<Command>, m: String| out.push(Command::Say(m));
        match phase {
            Phase::Running { since, healed } => {
                let quick = healed && now.saturating_duration_since(since) < HEALTHY_AFTER;
                if let Some(f) = &obs.follower_exited {
                    let why = match &obs.server_exited {
                        Some(s) if s == f => format!("its server and follower exited{f}"),
                        Some(s) => format!("its follower exited{f}, its server{s}"),
                        None => format!("its follower exited{f}"),
                    };
                    say(out, format!("node {id} is down ({why}): restarting it"));
                    return self.begin_restart(id, quick, now, out);
                }
                if let Some(how) = &obs.server_exited {
                    if let Some(pid) = obs.replacement {
                        out.push(Command::Adopt(pid));
                        return Phase::Running { since, healed };
                    }
                    // Its follower notices within 100 ms, steps down and
                    // says `stale`.
                    return Phase::ServerGone {
                        since: now,
                        how: how.clone(),
                        quick,
                    };
                }
                if let Some(Ok(s)) = &obs.status {
                    if let Some(why) = stale_reason(s) {
                        say(out, format!("node {id} is stale ({why}): restarting it"));
                        return self.begin_restart(id, quick, now, out);
                    }
                }
                Phase::Running { since, healed }
            }
            Phase::ServerGone { since, how, quick } => {
                if let (Some(_), Some(pid)) = (&obs.server_exited, obs.replacement) {
                    out.push(Command::Adopt(pid));
                    return Phase::Running {
                        since: now,
                        healed: true,
                    };
                }
                if let Some(f) = &obs.follower_exited {
                    say(out, format!(
                        "node {id} is down (its server exited{how}, its follower exited{f}): restarting it"
                    ));
                    return self.begin_restart(id, quick, now, out);
                }
                if let Some(Ok(s)) = &obs.status {
                    if let Some(why) = stale_reason(s) {
                        say(out, format!("node {id} is stale ({why}): restarting it"));
                        return self.begin_restart(id, quick, now, out);
                    }
                }
                if now.saturating_duration_since(since) > STALE_GRACE {
                    say(out, format!(
                        "node {id} is down (its server exited{how}; its follower did not report stale within {STALE_GRACE:?}): restarting it"
                    ));
                    return self.begin_restart(id, quick, now, out);
                }
                Phase::ServerGone { since, how, quick }
            }
            Phase::Stopping {
                since,
                killed,
                start_at,
            } => {
                if obs.alive {
                    if !killed && now.saturating_duration_since(since) > STOP_GRACE {
                        out.push(Command::Kill);
                        return Phase::Stopping {
                            since,
                            killed: true,
                            start_at,
                        };
                    }
                    return Phase::Stopping {
                        since,
                        killed,
                        start_at,
                    };
                }
                out.push(Command::Forget);
                if now < start_at {
                    Phase::Waiting { until: start_at }
                } else {
                    out.push(Command::StartFollower);
                    Phase::StartingFollower { since: now }
                }
            }
            Phase::Waiting { until } => {
                if now < until {
                    Phase::Waiting { until }
                } else {
                    out.push(Command::StartFollower);
                    Phase::StartingFollower { since: now }
                }
            }
            Phase::StartingFollower { since } => {
                if let Some(why) = &obs.exit_why {
                    return self.restart_failed(id, why, now, out);
                }
                if let Some(Ok(_)) = &obs.status {
                    out.push(Command::StartServer);
                    return Phase::StartingServer {
                        applied: 0,
                        progress_at: now,
                        told_catching_up: false,
                    };
                }
                if now.saturating_duration_since(since) > FOLLOWER_LIMIT {
                    return self.restart_failed(
                        id,
                        &format!("its follower did not answer within {FOLLOWER_LIMIT:?}"),
                        now,
                        out,
                    );
                }
                Phase::StartingFollower { since }
            }
            Phase::StartingServer {
                mut applied,
                mut progress_at,
                mut told_catching_up,
            } => {
                if let Some(why) = &obs.exit_why {
                    return self.restart_failed(id, why, now, out);
                }
                if let Some(Ok(s)) = &obs.status {
                    if let Some(why) = stale_reason(s) {
                        return self.restart_failed(
                            id,
                            &format!("it went stale while rebuilding ({why})"),
                            now,
                            out,
                        );
                    }
                    if s.applied > applied {
                        applied = s.applied;
                        progress_at = now;
                    }
                    if s.role == "catching-up" && !told_catching_up {
                        say(
                            out,
                            format!("node {id} {}", crate::status::catching_up_line(s)),
                        );
                        told_catching_up = true;
                    }
                    // Back only once it is a member that a failover may
                    // land on: caught up, not joining a view.
                    let serves = s.server_pid != 0
                        && s.role != "joining"
                        && s.role != "catching-up"
                        && (obs.accepts)();
                    if serves {
                        say(out, format!("node {id} back as {}", s.role));
                        return Phase::Running {
                            since: now,
                            healed: true,
                        };
                    }
                }
                if now.saturating_duration_since(progress_at) > REBUILD_STALL_LIMIT {
                    return self.restart_failed(
                        id,
                        &format!(
                            "it applied nothing for {REBUILD_STALL_LIMIT:?} and does not serve yet"
                        ),
                        now,
                        out,
                    );
                }
                Phase::StartingServer {
                    applied,
                    progress_at,
                    told_catching_up,
                }
            }
        }
    }

    /// A failure of a running node was found (and said): stop what is left
    /// of it, then start it — at once, or after a pause when it failed
    /// again soon after a restart (`quick`).
    fn begin_restart(
        &mut self,
        id: u64,
        quick: bool,
        now: Instant,
        out: &mut Vec<Command>,
    ) -> Phase {
        let failures = match self.nodes.get_mut(&id) {
            Some(h) => {
                h.failures = if quick { h.failures + 1 } else { 0 };
                h.failures
            }
            None => 0,
        };
        let pause = backoff(failures);
        if !pause.is_zero() {
            out.push(Command::Say(format!(
                "node {id} failed again within {HEALTHY_AFTER:?} of its restart: restarting it in {pause:?}"
            )));
        }
        Self::stop(now, now + pause, out)
    }

    fn restart_failed(
        &mut self,
        id: u64,
        why: &str,
        now: Instant,
        out: &mut Vec<Command>,
    ) -> Phase {
        let failures = match self.nodes.get_mut(&id) {
            Some(h) => {
                h.failures += 1;
                h.failures
            }
            None => 1,
        };
        let pause = backoff(failures);
        out.push(Command::Say(format!(
            "restarting node {id} failed, trying again in {pause:?}: {why}"
        )));
        Self::stop(now, now + pause, out)
    }

    fn stop(now: Instant, start_at: Instant, out: &mut Vec<Command>) -> Phase {
        out.push(Command::Terminate);
        Phase::Stopping {
            since: now,
            killed: false,
            start_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node and a clock the test moves.
    struct Rig {
        sup: Supervisor,
        now: Instant,
    }

    /// What changes from one observation to the next.
    #[derive(Default, Clone)]
    struct Seen {
        follower_exited: Option<&'static str>,
        server_exited: Option<&'static str>,
        exit_why: Option<&'static str>,
        replacement: Option<u64>,
        alive: bool,
        status: Option<NodeStatus>,
        accepts: bool,
    }

    fn status(role: &str, applied: u64, server_pid: u64) -> NodeStatus {
        NodeStatus {
            node: 2,
            role: role.into(),
            applied,
            server_pid,
            ..NodeStatus::default()
        }
    }

    /// A status that says the server must be rebuilt, and why.
    fn stale(why: &str) -> NodeStatus {
        let mut s = status("stale", 1, 0);
        s.stale_reason = Some(why.into());
        s
    }

    /// The follower exited (its server may run on).
    fn follower_down() -> Seen {
        Seen {
            follower_exited: Some(" (exit status: 1)"),
            ..Seen::default()
        }
    }

    impl Rig {
        fn new() -> Rig {
            let now = Instant::now();
            let mut sup = Supervisor::new();
            sup.watch(2, now);
            Rig { sup, now }
        }

        fn after(&mut self, d: Duration) -> &mut Rig {
            self.now += d;
            self
        }

        fn step(&mut self, seen: Seen) -> Vec<Command> {
            let accepts = seen.accepts;
            let accepts = move || accepts;
            let obs = Observation {
                now: self.now,
                follower_exited: seen.follower_exited.map(String::from),
                server_exited: seen.server_exited.map(String::from),
                exit_why: seen.exit_why.map(String::from),
                replacement: seen.replacement,
                alive: seen.alive,
                status: seen.status.map(Ok),
                accepts: &accepts,
            };
            self.sup.step(2, &obs)
        }

        fn phase(&self) -> Phase {
            self.sup.phase(2).cloned().unwrap()
        }

        /// Drives a stopped node through start-up until it is back.
        fn restart_to_running(&mut self) {
            let c = self.step(Seen::default());
            assert_eq!(c, [Command::Forget, Command::StartFollower]);
            let c = self.step(Seen {
                alive: true,
                status: Some(status("joining", 0, 0)),
                ..Seen::default()
            });
            assert_eq!(c, [Command::StartServer]);
            let c = self.step(Seen {
                alive: true,
                status: Some(status("backup", 5, 77)),
                accepts: true,
                ..Seen::default()
            });
            assert_eq!(c, [Command::Say("node 2 back as backup".into())]);
            assert!(matches!(self.phase(), Phase::Running { healed: true, .. }));
        }
    }

    fn says(c: &[Command], text: &str) -> bool {
        c.iter()
            .any(|c| matches!(c, Command::Say(m) if m.contains(text)))
    }

    #[test]
    fn backoff_doubles_from_one_second_up_to_the_cap() {
        let secs: Vec<u64> = (0..8).map(|f| backoff(f).as_secs()).collect();
        assert_eq!(secs, [0, 1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(backoff(u32::MAX), BACKOFF_CAP);
    }

    #[test]
    fn stale_reason_from_role_or_field() {
        let mut s = status("backup", 0, 1);
        assert_eq!(stale_reason(&s), None);
        s.role = "stale".into();
        assert_eq!(stale_reason(&s).as_deref(), Some("no reason given"));
        s.stale_reason = Some("its server (pid 7) exited".into());
        assert_eq!(
            stale_reason(&s).as_deref(),
            Some("its server (pid 7) exited")
        );
    }

    #[test]
    fn a_dead_follower_is_stopped_and_started_again_follower_first() {
        let mut r = Rig::new();
        let c = r.step(Seen {
            follower_exited: Some(" (signal: 9)"),
            alive: true,
            ..Seen::default()
        });
        assert!(says(&c, "node 2 is down (its follower exited (signal: 9))"));
        assert_eq!(c.last(), Some(&Command::Terminate));
        // Still stopping while anything lives, SIGKILL after the grace.
        let alive = Seen {
            alive: true,
            ..Seen::default()
        };
        assert!(r.step(alive.clone()).is_empty());
        assert_eq!(r.after(STOP_GRACE * 2).step(alive.clone()), [Command::Kill]);
        assert!(r.step(alive).is_empty(), "SIGKILL is sent once");
        r.restart_to_running();
    }

    #[test]
    fn both_processes_exiting_alike_are_said_in_one_line() {
        let mut r = Rig::new();
        let c = r.step(Seen {
            follower_exited: Some(" (signal: 9)"),
            server_exited: Some(" (signal: 9)"),
            ..Seen::default()
        });
        assert!(says(&c, "its server and follower exited (signal: 9)"));
    }

    #[test]
    fn a_server_gone_waits_for_stale_then_restarts_or_gives_up_after_the_grace() {
        let mut r = Rig::new();
        let gone = Seen {
            server_exited: Some(" (exit status: 1)"),
            alive: true,
            ..Seen::default()
        };
        assert!(r.step(gone.clone()).is_empty());
        assert!(matches!(r.phase(), Phase::ServerGone { .. }));
        assert!(r.sup.wants_status(2));
        // Not stale yet: keep waiting.
        let mut waiting = gone.clone();
        waiting.status = Some(status("backup", 1, 0));
        assert!(r.after(STALE_GRACE / 2).step(waiting).is_empty());
        // Stale: restart at once.
        let mut gone_stale = gone.clone();
        gone_stale.status = Some(stale("its server exited"));
        let c = r.step(gone_stale);
        assert!(says(
            &c,
            "node 2 is stale (its server exited): restarting it"
        ));
        assert_eq!(c.last(), Some(&Command::Terminate));

        // A follower that never says stale: restarted after the grace.
        let mut r = Rig::new();
        r.step(gone.clone());
        assert!(r.after(STALE_GRACE / 2).step(gone.clone()).is_empty());
        let c = r.after(STALE_GRACE).step(gone);
        assert!(says(&c, "did not report stale within"));
    }

    #[test]
    fn a_server_replaced_by_an_installed_snapshot_is_adopted_not_restarted() {
        let mut r = Rig::new();
        let c = r.step(Seen {
            server_exited: Some(" (exit status: 0)"),
            replacement: Some(4242),
            alive: true,
            ..Seen::default()
        });
        assert_eq!(c, [Command::Adopt(4242)]);
        assert!(matches!(r.phase(), Phase::Running { .. }));
        // Adopted after its server was declared gone: running again.
        let mut r = Rig::new();
        let gone = Seen {
            server_exited: Some(" (exit status: 0)"),
            alive: true,
            ..Seen::default()
        };
        r.step(gone.clone());
        let mut back = gone;
        back.replacement = Some(4243);
        assert_eq!(r.step(back), [Command::Adopt(4243)]);
        assert!(matches!(r.phase(), Phase::Running { healed: true, .. }));
    }

    #[test]
    fn staleness_of_a_running_node_restarts_it() {
        let mut r = Rig::new();
        let c = r.step(Seen {
            alive: true,
            status: Some(stale("its server executed seq 3 of view 2")),
            ..Seen::default()
        });
        assert!(says(&c, "is stale (its server executed seq 3 of view 2)"));
    }

    #[test]
    fn failures_soon_after_a_restart_back_off_and_a_healthy_run_resets_the_pause() {
        let mut r = Rig::new();
        let down = follower_down();
        // First failure of a node `up` started: at once.
        let c = r.step(down.clone());
        assert!(!says(&c, "failed again"));
        r.restart_to_running();
        // Fails again within HEALTHY_AFTER: 1 s, then 2 s.
        let c = r.after(Duration::from_secs(1)).step(down.clone());
        assert!(says(&c, "restarting it in 1s"));
        assert_eq!(r.step(Seen::default()), [Command::Forget]);
        assert!(matches!(r.phase(), Phase::Waiting { .. }));
        assert!(r.step(Seen::default()).is_empty());
        assert_eq!(
            r.after(Duration::from_secs(1)).step(Seen::default()),
            [Command::StartFollower]
        );
        r.step(Seen {
            alive: true,
            status: Some(status("joining", 0, 0)),
            ..Seen::default()
        });
        r.step(Seen {
            alive: true,
            status: Some(status("backup", 5, 77)),
            accepts: true,
            ..Seen::default()
        });
        let c = r.after(Duration::from_secs(1)).step(down.clone());
        assert!(says(&c, "restarting it in 2s"));
        // After a healthy run, the next failure restarts at once.
        let mut r = Rig::new();
        r.step(down.clone());
        r.restart_to_running();
        let c = r.after(HEALTHY_AFTER * 2).step(down);
        assert!(!says(&c, "failed again"));
        assert_eq!(c.last(), Some(&Command::Terminate));
    }

    #[test]
    fn a_start_that_fails_is_retried_with_a_growing_pause() {
        let mut r = Rig::new();
        r.step(follower_down());
        assert_eq!(
            r.step(Seen::default()),
            [Command::Forget, Command::StartFollower]
        );
        // The spawn itself failed.
        let c = r.sup.failed(2, "cannot spawn lockstep-follower", r.now);
        assert!(says(
            &c,
            "restarting node 2 failed, trying again in 1s: cannot spawn"
        ));
        assert_eq!(c.last(), Some(&Command::Terminate));
        assert_eq!(r.step(Seen::default()), [Command::Forget]);
        let c = r.after(Duration::from_secs(1)).step(Seen::default());
        assert_eq!(c, [Command::StartFollower]);
        // The follower exits while starting: the reason is its log's line.
        let c = r.step(Seen {
            exit_why: Some("its follower exited (exit status: 1): bad config"),
            ..Seen::default()
        });
        assert!(says(
            &c,
            "trying again in 2s: its follower exited (exit status: 1): bad config"
        ));
    }

    #[test]
    fn a_follower_that_never_answers_or_a_rebuild_that_stalls_fails_the_restart() {
        let mut r = Rig::new();
        r.step(follower_down());
        r.step(Seen::default());
        let silent = Seen {
            alive: true,
            ..Seen::default()
        };
        assert!(r.after(FOLLOWER_LIMIT / 2).step(silent.clone()).is_empty());
        let c = r.after(FOLLOWER_LIMIT).step(silent);
        assert!(says(&c, "its follower did not answer within"));

        let mut r = Rig::new();
        r.step(follower_down());
        r.step(Seen::default());
        r.step(Seen {
            alive: true,
            status: Some(status("joining", 0, 0)),
            ..Seen::default()
        });
        // Catching up: said once; progress keeps it going past the limit.
        let catching = |applied| Seen {
            alive: true,
            status: Some(status("catching-up", applied, 77)),
            accepts: true,
            ..Seen::default()
        };
        let c = r.step(catching(10));
        assert!(says(&c, "node 2 catching up"));
        assert!(r
            .after(REBUILD_STALL_LIMIT / 2)
            .step(catching(20))
            .is_empty());
        assert!(r
            .after(REBUILD_STALL_LIMIT / 2)
            .step(catching(30))
            .is_empty());
        // No progress for the limit: failed.
        let c = r.after(REBUILD_STALL_LIMIT * 2).step(catching(30));
        assert!(says(&c, "it applied nothing for"));
    }

    #[test]
    fn a_node_is_back_only_once_its_server_accepts_connections() {
        let mut r = Rig::new();
        r.step(follower_down());
        r.step(Seen::default());
        r.step(Seen {
            alive: true,
            status: Some(status("backup", 0, 0)),
            ..Seen::default()
        });
        let not_yet = Seen {
            alive: true,
            status: Some(status("backup", 1, 77)),
            accepts: false,
            ..Seen::default()
        };
        assert!(r.step(not_yet).is_empty());
        assert!(matches!(r.phase(), Phase::StartingServer { .. }));
        let c = r.step(Seen {
            alive: true,
            status: Some(stale("dropped input")),
            ..Seen::default()
        });
        assert!(says(&c, "it went stale while rebuilding (dropped input)"));
    }
}
