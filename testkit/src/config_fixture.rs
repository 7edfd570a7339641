//! The text of a three-node cluster config, as the unit tests and the
//! config checks use it: node N serves on 127.0.0.1:700N and is controlled
//! on 127.0.0.1:710N, after top-level lines of the caller's.

/// A three-node config text under construction.
#[derive(Clone, Debug)]
pub struct ThreeNodeConfig {
    top: String,
    apps: [String; 3],
    metrics: [Option<String>; 3],
}

impl ThreeNodeConfig {
    /// The config with `top` (top-level lines and sections such as
    /// `[election]`, each ending in a newline) before the `[[nodes]]`.
    pub fn new(top: &str) -> ThreeNodeConfig {
        ThreeNodeConfig {
            top: top.to_string(),
            apps: [1, 2, 3].map(|id| format!("127.0.0.1:700{id}")),
            metrics: [None, None, None],
        }
    }

    /// Node `id` (1..=3) serves at `addr` instead.
    pub fn app(mut self, id: usize, addr: &str) -> ThreeNodeConfig {
        self.apps[id - 1] = addr.to_string();
        self
    }

    /// Node `id` (1..=3) has a `metrics` endpoint at `addr`.
    pub fn metrics(mut self, id: usize, addr: &str) -> ThreeNodeConfig {
        self.metrics[id - 1] = Some(addr.to_string());
        self
    }

    /// The text: a blank first line, then the top lines, then the nodes.
    pub fn text(&self) -> String {
        let mut t = format!("\n{}", self.top);
        for (i, app) in self.apps.iter().enumerate() {
            let id = i + 1;
            t.push_str(&format!(
                "[[nodes]]\nid = {id}\napp = \"{app}\"\ncontrol = \"127.0.0.1:710{id}\"\n"
            ));
            if let Some(m) = &self.metrics[i] {
                t.push_str(&format!("metrics = \"{m}\"\n"));
            }
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_the_nodes_after_the_top_lines() {
        let t = ThreeNodeConfig::new("cluster = \"t\"\n")
            .app(3, "[::1]:7003")
            .metrics(2, "127.0.0.1:7202")
            .text();
        assert_eq!(
            t,
            r#"
cluster = "t"
[[nodes]]
id = 1
app = "127.0.0.1:7001"
control = "127.0.0.1:7101"
[[nodes]]
id = 2
app = "127.0.0.1:7002"
control = "127.0.0.1:7102"
metrics = "127.0.0.1:7202"
[[nodes]]
id = 3
app = "[::1]:7003"
control = "127.0.0.1:7103"
"#
        );
    }
}
