//! The cluster config: one TOML file for the whole cluster, read by the
//! preload (`LOCKSTEP_CONFIG`), the follower (`--config`) and the CLI.
//!
//! Every error is one line that names the field at fault.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::Deserialize;

use crate::region::{RegionSpec, MAX_NODES};

/// Smallest ring accepted.
pub const MIN_RING: u64 = 1 << 20;
/// Largest ring accepted (the region is one file in `/dev/shm`, mapped by
/// the follower and the server).
pub const MAX_RING: u64 = 64 << 30;
/// Largest `max_entry` accepted: an entry travels whole in one control
/// frame when a node catches up ([`crate::control::MAX_FRAME`]) and in one
/// buffer the preload allocates inside the server.
pub const MAX_ENTRY: u64 = 16 << 20;
/// Range of `election.session_timeout_ms`.
pub const SESSION_TIMEOUT_MS: std::ops::RangeInclusive<u64> = 100..=600_000;

/// What a redis-server replica that lockstep starts itself (benchmarks,
/// tests) gets besides its address: no persistence of its own (the log is
/// the state) and `DEBUG DIGEST` for comparing replicas.
pub const REDIS_REPLICA_ARGS: [&str; 6] = [
    "--save",
    "",
    "--appendonly",
    "no",
    "--enable-debug-command",
    "yes",
];

/// One-sided write transport between nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    /// All nodes on one host; writers map each other's region files.
    Shm,
    /// Emulated RNIC: region servers apply writes sent over TCP.
    Tcp,
    /// RDMA verbs (cargo feature `rdma`, needs a device).
    Rdma,
}

/// When a follower acknowledges an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Durability {
    /// Written to RocksDB without fsync: survives process crashes (APUS).
    MemoryAck,
    /// Group-committed fsync before the ack: survives power loss.
    Fsync,
}

/// When the leader's server may act on an input (see
/// docs/concepts/commit-disciplines.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CommitMode {
    /// Output commit (default): the server reads each input at once; every
    /// externally visible act on a client connection (write, send, close,
    /// shutdown) waits until a majority stored every input appended so far.
    Output,
    /// Input commit (APUS): the server sees an input only once a majority
    /// stored it.
    Input,
}

/// Whether a backup's server accepts clients other than the replay stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackupClients {
    /// Close other clients at once (default).
    Deny,
    /// Let them through (monitoring; their writes are NOT replicated).
    Allow,
}

/// The wire protocol of the replicated server, for the one reply a backup
/// gives a client it refuses (`backup_clients = "deny"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// RESP: `-READONLY …` naming the leader's address.
    Redis,
    /// Memcached text protocol: `SERVER_ERROR …` naming the leader's address.
    Memcached,
    /// Unknown (default): the connection is closed without a reply.
    Other,
}

impl Protocol {
    /// The line a refused client of a backup reads before the connection
    /// closes (None: close without a reply).
    pub fn refusal(self, leader: Option<SocketAddr>) -> Option<Vec<u8>> {
        let at = match leader {
            Some(a) => format!("the leader is at {a}"),
            None => "no leader is known now".to_string(),
        };
        match self {
            Protocol::Redis => Some(format!("-READONLY lockstep backup; {at}\r\n").into_bytes()),
            Protocol::Memcached => {
                Some(format!("SERVER_ERROR lockstep backup; {at}\r\n").into_bytes())
            }
            Protocol::Other => None,
        }
    }
}

/// Whether backups take snapshots of their server (`snapshot`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotMode {
    /// Process images (default where the machine supports them): the log
    /// below a snapshot a majority holds is deleted, a restarted node
    /// replays only the entries after its newest snapshot.
    Process,
    /// None: the log is kept whole and replayed whole.
    Off,
}

/// How much log between two snapshots (`snapshot_every`): a snapshot is
/// due once either measure is reached (0: that measure is off) and the
/// log since the newest snapshot has grown to `image_percent` of that
/// snapshot's image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotEvery {
    /// Entries since the newest snapshot.
    pub entries: u64,
    /// Bytes of encoded entries since the newest snapshot.
    pub bytes: u64,
    /// Bytes of encoded entries since the newest snapshot, in percent of
    /// that snapshot's image (0: off). Imaging costs about the image's
    /// size however much log it replaces: a log at least this share of it
    /// keeps a snapshot's cost per entry the same with any dataset (Redis
    /// rewrites its AOF by the same rule, `auto-aof-rewrite-percentage`).
    pub image_percent: u64,
}

impl SnapshotEvery {
    /// Bytes of log that the image rule asks for after a snapshot whose
    /// image is `image_bytes` (0 with no image or the rule off).
    pub fn image_share(&self, image_bytes: u64) -> u64 {
        (image_bytes as u128 * self.image_percent as u128 / 100).min(u64::MAX as u128) as u64
    }
}

/// Restart replay runs about 300k entries/s (`lockstep bench follower`):
/// a snapshot every 250k entries keeps the replay of a restart under a
/// second.
pub const DEFAULT_SNAPSHOT_EVERY: SnapshotEvery = SnapshotEvery {
    entries: 250_000,
    bytes: 256 << 20,
    image_percent: 100,
};
/// The largest `snapshot_every.image_percent`: a log a thousand times its
/// server's image is replay no restart should face.
pub const MAX_SNAPSHOT_IMAGE_PERCENT: u64 = 100_000;
/// Fewer entries than this between snapshots would spend the backups'
/// time imaging their server rather than applying.
pub const MIN_SNAPSHOT_ENTRIES: u64 = 1000;
/// The smallest byte measure between snapshots.
pub const MIN_SNAPSHOT_BYTES: u64 = 1 << 20;
/// `snapshot_degraded_after`'s default: a node whose log holds more than
/// this many times `snapshot_every` is degraded. With snapshots working a
/// node's log stays within about two (the majority's snapshot lags the
/// newest by one), so eight means several missed in a row; with the
/// defaults, 2M entries, about 7 s of replay at restart.
pub const DEFAULT_SNAPSHOT_DEGRADED_AFTER: u64 = 8;
/// The smallest nonzero `snapshot_degraded_after`: below it a node whose
/// snapshots keep their cadence would read as degraded.
pub const MIN_SNAPSHOT_DEGRADED_AFTER: u64 = 3;

#[derive(Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSnapshotEvery {
    #[serde(default)]
    entries: Option<u64>,
    #[serde(default)]
    bytes: Option<Size>,
    #[serde(default)]
    image_percent: Option<u64>,
}

