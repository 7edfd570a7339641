//! `lockstep check` run as a user would: the shipped examples pass and are
//! described in words; configs that `lockstep up` would fail on are caught
//! first, each problem one line naming its field and what is expected.

use lockstep_testkit::cluster;

use std::path::{Path, PathBuf};
use std::process::Command;

use cluster::bin_dir;
use lockstep_testkit::config_fixture::ThreeNodeConfig;

/// `lockstep check F`: exit code, stdout, stderr.
fn check(config: &Path) -> (i32, String, String) {
    let out = Command::new(bin_dir().join("lockstep"))
        .arg("check")
        .arg(config)
        .output()
        .expect("run lockstep check");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The config the variants start from (`DATA`: the data directory).
fn base() -> String {
    ThreeNodeConfig::new(
        r#"cluster = "chk"
data_dir = "DATA"
server = ["redis-server", "--port", "{port}", "--save", ""]
"#,
    )
    .metrics(2, "127.0.0.1:7202")
    .text()
}

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir() -> Dir {
    dir_named("cli")
}

/// A fresh directory of a test's own (the others remove theirs when done).
fn dir_named(tag: &str) -> Dir {
    let d = std::env::temp_dir().join(format!("lockstep-check-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Dir(d)
}

/// Checks `base()` with `from` replaced by `to`; returns (code, stdout, stderr).
fn check_variant(d: &Dir, name: &str, from: &str, to: &str) -> (i32, String, String) {
    let data = d.0.join("data");
    let base = base();
    let text = base
        .replace(from, to)
        .replace("DATA", &data.display().to_string());
    assert!(from.is_empty() || base.contains(from), "{from}");
    let path = d.0.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    check(&path)
}

#[test]
fn examples_pass_and_read_as_words() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut seen = 0;
    for e in std::fs::read_dir(&examples).unwrap().flatten() {
        let p = e.path();
        if p.extension().is_none_or(|x| x != "toml") {
            continue;
        }
        seen += 1;
        let (code, out, err) = check(&p);
        assert_eq!(code, 0, "{}: {out}{err}", p.display());
        assert!(out.contains(" is valid: cluster "), "{out}");
        assert!(out.contains("  node 1 "), "{out}");
        assert!(out.contains("  node 3 "), "{out}");
        for debug in [
            "Shm",
            "Tcp",
            "Zookeeper",
            "Static",
            "Some(",
            "None",
            "MemoryAck",
            "Allow",
        ] {
            assert!(!out.contains(debug), "{debug} in {}:\n{out}", p.display());
        }
    }
    assert!(seen >= 3, "examples found: {seen}");
}

#[test]
fn a_good_config_lists_its_nodes() {
    let d = dir();
    let (code, out, err) = check_variant(&d, "good", "", "");
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(
            "node 2     app 127.0.0.1:7002  control 127.0.0.1:7102  metrics 127.0.0.1:7202"
        ),
        "{out}"
    );
    assert!(out.contains("metrics none"), "{out}");
    assert!(
        out.contains("redis-server --port {port} --save ''"),
        "{out}"
    );
}

#[test]
fn mistakes_up_would_hit_are_caught_first() {
    let d = dir();
    let cases: [(&str, &str, &str, &[&str]); 6] = [
        (
            "nobin",
            "\"redis-server\", \"--port\"",
            "\"redis-servr\", \"--port\"",
            &["server[0]: program \"redis-servr\" not found on PATH"],
        ),
        (
            "noport",
            "\"--port\", \"{port}\"",
            "\"--port\", \"7000\"",
            &[
                "server: no argument holds {port}",
                "expected e.g. \"--port\", \"{port}\"",
            ],
        ),
        (
            "memcachedroot",
            "[\"redis-server\", \"--port\", \"{port}\", \"--save\", \"\"]",
            "[\"memcached\", \"-p\", \"{port}\"]",
            &["server: memcached refuses to run as root without -u"],
        ),
        (
            // Worker threads replicate; a backup's own clients cannot.
            "memcached4",
            "[\"redis-server\", \"--port\", \"{port}\", \"--save\", \"\"]",
            "[\"memcached\", \"-u\", \"root\", \"-t\", \"4\", \"-p\", \"{port}\"]\nbackup_clients = \"allow\"",
            &[
                "backup_clients: \"allow\" with memcached's 4 worker threads",
                "(expected backup_clients = \"deny\", or \"-t\", \"1\")",
            ],
        ),
        (
            "datadir",
            "data_dir = \"DATA\"",
            "data_dir = \"/proc/lockstep-check/data\"",
            &[
                "data_dir: cannot write in /proc:",
                "expected a writable directory",
            ],
        ),
        (
            "apptype",
            "app = \"127.0.0.1:7003\"",
            "app = 7911",
            &[
                "nodes[2].app: line 16: invalid type: integer `7911`",
                "socket address",
            ],
        ),
    ];
    for (name, from, to, want) in cases {
        let (code, out, err) = check_variant(&d, name, from, to);
        assert_eq!(code, 1, "{name}: {out}{err}");
        assert!(out.is_empty(), "{name}: printed a summary: {out}");
        for w in want {
            assert!(err.contains(w), "{name}: no {w:?} in:\n{err}");
        }
        for line in err.lines() {
            assert!(line.starts_with("lockstep: "), "{name}: {line}");
        }
    }
    // Two problems, two lines.
    let (code, _, err) = check_variant(
        &d,
        "two",
        "\"redis-server\", \"--port\", \"{port}\"",
        "\"redis-servr\", \"--port\", \"1\"",
    );
    assert_eq!(code, 1);
    assert_eq!(err.lines().count(), 2, "{err}");
}

/// A keyless config's key lives in data_dir: check names it in the summary,
/// creates nothing, and catches a key file others can read.
#[test]
fn the_generated_key_file_is_named_and_must_be_private() {
    use std::os::unix::fs::PermissionsExt;
    let d = dir_named("key");
    let data = d.0.join("data");
    let key = data.join("cluster.key");
    let (code, out, err) = check_variant(&d, "key", "", "");
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!("  key        {} (generated", key.display())),
        "{out}"
    );
    assert!(!key.exists(), "check created {}", key.display());

    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(&key, "0123456789abcdef0123456789abcdef\n").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).unwrap();
    let (code, out, err) = check_variant(&d, "key", "", "");
    assert_eq!(code, 1, "{out}{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("lockstep: ")
            && err.contains(&format!(
                ": key: cluster key {}: readable by group or others (mode 0640)",
                key.display()
            )),
        "{err}"
    );
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (code, out, err) = check_variant(&d, "key", "", "");
    assert_eq!(code, 0, "{out}{err}");
}

