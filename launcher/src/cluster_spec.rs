//! A local cluster's config, built in code: what the benchmarks, the tests
//! and their fixtures write before they start a cluster — its name and
//! data dir, its settings (transport, commit, ring size, …), its election
//! (a static leader or ZooKeeper) and its nodes (free loopback ports, or
//! given addresses: one per network namespace).
//!
//! ```
//! use lockstep_launcher::cluster_spec::ClusterSpec;
//! let spec = ClusterSpec::new("demo", std::path::Path::new("/tmp/demo/data"))
//!     .set("transport", "shm")
//!     .loopback_nodes(3, false)
//!     .unwrap();
//! let config = lockstep_common::Config::parse(&spec.text()).unwrap();
//! assert_eq!(config.nodes.len(), 3);
//! ```

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

use anyhow::Context;

use crate::ports;

/// One node's addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpec {
    /// Its id (1, 2, …).
    pub id: u64,
    /// Where its server listens.
    pub app: SocketAddr,
    /// Its follower's control channel.
    pub control: SocketAddr,
    /// Its follower's metrics endpoint, if any.
    pub metrics: Option<SocketAddr>,
    /// Its follower's Sentinel endpoint, if any.
    pub sentinel: Option<SocketAddr>,
}

/// How the cluster elects its leader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ElectionSpec {
    /// Node `leader` leads view 1; no failover.
    Static {
        /// The leader's id.
        leader: u64,
    },
    /// Through ZooKeeper at `connect`.
    ZooKeeper {
        /// The connect string.
        connect: String,
        /// The session timeout.
        session_timeout_ms: u64,
    },
}

/// A cluster config under construction.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    /// Top-level settings, in order: (key, TOML value as written).
    settings: Vec<(String, String)>,
    /// Sections after the settings (each line ending in a newline).
    sections: String,
    election: ElectionSpec,
    nodes: Vec<NodeSpec>,
}

impl ClusterSpec {
    /// A cluster named `name` keeping its data in `data_dir`, with a static
    /// leader 1 and no nodes yet.
    pub fn new(name: &str, data_dir: &Path) -> ClusterSpec {
        ClusterSpec {
            settings: Vec::new(),
            sections: String::new(),
            election: ElectionSpec::Static { leader: 1 },
            nodes: Vec::new(),
        }
        .set("cluster", name)
        .set("data_dir", &data_dir.display().to_string())
    }

    /// Sets top-level `key` to the string `value` (replacing an earlier
    /// setting of it).
    pub fn set(self, key: &str, value: &str) -> ClusterSpec {
        self.set_raw(key, &quoted(value))
    }

    /// Sets top-level `key` to `value` as TOML writes it (a number, an
    /// array: `["redis-server", "--port", "{port}"]`).
    pub fn set_raw(mut self, key: &str, value: &str) -> ClusterSpec {
        match self.settings.iter_mut().find(|(k, _)| k == key) {
            Some(s) => s.1 = value.to_string(),
            None => self.settings.push((key.to_string(), value.to_string())),
        }
        self
    }

    /// Removes top-level `key`.
    pub fn unset(mut self, key: &str) -> ClusterSpec {
        self.settings.retain(|(k, _)| k != key);
        self
    }

    /// Sets top-level `key` to an array of strings.
    pub fn set_list<S: AsRef<str>>(self, key: &str, values: &[S]) -> ClusterSpec {
        let items: Vec<String> = values.iter().map(|v| quoted(v.as_ref())).collect();
        self.set_raw(key, &format!("[{}]", items.join(", ")))
    }