/// Checks `snapshot_every`: each measure 0 (off) or at least its minimum,
/// not both off, the image share at most its maximum; absent keys take
/// the defaults.
fn check_snapshot_every(raw: RawSnapshotEvery) -> Result<SnapshotEvery, String> {
    let entries = raw.entries.unwrap_or(DEFAULT_SNAPSHOT_EVERY.entries);
    let bytes = raw.bytes.map_or(DEFAULT_SNAPSHOT_EVERY.bytes, |b| b.0);
    let image_percent = raw
        .image_percent
        .unwrap_or(DEFAULT_SNAPSHOT_EVERY.image_percent);
    if image_percent > MAX_SNAPSHOT_IMAGE_PERCENT {
        return Err(format!(
            "snapshot_every.image_percent: {image_percent} is above {MAX_SNAPSHOT_IMAGE_PERCENT} (0 turns the image rule off)"
        ));
    }
    if entries != 0 && entries < MIN_SNAPSHOT_ENTRIES {
        return Err(format!(
            "snapshot_every.entries: {entries} is below {MIN_SNAPSHOT_ENTRIES} (0 turns the entry measure off)"
        ));
    }
    if bytes != 0 && bytes < MIN_SNAPSHOT_BYTES {
        return Err(format!(
            "snapshot_every.bytes: {bytes} bytes is below 1MiB (0 turns the byte measure off)"
        ));
    }
    if entries == 0 && bytes == 0 {
        return Err(
            "snapshot_every: entries and bytes are both 0, so no snapshot would ever be due (use snapshot = \"off\" for that)"
                .into(),
        );
    }
    Ok(SnapshotEvery {
        entries,
        bytes,
        image_percent,
    })
}

/// How the leader is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ElectionMode {
    /// `election.leader` leads view 1 forever.
    Static,
    /// Leader elected through ZooKeeper.
    Zookeeper,
}

/// `[election]`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Election {
    /// static | zookeeper.
    #[serde(default = "default_mode")]
    pub mode: ElectionMode,
    /// Leader of view 1 in static mode.
    #[serde(default = "default_leader")]
    pub leader: u64,
    /// ZooKeeper connect string.
    #[serde(default = "default_zk")]
    pub zookeeper: String,
    /// ZooKeeper session timeout.
    #[serde(default = "default_session")]
    pub session_timeout_ms: u64,
}

fn default_mode() -> ElectionMode {
    ElectionMode::Static
}
fn default_leader() -> u64 {
    1
}
fn default_zk() -> String {
    "127.0.0.1:2181".into()
}
fn default_session() -> u64 {
    2000
}

impl Default for Election {
    fn default() -> Self {
        Election {
            mode: default_mode(),
            leader: default_leader(),
            zookeeper: default_zk(),
            session_timeout_ms: default_session(),
        }
    }
}

/// `[[nodes]]`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    /// Node id, 1..=15.
    pub id: u64,
    /// Where this node's server listens.
    pub app: SocketAddr,
    /// This node's follower: control channel and region server.
    pub control: SocketAddr,
    /// Prometheus metrics (HTTP), if wanted.
    #[serde(default)]
    pub metrics: Option<SocketAddr>,
    /// Redis Sentinel protocol (the cluster name is the master name), if
    /// wanted: Sentinel clients find the leader here.
    #[serde(default)]
    pub sentinel: Option<SocketAddr>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    cluster: String,
    #[serde(default = "default_transport")]
    transport: TransportKind,
    #[serde(default)]
    ring_size: Option<Size>,
    data_dir: PathBuf,
    #[serde(default)]
    max_entry: Option<Size>,
    #[serde(default = "default_durability")]
    durability: Durability,
    #[serde(default = "default_backup_clients")]
    backup_clients: BackupClients,
    #[serde(default = "default_protocol")]
    protocol: Protocol,
    #[serde(default = "default_commit")]
    commit: CommitMode,
    #[serde(default = "default_max_apply_lag")]
    max_apply_lag: u64,
    #[serde(default = "default_snapshot")]
    snapshot: SnapshotMode,
    #[serde(default)]
    snapshot_every: RawSnapshotEvery,
    #[serde(default = "default_snapshot_degraded_after")]
    snapshot_degraded_after: u64,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    key_file: Option<PathBuf>,
    #[serde(default)]
    server: Option<Vec<String>>,
    #[serde(default)]
    election: Election,
    #[serde(default)]
    nodes: Vec<Node>,
}

fn default_transport() -> TransportKind {
    TransportKind::Shm
}
fn default_durability() -> Durability {
    Durability::MemoryAck
}
fn default_backup_clients() -> BackupClients {
    BackupClients::Deny
}
fn default_protocol() -> Protocol {
    Protocol::Other
}
fn default_commit() -> CommitMode {
    CommitMode::Output
}
/// Backups apply ~100k entries/s here (`lockstep bench follower`): half a
/// second of backlog at most for the new leader of a failover.
pub const DEFAULT_MAX_APPLY_LAG: u64 = 50_000;
fn default_max_apply_lag() -> u64 {
    DEFAULT_MAX_APPLY_LAG
}
fn default_snapshot() -> SnapshotMode {
    SnapshotMode::Process
}
fn default_snapshot_degraded_after() -> u64 {
    DEFAULT_SNAPSHOT_DEGRADED_AFTER
}

/// `path` made absolute: against `base` (the config file's directory)
/// when given, else against the current directory. Every process of a node
/// sees the same `data_dir` whatever its own working directory (CRIU runs
/// in the snapshot's directory: a relative path broke every dump).
fn absolute(path: &Path, base: Option<&Path>) -> PathBuf {
    if path.is_absolute() {
        return path.to_path_buf();
    }
    let base = match base {
        Some(b) if b.is_absolute() => b.to_path_buf(),
        Some(b) => std::env::current_dir()
            .map(|d| d.join(b))
            .unwrap_or_else(|_| b.to_path_buf()),
        None => std::env::current_dir().unwrap_or_default(),
    };
    base.join(path)
}