/// A configured `key_file` that group or others can read is refused, one
/// line naming the file and the fix, by `check`, `up`, `status` and the
/// follower alike; at mode 0600 `check` passes.
#[test]
fn a_key_file_others_can_read_is_refused_everywhere() {
    use std::os::unix::fs::PermissionsExt;
    let d = dir_named("keyfile");
    let key = d.0.join("cluster-shared.key");
    std::fs::write(&key, "0123456789abcdef0123456789abcdef\n").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let text = base()
        .replace("DATA", &d.0.join("data").display().to_string())
        .replace(
            "cluster = \"chk\"",
            &format!("cluster = \"chk\"\nkey_file = \"{}\"", key.display()),
        );
    let config = d.0.join("keyfile.toml");
    std::fs::write(&config, text).unwrap();
    let want = format!(
        "key_file: cluster key {k}: readable by group or others (mode 0644): run `chmod 600 {k}`",
        k = key.display()
    );
    let bins = bin_dir();
    let c = config.display().to_string();
    let runs: [(&str, Vec<&str>); 4] = [
        ("lockstep", vec!["check", &c]),
        ("lockstep", vec!["up", &c]),
        ("lockstep", vec!["status", "--config", &c]),
        ("lockstep-follower", vec!["--config", &c, "--node", "1"]),
    ];
    for (bin, args) in runs {
        let out = Command::new(bins.join(bin))
            .args(&args)
            .output()
            .expect("run lockstep");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bin} {args:?} accepted it: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{bin} {args:?}: {err}");
        assert!(err.contains(&want), "{bin} {args:?}: {err}");
    }
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (code, out, err) = check(&config);
    assert_eq!(code, 0, "{out}{err}");
}