    /// Sets each line of `lines` (`key = value`, as TOML writes them; empty
    /// lines ignored): a caller's own additions, e.g. a test's options.
    pub fn set_lines(mut self, lines: &str) -> ClusterSpec {
        for line in lines.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let (k, v) = line.split_once('=').unwrap_or((line, ""));
            self = self.set_raw(k.trim(), v.trim());
        }
        self
    }

    /// Adds a section (e.g. `"[snapshot_every]\nentries = 5000\n"`).
    pub fn section(mut self, text: &str) -> ClusterSpec {
        self.sections.push_str(text);
        if !text.ends_with('\n') {
            self.sections.push('\n');
        }
        self
    }

    /// Elects this way.
    pub fn election(mut self, election: ElectionSpec) -> ClusterSpec {
        self.election = election;
        self
    }

    /// Adds `n` nodes on free loopback ports (and a metrics port each when
    /// `metrics`).
    pub fn loopback_nodes(mut self, n: u64, metrics: bool) -> anyhow::Result<ClusterSpec> {
        let port = || {
            ports::try_free_port()
                .map(|p| SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), p))
                .context("no free loopback port outside the ephemeral range")
        };
        for _ in 0..n {
            let id = self.nodes.len() as u64 + 1;
            let node = NodeSpec {
                id,
                app: port()?,
                control: port()?,
                metrics: if metrics { Some(port()?) } else { None },
                sentinel: None,
            };
            self.nodes.push(node);
        }
        Ok(self)
    }

    /// Adds one node per address in `ips`, each serving on `app_port` and
    /// controlled on `control_port` (one network namespace per node).
    pub fn nodes_at(mut self, ips: &[IpAddr], app_port: u16, control_port: u16) -> ClusterSpec {
        for ip in ips {
            let id = self.nodes.len() as u64 + 1;
            self.nodes.push(NodeSpec {
                id,
                app: SocketAddr::new(*ip, app_port),
                control: SocketAddr::new(*ip, control_port),
                metrics: None,
                sentinel: None,
            });
        }
        self
    }

    /// The nodes so far.
    pub fn nodes(&self) -> &[NodeSpec] {
        &self.nodes
    }

    /// The nodes so far, to change their addresses.
    pub fn nodes_mut(&mut self) -> &mut [NodeSpec] {
        &mut self.nodes
    }

    /// The config text.
    pub fn text(&self) -> String {
        let mut t = String::new();
        for (k, v) in &self.settings {
            let _ = writeln!(t, "{k} = {v}");
        }
        t.push_str(&self.sections);
        match &self.election {
            ElectionSpec::Static { leader } => {
                let _ = write!(t, "[election]\nmode = \"static\"\nleader = {leader}\n");
            }
            ElectionSpec::ZooKeeper {
                connect,
                session_timeout_ms,
            } => {
                let _ = write!(
                    t,
                    "[election]\nmode = \"zookeeper\"\nzookeeper = {}\nsession_timeout_ms = {session_timeout_ms}\n",
                    quoted(connect)
                );
            }
        }
        for n in &self.nodes {
            let _ = write!(
                t,
                "[[nodes]]\nid = {}\napp = \"{}\"\ncontrol = \"{}\"\n",
                n.id, n.app, n.control
            );
            if let Some(m) = n.metrics {
                let _ = writeln!(t, "metrics = \"{m}\"");
            }
            if let Some(a) = n.sentinel {
                let _ = writeln!(t, "sentinel = \"{a}\"");
            }
        }
        t
    }

    /// Writes the config text to `path`.
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        std::fs::write(path, self.text())
            .with_context(|| format!("cannot write {}", path.display()))
    }
}

/// `s` as a TOML basic string.
fn quoted(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            '\n' => q.push_str("\\n"),
            '\t' => q.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(q, "\\u{:04X}", c as u32);
            }
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_common::config::ElectionMode;
    use lockstep_common::Config;

    #[test]
    fn a_spec_is_a_valid_config_with_what_was_asked() {
        let spec = ClusterSpec::new("t", Path::new("/tmp/lockstep-spec"))
            .set("transport", "tcp")
            .set("key", "k-0123456789abcdef")
            .set("transport", "shm")
            .set_list("server", &["redis-server", "--port", "{port}"])
            .set_lines("ring_size = \"8MiB\"\n\ncommit = \"input\"\n")
            .section("[snapshot_every]\nentries = 5000")
            .election(ElectionSpec::ZooKeeper {
                connect: "127.0.0.1:2181".into(),
                session_timeout_ms: 1500,
            })
            .loopback_nodes(3, true)
            .unwrap();
        let c = Config::parse(&spec.text()).unwrap();
        assert_eq!(c.cluster, "t");
        assert_eq!(c.nodes.len(), 3);
        assert_eq!(c.election.mode, ElectionMode::Zookeeper);
        assert_eq!(c.election.session_timeout_ms, 1500);
        assert_eq!(
            c.server.as_deref(),
            Some(&["redis-server".to_string(), "--port".into(), "{port}".into()][..])
        );
        assert_eq!(
            spec.text().matches("transport =").count(),
            1,
            "set replaces"
        );
        for (n, s) in c.nodes.iter().zip(spec.nodes()) {
            assert_eq!(
                (n.id, n.app, n.control, n.metrics, n.sentinel),
                (s.id, s.app, s.control, s.metrics, s.sentinel)
            );
        }
    }

    #[test]
    fn nodes_at_given_addresses_and_odd_strings_survive() {
        let ips: Vec<IpAddr> = ["127.0.0.2", "127.0.0.3"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let spec = ClusterSpec::new("q", Path::new("/tmp/q\"uote\\d"))
            .election(ElectionSpec::Static { leader: 2 })
            .nodes_at(&ips, 7000, 7100);
        let mut spec = spec.set("key", "gone-0123456789abcdef").unset("key");
        spec.nodes_mut()[0].sentinel = Some("127.0.0.2:26379".parse().unwrap());
        let c = Config::parse(&spec.text()).unwrap();
        assert!(c.key.is_none());
        assert_eq!(
            c.nodes[0].sentinel,
            Some("127.0.0.2:26379".parse().unwrap())
        );
        assert_eq!(c.data_dir, Path::new("/tmp/q\"uote\\d"));
        assert_eq!(c.election.leader, 2);
        assert_eq!(c.nodes[1].app, "127.0.0.3:7000".parse().unwrap());
        assert_eq!(c.nodes[1].control, "127.0.0.3:7100".parse().unwrap());
    }
}