/// A byte size: an integer or a string like "64MiB".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Size(u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a byte count or a string such as \"64MiB\"")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Size, E> {
                Ok(Size(n))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Size, E> {
                u64::try_from(n)
                    .map(Size)
                    .map_err(|_| E::custom(format!("{n} is negative: a size is a byte count")))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Size, E> {
                parse_size(s).map(Size).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// Parses "4096", "64KiB", "64MiB", "1GiB" (also KB/MB/GB as binary units).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (use e.g. \"64MiB\")"))?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KB" | "KiB" => 1 << 10,
        "M" | "MB" | "MiB" => 1 << 20,
        "G" | "GB" | "GiB" => 1 << 30,
        other => return Err(format!("unknown size unit {other:?} in {s:?}")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// Checks `ring_size` (a power of two in `MIN_RING..=MAX_RING`) and
/// `max_entry` (at least 1 byte, at most [`MAX_ENTRY`], an entry of that
/// size at most a quarter of the ring); returns `max_entry` or one line
/// naming the field.
pub fn check_sizes(ring_size: u64, max_entry: u64) -> Result<u32, String> {
    if !ring_size.is_power_of_two() {
        return Err(format!(
            "ring_size: {ring_size} bytes is not a power of two"
        ));
    }
    if ring_size < MIN_RING {
        return Err(format!(
            "ring_size: {ring_size} bytes is below the minimum of {} (1 MiB)",
            MIN_RING
        ));
    }
    if ring_size > MAX_RING {
        return Err(format!(
            "ring_size: {ring_size} bytes is above the maximum of {MAX_RING} (64 GiB)"
        ));
    }
    if max_entry == 0 {
        return Err("max_entry: must be at least 1 byte".into());
    }
    // The footprint (header, payload, canary) of the largest entry must
    // leave room for three more in the ring (the first test keeps the
    // footprint's arithmetic far from overflowing).
    if max_entry > ring_size / 4
        || crate::entry::footprint(max_entry as usize) as u64 > ring_size / 4
    {
        return Err(format!(
            "max_entry: {max_entry} bytes is above ring_size/4 ({} bytes, less an entry's header and canary)",
            ring_size / 4
        ));
    }
    if max_entry > MAX_ENTRY {
        return Err(format!(
            "max_entry: {max_entry} bytes is above the maximum of {MAX_ENTRY} (16 MiB: an entry must fit one control frame)"
        ));
    }
    u32::try_from(max_entry).map_err(|_| format!("max_entry: {max_entry} bytes is above u32::MAX"))
}

/// The largest char boundary at or below `i`.
fn floor_char_boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The dotted name of the field whose value starts at byte `at` of the
/// TOML `text` (`nodes.app` for `app = 7911` under `[[nodes]]`), when `at`
/// lies after a `key =` on its line; None otherwise (e.g. the span is a
/// key itself, or a value continued from an earlier line).
fn field_at(text: &str, at: usize) -> Option<String> {
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let before = &text[line_start..at];
    let eq = before.rfind('=')?;
    let key_part = &before[..eq];
    let key = key_part
        .rsplit(['{', ','])
        .next()
        .unwrap_or(key_part)
        .trim()
        .trim_matches('"');
    let simple = |k: &str| {
        !k.is_empty()
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
    };
    if !simple(key) {
        return None;
    }
    // Inside an inline table: `election = { mode = 7 }`.
    let inline = key_part.rfind('{').and_then(|b| {
        let outer = &key_part[..b];
        let oeq = outer.rfind('=')?;
        let k = outer[..oeq].trim();
        simple(k).then(|| k.to_string())
    });
    // The table the line is in; for an array of tables (`[[nodes]]`) with
    // the index of this one: `nodes[1]` is the second `[[nodes]]`.
    let header = text[..line_start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['));
    let table = header.and_then(|h| {
        let name = h.trim_matches(|c| c == '[' || c == ']').trim().to_string();
        if !simple(&name) {
            return None;
        }
        if !h.starts_with("[[") {
            return Some(name);
        }
        let index = text[..line_start]
            .lines()
            .filter(|l| l.trim() == h)
            .count()
            .saturating_sub(1);
        Some(format!("{name}[{index}]"))
    });
    let mut path: Vec<String> = Vec::new();
    path.extend(table);
    path.extend(inline);
    path.push(key.to_string());
    Some(path.join("."))
}

/// A validated cluster config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Cluster name: names region files and znodes.
    pub cluster: String,
    /// Transport between nodes.
    pub transport: TransportKind,
    /// Ring size in bytes (power of two, at least 1 MiB).
    pub ring_size: u64,
    /// Data directory; node N keeps its RocksDB in `<data_dir>/node-N`.
    pub data_dir: PathBuf,
    /// Largest payload of one entry; longer reads are split.
    pub max_entry: u32,
    /// When followers ack.
    pub durability: Durability,
    /// Whether backups serve other clients.
    pub backup_clients: BackupClients,
    /// The server's wire protocol (what a refused client of a backup reads).
    pub protocol: Protocol,
    /// When the leader's server may act on an input.
    pub commit: CommitMode,
    /// How many committed entries the best-applied majority of backups may
    /// be behind before the leader waits (0: no bound).
    pub max_apply_lag: u64,
    /// Whether backups take snapshots of their server.
    pub snapshot: SnapshotMode,
    /// How much log between two snapshots.
    pub snapshot_every: SnapshotEvery,
    /// A node whose log holds more than this many times `snapshot_every`
    /// (either measure) is reported degraded (0: never).
    pub snapshot_degraded_after: u64,
    /// The configured cluster key (`key` or `key_file`), required by the
    /// tcp and rdma transports. None: the key lives in
    /// [`KEY_FILE`] under `data_dir` (one host). Handshakes take the key
    /// from [`Config::cluster_key`], which covers both.
    pub key: Option<String>,
    /// Server command template for `lockstep up` ({port}, {data}, {node}).
    pub server: Option<Vec<String>>,
    /// Election settings.
    pub election: Election,
    /// The nodes, sorted by id.
    pub nodes: Vec<Node>,
    /// Non-fatal remarks (e.g. an even cluster size).
    pub warnings: Vec<String>,
    /// The key [`Config::cluster_key`] resolved, kept so that a process
    /// proves the same key for its whole life.
    resolved_key: KeyCell,
}

/// A config that cannot be used, with one line saying why.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct ConfigError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

/// Name of the generated cluster key file inside `data_dir`.
pub const KEY_FILE: &str = "cluster.key";
/// Random bytes in a generated key (written as hex).
const KEY_BYTES: usize = 32;
/// Shortest cluster key accepted, configured or read from a file.
pub const MIN_KEY_LEN: usize = 16;

/// Why the cluster key could not be had; one line naming the file.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// A file operation failed.
    #[error("cluster key {}: cannot {op}: {source}", path.display())]
    Io {
        /// The file (or directory) concerned.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The key file can be read by other users: like ssh with a private
    /// key, it is refused rather than used.
    #[error(
        "cluster key {}: readable by group or others (mode {mode:04o}): run `chmod 600 {}`",
        path.display(),
        path.display()
    )]
    Exposed {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The file holds no usable key.
    #[error(
        "cluster key {}: holds no key (expected at least {MIN_KEY_LEN} characters); restore it, or remove it while no node runs to generate a new one",
        path.display()
    )]
    Malformed {
        /// The key file.
        path: PathBuf,
    },
}

/// The cache behind [`Config::cluster_key`]. Not part of a config's value:
/// every two caches compare equal, and Debug never shows the key.
#[derive(Clone, Default)]
struct KeyCell(OnceLock<String>);

impl PartialEq for KeyCell {
    fn eq(&self, _: &KeyCell) -> bool {
        true
    }
}
impl Eq for KeyCell {}

impl std::fmt::Debug for KeyCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "KeyCell(resolved)"
        } else {
            "KeyCell(unresolved)"
        })
    }
}