/// `lockstep status` before the first `up` (no data_dir, so no generated
/// key yet): one line saying so, then every node down with how to start
/// it, exit 1 — and it creates nothing.
#[test]
fn status_before_the_first_up_says_no_node_runs() {
    let d = dir_named("never");
    let data = d.0.join("data");
    let mut text = base().replace("DATA", &data.display().to_string());
    let mut controls = Vec::new();
    for id in 1..=3 {
        // Free ports: nothing of another test answers there.
        let control = format!("127.0.0.1:{}", cluster::free_port());
        text = text.replace(&format!("\"127.0.0.1:710{id}\""), &format!("\"{control}\""));
        controls.push(control);
    }
    let config = d.0.join("never.toml");
    std::fs::write(&config, text).unwrap();
    let run = |json: bool| {
        let mut cmd = Command::new(bin_dir().join("lockstep"));
        cmd.arg("status").arg("--config").arg(&config);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().expect("run lockstep status");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let note = format!(
        "lockstep: no cluster key at {} yet: no node of this cluster has started here",
        data.join("cluster.key").display()
    );
    let (code, out, err) = run(false);
    assert_eq!(code, 1, "{out}{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with(&note), "{err}");
    for (i, control) in controls.iter().enumerate() {
        assert!(
            out.contains(&format!(
                "node {} is down: the follower is not running (nothing listens on {control})",
                i + 1
            )),
            "{out}"
        );
    }
    assert!(
        out.contains("NOT OK: no leader with a live majority"),
        "{out}"
    );
    let (code, out, err) = run(true);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.starts_with(&note), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("status --json");
    assert_eq!(v["healthy"], false, "{v}");
    let nodes = v["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 3, "{v}");
    assert!(
        nodes
            .iter()
            .all(|n| n["up"] == false && n["role"] == "down"),
        "{v}"
    );
    assert!(!data.exists(), "status created {}", data.display());
}

/// `lockstep check F ARGS…`: exit code, stdout, stderr.
fn check_with(config: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin_dir().join("lockstep"))
        .arg("check")
        .arg(config)
        .args(args)
        .output()
        .expect("run lockstep check");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `base()` with `top` added and every node address (app, control, node
/// 2's metrics) on a free loopback port; the config's path and node N's
/// app address.
fn on_free_ports(d: &Dir, name: &str, top: &str) -> (PathBuf, Vec<String>) {
    let mut text = base()
        .replace("DATA", &d.0.join("data").display().to_string())
        .replacen("[[nodes]]", &format!("{top}[[nodes]]"), 1);
    let mut apps = Vec::new();
    for old in [
        "127.0.0.1:7001",
        "127.0.0.1:7002",
        "127.0.0.1:7003",
        "127.0.0.1:7101",
        "127.0.0.1:7102",
        "127.0.0.1:7103",
        "127.0.0.1:7202",
    ] {
        let new = format!("127.0.0.1:{}", cluster::free_port());
        assert!(text.contains(&format!("\"{old}\"")), "{old}");
        text = text.replace(&format!("\"{old}\""), &format!("\"{new}\""));
        if old.starts_with("127.0.0.1:700") {
            apps.push(new);
        }
    }
    let path = d.0.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    (path, apps)
}

/// A node address in use on this host: an error for the node about to be
/// started (`--node`), a warning in the summary otherwise.
#[test]
fn a_port_in_use_is_reported() {
    let d = dir_named("ports");
    let (config, apps) = on_free_ports(&d, "ports", "");
    let (code, out, err) = check_with(&config, &["--node", "2"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("  ports      every node address of this host is free (7 checked)"),
        "{out}"
    );
    let taken = std::net::TcpListener::bind(&apps[1]).expect("node 2's free app port");
    let what = format!("node 2: app {} in use: a program listens on it", apps[1]);
    let (code, out, err) = check_with(&config, &["--node", "2"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.is_empty(), "printed a summary: {out}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("lockstep: ")
            && err.contains(&what)
            && err.contains("node 2's server runs already, or another program holds its port"),
        "{err}"
    );
    for args in [&[][..], &["--node", "1"][..]] {
        let (code, out, err) = check_with(&config, args);
        assert_eq!(code, 0, "{args:?}: {out}{err}");
        assert!(
            out.contains(&format!(
                "  ports      warning: {what} (node 2 runs, or another program holds its port)"
            )),
            "{args:?}: {out}"
        );
        assert!(!out.contains("every node address"), "{out}");
    }
    drop(taken);
    let (code, out, err) = check_with(&config, &["--node", "4"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("node 4 is not in the config"), "{err}");
}

/// With `election.mode = "zookeeper"`, a ZooKeeper nobody runs (a loopback
/// port nothing listens on) is a warning, and an error for a node about to
/// be started by hand; a real one is said to serve.
#[test]
fn zookeeper_is_asked_whether_it_serves() {
    let d = dir_named("zk");
    let nobody = format!("127.0.0.1:{}", cluster::free_port());
    let (config, _) = on_free_ports(
        &d,
        "nozk",
        &format!("[election]\nmode = \"zookeeper\"\nzookeeper = \"{nobody}\"\n"),
    );
    let (code, out, err) = check_with(&config, &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!(
            "  zookeeper  warning: nothing answers at {nobody} ("
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!("`lockstep up` starts a private one at {nobody}")),
        "{out}"
    );
    let (code, out, err) = check_with(&config, &["--node", "3"]);
    assert_eq!(code, 1, "{out}{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!(
            "election.zookeeper: no ZooKeeper answers at {nobody}: node 3's follower cannot start without one"
        )),
        "{err}"
    );

    let zk = lockstep_launcher::zookeeper::ZookeeperServer::start_on_free_port(
        &d.0.join("zookeeper"),
        cluster::free_port,
    )
    .expect("start ZooKeeper");
    let (config, _) = on_free_ports(
        &d,
        "zk",
        &format!(
            "[election]\nmode = \"zookeeper\"\nzookeeper = \"{}\"\n",
            zk.addr()
        ),
    );
    let (code, out, err) = check_with(&config, &["--node", "3"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!(
            "  zookeeper  {} serves (standalone, ZooKeeper ",
            zk.addr()
        )),
        "{out}"
    );
    assert!(!out.contains("warning"), "{out}");
}