/// Reads the cluster key at `path`, or creates it there: [`KEY_BYTES`]
/// random bytes from `/dev/urandom` as hex, mode 0600. Creation is atomic
/// and never replaces a file, so processes starting at once (three
/// followers, `lockstep status`) end with one key: each writes a private
/// temp file and hard-links it into place; whoever loses the race reads
/// the winner's key. The parent directory is created if missing. A file
/// readable by group or others is refused ([`KeyError::Exposed`]).
pub fn generate_or_read_key(path: &Path) -> Result<String, KeyError> {
    let io = |path: &Path, op: &'static str| {
        let path = path.to_path_buf();
        move |source| KeyError::Io { path, op, source }
    };
    match read_key(path) {
        Err(KeyError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {}
        other => return other,
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir).map_err(io(path, "create its directory"))?;
    // The key, then a tag that makes the temp file's name unique among
    // concurrent creators (the pid tells processes apart, the tag threads).
    let mut random = [0u8; KEY_BYTES + 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut random))
        .map_err(io(path, "generate it: reading /dev/urandom"))?;
    let key: String = random[..KEY_BYTES]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let tag = u64::from_le_bytes(random[KEY_BYTES..].try_into().unwrap_or_default());
    let tmp = dir.join(format!(".{KEY_FILE}.{}.{tag:016x}", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        // 0600 from the start (umask can only narrow it): the key is never
        // readable by others, not even for a moment.
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(format!("{key}\n").as_bytes())?;
            f.sync_all()
        });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(&tmp, "write")(e));
    }
    // link(2) fails with EEXIST instead of replacing: the first creator
    // wins, and the file appears complete.
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            // Best effort: make the new name durable.
            if let Ok(d) = std::fs::File::open(dir) {
                let _ = d.sync_all();
            }
            log::info!("generated the cluster key {}", path.display());
            Ok(key)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => read_key(path),
        Err(e) => Err(io(path, "create")(e)),
    }
}

/// Reads an existing key file, refusing one others can read.
fn read_key(path: &Path) -> Result<String, KeyError> {
    let mut f = std::fs::File::open(path).map_err(|source| KeyError::Io {
        path: path.to_path_buf(),
        op: "open",
        source,
    })?;
    let meta = f.metadata().map_err(|source| KeyError::Io {
        path: path.to_path_buf(),
        op: "stat",
        source,
    })?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(KeyError::Exposed {
            path: path.to_path_buf(),
            mode,
        });
    }
    // A key file is one short line; anything much longer is not one.
    let mut text = String::new();
    (&mut f)
        .take(4096)
        .read_to_string(&mut text)
        .map_err(|source| KeyError::Io {
            path: path.to_path_buf(),
            op: "read",
            source,
        })?;
    let key = text.trim();
    if key.len() < MIN_KEY_LEN {
        return Err(KeyError::Malformed {
            path: path.to_path_buf(),
        });
    }
    Ok(key.to_string())
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("{}: cannot read config: {e}", path.display())))?;
        Self::parse_in(&text, path.parent())
            .map_err(|e| ConfigError(format!("{}: {}", path.display(), e.0)))
    }

    /// Parses and validates config text (relative `key_file` and
    /// `data_dir` paths resolve against the current directory).
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        Self::parse_in(text, None)
    }

    fn parse_in(text: &str, base: Option<&Path>) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let msg = e.message().replace('\n', " ");
            let Some(span) = e.span() else {
                return ConfigError(msg);
            };
            let at = floor_char_boundary(text, span.start);
            let line = text[..at].matches('\n').count() + 1;
            ConfigError(match field_at(text, at) {
                Some(field) => format!("{field}: line {line}: {msg}"),
                None => format!("line {line}: {msg}"),
            })
        })?;
        Self::validate(raw, base)
    }

    fn validate(raw: RawConfig, base: Option<&Path>) -> Result<Config, ConfigError> {
        let mut warnings = Vec::new();
        if raw.cluster.is_empty()
            || raw.cluster.len() > 64
            || !raw
                .cluster
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return err(format!(
                "cluster: {:?} must be 1-64 characters of [A-Za-z0-9_-] (it names files and znodes)",
                raw.cluster
            ));
        }
        let ring_size = raw.ring_size.map(|s| s.0).unwrap_or(64 << 20);
        let max_entry = raw.max_entry.map(|s| s.0).unwrap_or(64 << 10);
        let max_entry = check_sizes(ring_size, max_entry).map_err(ConfigError)?;
        if raw.data_dir.as_os_str().is_empty() {
            return err("data_dir: must not be empty");
        }
        let key = match (&raw.key, &raw.key_file) {
            (Some(_), Some(_)) => return err("key, key_file: give one of them, not both"),
            (Some(k), None) => Some(k.clone()),
            (None, Some(f)) => {
                let f = match base {
                    Some(b) if f.is_relative() => b.join(f),
                    _ => f.clone(),
                };
                // Refused when group or others can read it, as the
                // generated key is (a shipped example's mode is the
                // checkout's umask: git keeps no read bits).
                let k = read_key(&f).map_err(|e| match e {
                    KeyError::Io { path, source, .. } => ConfigError(format!(
                        "key_file: cannot read {}: {source}",
                        path.display()
                    )),
                    KeyError::Malformed { path } => ConfigError(format!(
                        "key_file: {} holds no key (expected at least {MIN_KEY_LEN} characters)",
                        path.display()
                    )),
                    e => ConfigError(format!("key_file: {e}")),
                })?;
                Some(k)
            }
            (None, None) => None,
        };
        if let Some(k) = &key {
            if k.len() < MIN_KEY_LEN {
                return err("key: the cluster key must be at least 16 characters");
            }
        }
        if raw.transport == TransportKind::Tcp && key.is_none() {
            return err("key: the tcp transport needs a cluster key (key or key_file)");
        }
        // An rdma cluster spans hosts: a key generated in each host's
        // data_dir would differ, so it must be configured, as for tcp.
        if raw.transport == TransportKind::Rdma && key.is_none() {
            return err("key: the rdma transport needs a cluster key (key or key_file)");
        }
        if let Some(cmd) = &raw.server {
            if cmd.is_empty() {
                return err("server: the server command must name a program (e.g. [\"redis-server\", \"--port\", \"{port}\"])");
            }
            if cmd[0].is_empty() {
                return err("server[0]: the server command must name a program, not \"\"");
            }
        }
        let mut nodes = raw.nodes;
        if nodes.is_empty() {
            return err("nodes: the cluster has no nodes (add [[nodes]] tables)");
        }
        if nodes.len() > MAX_NODES {
            return err(format!(
                "nodes: {} nodes, at most {MAX_NODES} are supported",
                nodes.len()
            ));
        }
        let mut ids = HashSet::new();
        let mut addrs = HashSet::new();
        for (i, n) in nodes.iter().enumerate() {
            if n.id == 0 || n.id > MAX_NODES as u64 {
                return err(format!(
                    "nodes[{i}].id: {} is out of range (expected 1..={MAX_NODES})",
                    n.id
                ));
            }
            if !ids.insert(n.id) {
                return err(format!(
                    "nodes[{i}].id: duplicate id {} (each node needs its own id)",
                    n.id
                ));
            }
            let mut own = vec![("app", n.app), ("control", n.control)];
            if let Some(m) = n.metrics {
                own.push(("metrics", m));
            }
            if let Some(s) = n.sentinel {
                own.push(("sentinel", s));
            }
            for (field, a) in own {
                if a.port() == 0 {
                    return err(format!(
                        "nodes[{i}].{field}: node {} needs a fixed port, not 0",
                        n.id
                    ));
                }
                if !addrs.insert(a) {
                    return err(format!(
                        "nodes[{i}].{field}: address {a} of node {} is used twice (each address belongs to one node and one role)",
                        n.id
                    ));
                }
            }
        }
        nodes.sort_by_key(|n| n.id);
        if nodes.len().is_multiple_of(2) {
            warnings.push(format!(
                "nodes: an even cluster size ({}) tolerates no more failures than {}",
                nodes.len(),
                nodes.len() - 1
            ));
        }
        if nodes.len() == 1 {
            warnings.push("nodes: a single node replicates nothing".into());
        }
        if raw.election.mode == ElectionMode::Static && !ids.contains(&raw.election.leader) {
            let mut known: Vec<u64> = ids.iter().copied().collect();
            known.sort_unstable();
            let known: Vec<String> = known.iter().map(u64::to_string).collect();
            return err(format!(
                "election.leader: node {} is not in the config (expected one of {})",
                raw.election.leader,
                known.join(", ")
            ));
        }
        if raw.election.mode == ElectionMode::Zookeeper && raw.election.zookeeper.trim().is_empty()
        {
            return err("election.zookeeper: needs a connect string such as 127.0.0.1:2181");
        }
        let ms = raw.election.session_timeout_ms;
        if !SESSION_TIMEOUT_MS.contains(&ms) {
            return err(format!(
                "election.session_timeout_ms: {ms} is outside {}..={}",
                SESSION_TIMEOUT_MS.start(),
                SESSION_TIMEOUT_MS.end()
            ));
        }
        let snapshot_every = check_snapshot_every(raw.snapshot_every).map_err(ConfigError)?;
        let degraded_after = raw.snapshot_degraded_after;
        if degraded_after != 0 && degraded_after < MIN_SNAPSHOT_DEGRADED_AFTER {
            return err(format!(
                "snapshot_degraded_after: {degraded_after} is below {MIN_SNAPSHOT_DEGRADED_AFTER} (a node whose snapshots keep their cadence holds up to about two snapshot_every of log; 0 never reports it degraded)"
            ));
        }
        Ok(Config {
            cluster: raw.cluster,
            transport: raw.transport,
            ring_size,
            data_dir: absolute(&raw.data_dir, base),
            max_entry,
            durability: raw.durability,
            backup_clients: raw.backup_clients,
            protocol: raw.protocol,
            commit: raw.commit,
            max_apply_lag: raw.max_apply_lag,
            snapshot: raw.snapshot,
            snapshot_every,
            snapshot_degraded_after: degraded_after,
            key,
            server: raw.server,
            election: raw.election,
            nodes,
            warnings,
            resolved_key: KeyCell::default(),
        })
    }

    /// Where the cluster key is kept when the config names none:
    /// `<data_dir>/cluster.key` (None: the config names a key).
    pub fn cluster_key_path(&self) -> Option<PathBuf> {
        self.key.is_none().then(|| self.data_dir.join(KEY_FILE))
    }

    /// The cluster key every control and region handshake proves: the
    /// configured `key`/`key_file`, else the one in
    /// [`Config::cluster_key_path`], generated there on first use (see
    /// [`generate_or_read_key`]). Resolved once per `Config` value (clones
    /// made afterwards share it), so a process keeps the key it started
    /// with; a configured key costs no I/O.
    pub fn cluster_key(&self) -> Result<&str, KeyError> {
        self.resolve_key(generate_or_read_key)
    }

    /// [`Config::cluster_key`] for a client that only asks (`lockstep
    /// status`): reads the key, never creates it (a key file made by
    /// whoever asks first, e.g. root before the followers ever ran, could
    /// lock the followers out).
    pub fn existing_cluster_key(&self) -> Result<&str, KeyError> {
        self.resolve_key(read_key)
    }

    fn resolve_key(&self, get: fn(&Path) -> Result<String, KeyError>) -> Result<&str, KeyError> {
        if let Some(k) = &self.key {
            return Ok(k);
        }
        if let Some(k) = self.resolved_key.0.get() {
            return Ok(k);
        }
        let k = get(&self.data_dir.join(KEY_FILE))?;
        // Two threads may both have read the file; they read the same key.
        Ok(self.resolved_key.0.get_or_init(|| k))
    }

    /// The node with id `id`.
    pub fn node(&self, id: u64) -> Result<&Node, ConfigError> {
        self.nodes.iter().find(|n| n.id == id).ok_or_else(|| {
            let ids: Vec<String> = self.nodes.iter().map(|n| n.id.to_string()).collect();
            ConfigError(format!(
                "node {id} is not in the config (ids: {})",
                ids.join(", ")
            ))
        })
    }

    /// Ids of all nodes.
    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.nodes.iter().map(|n| n.id)
    }

    /// Votes needed for a majority.
    pub fn majority(&self) -> usize {
        crate::quorum::majority(self.nodes.len())
    }

    /// Region identity of node `id`.
    pub fn region_spec(&self, id: u64) -> RegionSpec {
        RegionSpec {
            cluster: self.cluster.clone(),
            node: id,
            ring_size: self.ring_size,
        }
    }

    /// RocksDB directory of node `id`.
    pub fn node_data_dir(&self, id: u64) -> PathBuf {
        self.data_dir.join(format!("node-{id}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_testkit::config_fixture::ThreeNodeConfig;
    use std::sync::LazyLock;

    /// A good config of three nodes, node 3 with a metrics endpoint.
    static GOOD: LazyLock<String> = LazyLock::new(|| {
        ThreeNodeConfig::new(
            r#"cluster = "demo"
transport = "shm"
ring_size = "64MiB"
data_dir = "/tmp/lockstep-demo"
[election]
mode = "static"
leader = 1
"#,
        )
        .metrics(3, "127.0.0.1:7203")
        .text()
    });

    fn bad(text: &str) -> String {
        Config::parse(text).unwrap_err().0
    }

    #[test]
    fn good_config_parses() {
        let c = Config::parse(&GOOD).unwrap();
        assert_eq!(c.ring_size, 64 << 20);
        assert_eq!(c.nodes.len(), 3);
        assert_eq!(c.majority(), 2);
        assert_eq!(c.max_entry, 64 << 10);
        assert!(c.warnings.is_empty());
        assert_eq!(c.node(3).unwrap().metrics.unwrap().port(), 7203);
        assert_eq!(
            c.node_data_dir(2),
            PathBuf::from("/tmp/lockstep-demo/node-2")
        );
    }

    #[test]
    fn commit_mode_defaults_to_output_and_is_checked() {
        assert_eq!(Config::parse(&GOOD).unwrap().commit, CommitMode::Output);
        let input = GOOD.replace(
            "cluster = \"demo\"",
            "cluster = \"demo\"\ncommit = \"input\"",
        );
        assert_eq!(Config::parse(&input).unwrap().commit, CommitMode::Input);
        let e = bad(&GOOD.replace(
            "cluster = \"demo\"",
            "cluster = \"demo\"\ncommit = \"later\"",
        ));
        assert!(e.contains("unknown variant `later`"), "{e}");
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = bad(&GOOD.replace("cluster = \"demo\"", "cluster = \"demo\"\nring_sise = 4"));
        assert!(e.contains("unknown field `ring_sise`"), "{e}");
        assert!(e.starts_with("line 3:"), "{e}");
        let e = bad(&GOOD.replace("metrics =", "metrix ="));
        assert!(e.contains("unknown field `metrix`"), "{e}");
        assert!(!e.contains('\n'));
    }

    #[test]
    fn duplicates_are_named() {
        let e = bad(&GOOD.replace("id = 2", "id = 1"));
        assert_eq!(
            e,
            "nodes[1].id: duplicate id 1 (each node needs its own id)"
        );
        let e = bad(&GOOD.replace("127.0.0.1:7002", "127.0.0.1:7001"));
        assert!(e.starts_with("nodes[1].app: address 127.0.0.1:7001"), "{e}");
        let e = bad(&GOOD.replace("127.0.0.1:7203", "127.0.0.1:7101"));
        assert!(e.starts_with("nodes[2].metrics:"), "{e}");
        let with_sentinel = GOOD.replace(
            "metrics = \"127.0.0.1:7203\"",
            "metrics = \"127.0.0.1:7203\"\nsentinel = \"127.0.0.1:7303\"",
        );
        let c = Config::parse(&with_sentinel).unwrap();
        assert_eq!(c.node(3).unwrap().sentinel.unwrap().port(), 7303);
        assert_eq!(c.node(1).unwrap().sentinel, None);
        let e = bad(&with_sentinel.replace("127.0.0.1:7303", "127.0.0.1:7203"));
        assert!(
            e.starts_with("nodes[2].sentinel: address 127.0.0.1:7203"),
            "{e}"
        );
    }

    #[test]
    fn cluster_size() {
        let two = GOOD.split("[[nodes]]\nid = 3").next().unwrap();
        let c = Config::parse(two).unwrap();
        assert!(
            c.warnings[0].contains("even cluster size"),
            "{:?}",
            c.warnings
        );
        let none = GOOD.split("[[nodes]]").next().unwrap();
        assert!(bad(none).starts_with("nodes: the cluster has no nodes"));
    }

    #[test]
    fn ring_size_rules() {
        let e = bad(&GOOD.replace("\"64MiB\"", "3000000"));
        assert_eq!(e, "ring_size: 3000000 bytes is not a power of two");
        let e = bad(&GOOD.replace("\"64MiB\"", "\"512KiB\""));
        assert_eq!(
            e,
            "ring_size: 524288 bytes is below the minimum of 1048576 (1 MiB)"
        );
        let e = bad(&GOOD.replace("\"64MiB\"", "\"64 parsecs\""));
        assert!(e.contains("unknown size unit"), "{e}");
    }

    #[test]
    fn node_lookup_and_leader() {
        let c = Config::parse(&GOOD).unwrap();
        assert_eq!(
            c.node(5).unwrap_err().0,
            "node 5 is not in the config (ids: 1, 2, 3)"
        );
        let e = bad(&GOOD.replace("leader = 1", "leader = 9"));
        assert_eq!(
            e,
            "election.leader: node 9 is not in the config (expected one of 1, 2, 3)"
        );
        let e = bad(&GOOD.replace("id = 3", "id = 0"));
        assert!(e.starts_with("nodes[2].id: 0 is out of range"), "{e}");
    }

    #[test]
    fn tcp_needs_a_key() {
        let tcp = GOOD.replace("\"shm\"", "\"tcp\"");
        assert!(bad(&tcp).starts_with("key:"));
        let e = bad(&tcp.replace("cluster = \"demo\"", "cluster = \"demo\"\nkey = \"short\""));
        assert!(e.contains("at least 16"), "{e}");
        let c = Config::parse(&tcp.replace(
            "cluster = \"demo\"",
            "cluster = \"demo\"\nkey = \"0123456789abcdef\"",
        ))
        .unwrap();
        assert_eq!(c.key.as_deref(), Some("0123456789abcdef"));
        let e = bad(&tcp.replace(
            "cluster = \"demo\"",
            "cluster = \"demo\"\nkey_file = \"/nonexistent/key\"",
        ));
        assert!(
            e.starts_with("key_file: cannot read /nonexistent/key"),
            "{e}"
        );
    }

    #[test]
    fn rdma_needs_a_key() {
        let rdma = GOOD.replace("\"shm\"", "\"rdma\"");
        assert!(
            bad(&rdma).starts_with("key: the rdma transport"),
            "{}",
            bad(&rdma)
        );
    }

    /// A fresh directory under the temp dir, removed when dropped.
    struct TempDir(PathBuf);
    impl TempDir {
        fn new(name: &str) -> TempDir {
            let d =
                std::env::temp_dir().join(format!("lockstep-config-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            TempDir(d)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_configured_key_is_the_cluster_key_and_touches_no_file() {
        let d = TempDir::new("configured");
        let c = Config::parse(
            &GOOD
                .replace("/tmp/lockstep-demo", &d.0.display().to_string())
                .replace(
                    "cluster = \"demo\"",
                    "cluster = \"demo\"\nkey = \"0123456789abcdef\"",
                ),
        )
        .unwrap();
        assert_eq!(c.cluster_key_path(), None);
        assert_eq!(c.cluster_key().unwrap(), "0123456789abcdef");
        assert!(!d.0.exists(), "a configured key created {}", d.0.display());
    }

    #[test]
    fn concurrent_creators_end_with_one_private_key() {
        use std::sync::{Arc, Barrier};
        let d = TempDir::new("race");
        // data_dir does not exist yet: the creators make it too.
        let c = Config::parse(&GOOD.replace(
            "/tmp/lockstep-demo",
            &d.0.join("data").display().to_string(),
        ))
        .unwrap();
        let path = c.cluster_key_path().expect("keyless config");
        assert_eq!(path, d.0.join("data").join(KEY_FILE));
        let n = 16;
        let barrier = Arc::new(Barrier::new(n));
        let keys: Vec<String> = (0..n)
            .map(|_| {
                // Each thread its own Config, as separate processes have.
                let (c, b) = (c.clone(), barrier.clone());
                std::thread::spawn(move || {
                    b.wait();
                    c.cluster_key().map(str::to_string)
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap().unwrap())
            .collect();
        assert!(keys.iter().all(|k| *k == keys[0]), "{keys:?}");
        assert_eq!(keys[0].len(), 2 * KEY_BYTES);
        assert!(keys[0].chars().all(|ch| ch.is_ascii_hexdigit()));
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read_to_string(&path).unwrap().trim(), keys[0]);
        // No creator's temp file is left behind.
        let names: Vec<String> = std::fs::read_dir(d.0.join("data"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec![KEY_FILE.to_string()]);
        // A later process reads the same key; one Config keeps its key.
        let again = Config::parse(&GOOD.replace(
            "/tmp/lockstep-demo",
            &d.0.join("data").display().to_string(),
        ))
        .unwrap();
        assert_eq!(again.cluster_key().unwrap(), keys[0]);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(again.cluster_key().unwrap(), keys[0]);
    }

    #[test]
    fn snapshot_settings_default_on_and_bad_values_name_the_field() {
        let c = Config::parse(&GOOD).unwrap();
        assert_eq!(c.snapshot, SnapshotMode::Process);
        assert_eq!(c.snapshot_every, DEFAULT_SNAPSHOT_EVERY);
        let with = |lines: &str| Config::parse(&format!("{lines}\n{}", *GOOD));
        let c = with("snapshot = \"off\"\nsnapshot_every = { bytes = \"64MiB\" }").unwrap();
        assert_eq!(c.snapshot, SnapshotMode::Off);
        assert_eq!(
            c.snapshot_every,
            SnapshotEvery {
                entries: DEFAULT_SNAPSHOT_EVERY.entries,
                bytes: 64 << 20,
                image_percent: DEFAULT_SNAPSHOT_EVERY.image_percent,
            }
        );
        let c = with("snapshot_every = { entries = 0, bytes = \"2MiB\" }").unwrap();
        assert_eq!(c.snapshot_every.entries, 0);
        let c = with("snapshot_every = { image_percent = 0 }").unwrap();
        assert_eq!(c.snapshot_every.image_percent, 0);
        assert_eq!(c.snapshot_every.image_share(1 << 30), 0);
        let c = with("snapshot_every = { image_percent = 250 }").unwrap();
        assert_eq!(c.snapshot_every.image_share(1000), 2500);
        assert_eq!(
            SnapshotEvery {
                image_percent: MAX_SNAPSHOT_IMAGE_PERCENT,
                ..DEFAULT_SNAPSHOT_EVERY
            }
            .image_share(u64::MAX),
            u64::MAX,
            "saturates"
        );
        assert_eq!(c.snapshot_degraded_after, DEFAULT_SNAPSHOT_DEGRADED_AFTER);
        assert_eq!(
            with("snapshot_degraded_after = 0")
                .unwrap()
                .snapshot_degraded_after,
            0
        );
        assert_eq!(
            with("snapshot_degraded_after = 3")
                .unwrap()
                .snapshot_degraded_after,
            3
        );
        for (lines, want) in [
            ("snapshot = \"criu\"", "snapshot"),
            (
                "snapshot_every = { entries = 10 }",
                "snapshot_every.entries: 10 is below 1000",
            ),
            (
                "snapshot_every = { bytes = 4096 }",
                "snapshot_every.bytes: 4096 bytes is below 1MiB",
            ),
            (
                "snapshot_every = { entries = 0, bytes = 0 }",
                "entries and bytes are both 0",
            ),
            ("snapshot_every = { entry = 5000 }", "unknown field `entry`"),
            (
                "snapshot_every = { image_percent = 100001 }",
                "snapshot_every.image_percent: 100001 is above 100000",
            ),
            ("snapshot_every = { image_percent = -1 }", "image_percent"),
            (
                "snapshot_degraded_after = 2",
                "snapshot_degraded_after: 2 is below 3",
            ),
            ("snapshot_degraded_after = -1", "snapshot_degraded_after"),
            ("snapshot_every = { bytes = \"9XB\" }", "unknown size unit"),
        ] {
            let e = with(lines).unwrap_err().0;
            assert!(e.contains(want), "{lines}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn an_exposed_or_empty_key_file_is_refused_naming_it() {
        let d = TempDir::new("exposed");
        std::fs::create_dir_all(&d.0).unwrap();
        let path = d.0.join(KEY_FILE);
        std::fs::write(&path, "0123456789abcdef0123\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = generate_or_read_key(&path).unwrap_err().to_string();
        assert!(
            e.contains(&path.display().to_string())
                && e.contains("readable by group or others (mode 0644)")
                && e.contains("chmod 600"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(generate_or_read_key(&path).unwrap(), "0123456789abcdef0123");
        std::fs::write(&path, "\n").unwrap();
        let e = generate_or_read_key(&path).unwrap_err().to_string();
        assert!(e.contains("holds no key"), "{e}");
    }

    #[test]
    fn a_configured_key_file_others_can_read_is_refused_naming_it() {
        let d = TempDir::new("key-file");
        std::fs::create_dir_all(&d.0).unwrap();
        let path = d.0.join("my.key");
        std::fs::write(&path, "0123456789abcdef0123\n").unwrap();
        let config = GOOD.replace(
            "cluster = \"demo\"",
            &format!("cluster = \"demo\"\nkey_file = \"{}\"", path.display()),
        );
        for mode in [0o644, 0o640, 0o604] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = bad(&config);
            assert_eq!(
                e,
                format!(
                    "key_file: cluster key {p}: readable by group or others (mode {mode:04o}): run `chmod 600 {p}`",
                    p = path.display()
                )
            );
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let c = Config::parse(&config).unwrap();
        assert_eq!(c.key.as_deref(), Some("0123456789abcdef0123"));
        std::fs::write(&path, "short\n").unwrap();
        assert_eq!(
            bad(&config),
            format!(
                "key_file: {} holds no key (expected at least 16 characters)",
                path.display()
            )
        );
    }

    #[test]
    fn bad_values_are_named() {
        let e = bad(&GOOD.replace("\"shm\"", "\"carrier-pigeon\""));
        assert!(e.contains("carrier-pigeon"), "{e}");
        let e = bad(&GOOD.replace("cluster = \"demo\"", "cluster = \"de mo\""));
        assert!(e.starts_with("cluster:"), "{e}");
        let e = bad(&GOOD.replace("127.0.0.1:7101", "not-an-address"));
        assert!(e.contains("invalid socket address"), "{e}");
        let e = bad("cluster = \"x\"");
        assert!(e.contains("missing field `data_dir`"), "{e}");
    }

    fn with(line: &str) -> String {
        GOOD.replace("data_dir =", &format!("{line}\ndata_dir ="))
    }

    #[test]
    fn max_entry_is_checked_not_truncated() {
        // Issue 14: 4 GiB entries in a 32 GiB ring became max_entry 0.
        let e = bad(&with("max_entry = \"4GiB\"").replace("\"64MiB\"", "\"32GiB\""));
        assert!(
            e.starts_with("max_entry: 4294967296 bytes is above the maximum of 16777216"),
            "{e}"
        );
        let e = bad(&with("max_entry = \"4GiB\""));
        assert!(
            e.starts_with("max_entry: 4294967296 bytes is above ring_size/4 (16777216 bytes"),
            "{e}"
        );
        assert_eq!(
            bad(&with("max_entry = 0")),
            "max_entry: must be at least 1 byte"
        );
        let e = bad(&with("max_entry = -1"));
        assert!(
            e.starts_with("max_entry: line 5:") && e.contains("negative"),
            "{e}"
        );
        // 16 MiB of payload plus header and canary is more than a quarter
        // of 64 MiB, but fits in a quarter of 128 MiB.
        assert!(bad(&with("max_entry = \"16MiB\"")).contains("above ring_size/4"));
        let c = Config::parse(&with("max_entry = \"16MiB\"").replace("\"64MiB\"", "\"128MiB\""))
            .unwrap();
        assert_eq!(c.max_entry, 16 << 20);
        let e = bad(&with("max_entry = \"18446744073709551615\""));
        assert!(
            e.starts_with("max_entry:") && e.contains("ring_size/4"),
            "{e}"
        );
        let e = bad(&with("max_entry = \"17179869184GiB\""));
        assert!(
            e.starts_with("max_entry:") && e.contains("too large"),
            "{e}"
        );
        assert_eq!(Config::parse(&with("max_entry = 1")).unwrap().max_entry, 1);
    }

    #[test]
    fn ring_size_has_a_range() {
        let e = bad(&GOOD.replace("\"64MiB\"", "\"128GiB\""));
        assert_eq!(
            e,
            "ring_size: 137438953472 bytes is above the maximum of 68719476736 (64 GiB)"
        );
        assert!(Config::parse(&GOOD.replace("\"64MiB\"", "\"64GiB\"")).is_ok());
        let e = bad(&GOOD.replace("\"64MiB\"", "0"));
        assert!(
            e.starts_with("ring_size: 0 bytes is not a power of two"),
            "{e}"
        );
    }

    #[test]
    fn check_sizes_never_truncates() {
        // A seeded sweep over the whole u64 range and the edges.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..20_000 {
            let ring = match i % 3 {
                0 => 1u64 << (next() % 64),
                1 => next(),
                _ => 1 << (20 + next() % 17),
            };
            let max = match i % 4 {
                0 => next(),
                1 => next() % (1 << 26),
                2 => [0, 1, u32::MAX as u64, u32::MAX as u64 + 1, u64::MAX][i % 5],
                _ => ring / 4 - (next() % 256).min(ring / 4),
            };
            if let Ok(m) = check_sizes(ring, max) {
                assert_eq!(m as u64, max);
                assert!((1..=MAX_ENTRY).contains(&max));
                assert!(ring.is_power_of_two() && (MIN_RING..=MAX_RING).contains(&ring));
                assert!(crate::entry::footprint(m as usize) as u64 <= ring / 4);
            }
        }
    }

    #[test]
    fn type_errors_name_the_field() {
        let e = bad(&GOOD.replace("app = \"127.0.0.1:7002\"", "app = 7911"));
        assert!(
            e.starts_with("nodes[1].app: line 15: invalid type: integer `7911`"),
            "{e}"
        );
        let e = bad(&GOOD.replace("\"64MiB\"", "true"));
        assert!(
            e.starts_with("ring_size: line 4: invalid type: boolean `true`"),
            "{e}"
        );
        let e = bad(&GOOD.replace("leader = 1", "leader = \"one\""));
        assert!(e.starts_with("election.leader: line 8:"), "{e}");
        let e = bad(&GOOD.replace("id = 2", "id = -2"));
        assert!(e.starts_with("nodes[1].id: line 14:"), "{e}");
        let e = bad(&GOOD.replace("127.0.0.1:7103", "not-an-address"));
        assert!(
            e.starts_with("nodes[2].control: line 20:") && e.contains("socket address"),
            "{e}"
        );
        let e = bad(&GOOD
            .replace("[election]\nmode = \"static\"\nleader = 1\n", "")
            .replace("data_dir =", "election = { mode = 7 }\ndata_dir ="));
        assert!(e.starts_with("election.mode: line 5:"), "{e}");
        let e = bad(&GOOD.replace("\"shm\"", "\"carrier-pigeon\""));
        assert!(e.starts_with("transport: line 3:"), "{e}");
    }

    #[test]
    fn session_timeout_has_a_range() {
        let e = bad(&GOOD.replace("leader = 1", "leader = 1\nsession_timeout_ms = 0"));
        assert_eq!(e, "election.session_timeout_ms: 0 is outside 100..=600000");
        let e = bad(&GOOD.replace("leader = 1", "leader = 1\nsession_timeout_ms = 3600000"));
        assert!(e.starts_with("election.session_timeout_ms: 3600000"), "{e}");
    }

    #[test]
    fn a_relative_data_dir_is_the_config_files_neighbour() {
        let dir = std::env::temp_dir().join(format!("lockstep-cfg-rel-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cluster.toml");
        let text = GOOD.replace("data_dir = \"/tmp/lockstep-demo\"", "data_dir = \"data\"");
        assert_ne!(text, *GOOD, "GOOD names its data_dir as this test expects");
        std::fs::write(&path, text).unwrap();
        assert_eq!(Config::load(&path).unwrap().data_dir, dir.join("data"));
        // Parsed from text: against the current directory.
        let c =
            Config::parse(&GOOD.replace("data_dir = \"/tmp/lockstep-demo\"", "data_dir = \"d\""))
                .unwrap();
        assert_eq!(c.data_dir, std::env::current_dir().unwrap().join("d"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("MiB").is_err());
    }
}
