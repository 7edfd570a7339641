//! Replies that differ per node by design, told from the commands that
//! asked for them.
//!
//! A backup compares, for each replay connection, the digest of what its
//! server wrote since the connection's previous input with the digest the
//! leader logged (see `region_host`). Some Redis replies cannot agree however
//! faithfully the log is replayed, because they describe the node rather
//! than the data: a connection's own address, port or fd, a pid, memory
//! and CPU figures, the process's uptime and counters. Counting them would
//! bury real divergences among expected ones, so the detector does not
//! count output that followed a command of these classes ([`dependent`]):
//!
//! - `INFO` (any section: `process_id`, `run_id`, `tcp_port`, `executable`,
//!   `used_cpu_*`, `used_memory*`, connection and network counters) and
//!   `LOLWUT`-free introspection of the process: `MEMORY` (`USAGE`,
//!   `STATS`, `DOCTOR`, `MALLOC-STATS`).
//! - A connection's own identity: `CLIENT LIST`, `CLIENT INFO` (`addr`,
//!   `laddr`, `fd`), `HELLO` and `CLIENT ID` (the server numbers its
//!   clients itself, and a backup's server can have clients the leader's
//!   never had: any direct connection to a backup, a health check's), and
//!   what records them: `SLOWLOG GET`
//!   and `ACL LOG` (client address), `MONITOR` (every line it streams
//!   names the issuing client's address; the connection stays in the class
//!   until `RESET`).
//! - Memory addresses: `DEBUG OBJECT` (`Value at:0x…`).
//! - A connection that turned replica (`SYNC`, `PSYNC`; for good): its
//!   stream starts with an RDB file a forked child writes, whose `used-mem`
//!   field is the node's and whose arrival (newlines keep the link alive
//!   until it is ready) is the child's timing, not the log's.
//!
//! - The node's own configuration: `CONFIG GET` (replicas on one host
//!   listen on their own ports, with their own `dir`, unix socket, pid and
//!   log files, and `CONFIG GET *` lists them all; what `CONFIG SET`
//!   changes is replicated, so the other values agree anyway), and a
//!   `CONFIG SET` of such a node's own parameter (`port`, `tls-port`,
//!   `bind`, `unixsocket`, `dir`, `pidfile`, `logfile`: a backup on the
//!   leader's host cannot take the port the leader just took).
//!
//! - memcached's `stats` (every form: `stats`, `stats settings`, `stats
//!   conns`, `stats slabs`, …; in the binary protocol the `STAT` request,
//!   opcode 0x10): its pid, uptime, rusage, connection counts and each
//!   connection's address, and in `stats settings` the node's own port.
//!
//! The classes go by command, not by reply, so a command queued in
//! `MULTI` makes its `EXEC`'s reply node-dependent, and a pipelined input
//! holding one such command excuses the whole output of that input (the
//! digest covers it all). The parser follows RESP, inline (Redis's and
//! memcached's text protocol) and memcached's binary requests across the
//! entries of a split read without allocating; it runs on every input a
//! backup applies.

/// The longest command or subcommand name kept (longer ones are no class).
const WORD: usize = 16;

/// A command or subcommand name, lowercased, as far as [`WORD`] bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Word {
    bytes: [u8; WORD],
    /// Its length; above `WORD` when it did not fit.
    len: usize,
}

impl Word {
    fn push(&mut self, b: u8) {
        if self.len < WORD {
            self.bytes[self.len] = b.to_ascii_lowercase();
        }
        self.len = self.len.saturating_add(1);
    }

    fn is(&self, name: &str) -> bool {
        self.len == name.len() && &self.bytes[..self.len] == name.as_bytes()
    }

    fn text(&self) -> &str {
        std::str::from_utf8(&self.bytes[..self.len.min(WORD)]).unwrap_or("?")
    }
}

impl std::fmt::Display for Word {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.text())
    }
}

/// Whether the reply to `name sub…` (lowercase) describes the node, not
/// the data (see the module doc for each class).
fn dependent(name: &Word, sub: &Word, param: &Word) -> bool {
    match name.text() {
        "info" | "hello" | "memory" | "monitor" | "sync" | "psync" | "stats" => true,
        "client" => matches!(sub.text(), "list" | "info" | "id"),
        "config" => {
            sub.is("get")
                || (sub.is("set")
                    && matches!(
                        param.text(),
                        "port"
                            | "tls-port"
                            | "bind"
                            | "unixsocket"
                            | "unixsocketperm"
                            | "dir"
                            | "pidfile"
                            | "logfile"
                    ))
        }
        "debug" => sub.is("object"),
        "slowlog" => sub.is("get"),
        "acl" => sub.is("log"),
        _ => false,
    }
}

/// Whether [`dependent`] looks at the subcommand of `name`.
fn reads_sub(name: &Word) -> bool {
    matches!(
        name.text(),
        "client" | "config" | "debug" | "slowlog" | "acl"
    )
}

/// Whether [`dependent`] looks at the argument after `name sub`.
fn reads_param(name: &Word, sub: &Word) -> bool {
    name.is("config") && sub.is("set")
}

/// Where the parser is in a connection's byte stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum At {
    /// Between commands.
    #[default]
    Start,
    /// In a `*N` header: the count so far.
    Count(u64),
    /// Before a bulk argument's `$` header.
    BulkHeader,
    /// In a `$N` header: the length so far.
    BulkLen(u64),
    /// In a bulk argument: bytes left, its CRLF included.
    Bulk(u64),
    /// In an inline command line; true while inside a word.
    Inline(bool),
    /// In a memcached binary request's 24-byte header: bytes read so far.
    BinHeader(u8),
    /// In a binary request's body (extras, key, value): bytes left.
    BinBody(u64),
}

/// The first byte of a memcached binary request.
const BIN_REQUEST_MAGIC: u8 = 0x80;
/// memcached's binary `STAT` opcode (its reply is `stats`').
const BIN_OP_STAT: u8 = 0x10;

/// One replay connection's classifier: fed the connection's inputs in
/// order, it says whether the output since the previous input came from a
/// node-dependent reply.
#[derive(Clone, Copy, Debug, Default)]
pub struct Replies {
    at: At,
    /// Arguments left in the current RESP command, and which one is read.
    args_left: u64,
    arg: u64,
    name: Word,
    sub: Word,
    /// The argument after the subcommand (`CONFIG SET`'s parameter).
    param: Word,
    /// Whether the connection speaks memcached's binary protocol (decided
    /// by its first byte).
    binary: Option<bool>,
    /// A binary request's opcode and body length, as its header is read.
    bin_op: u8,
    bin_body: u64,
    /// The last complete command's name, for the divergence line.
    last: Word,
    /// Whether the current input held a node-dependent command.
    pending: bool,
    /// Inside `MULTI`, and whether a node-dependent command was queued.
    in_multi: bool,
    queued: bool,
    /// The connection streams what the server does (`MONITOR`, or a
    /// replica's `SYNC`/`PSYNC`) until `RESET`.
    streaming: bool,
}

impl Replies {
    /// The output since the connection's previous input is being compared
    /// (call before feeding the new input): whether a node-dependent
    /// command produced it. Starts over for the next input.
    pub fn take(&mut self) -> bool {
        std::mem::take(&mut self.pending) || self.streaming
    }

    /// The name of the last command read (lowercase, for a log line).
    pub fn last_command(&self) -> Word {
        self.last
    }

    /// The server is handed `bytes` of the connection's input (a whole
    /// read or a part of one, in order).
    pub fn input(&mut self, bytes: &[u8]) {
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            match self.at {
                At::Start => match b {
                    // memcached takes a connection whose first byte is
                    // the binary magic as binary for good (a text
                    // protocol's value may start with that byte too).
                    _ if *self.binary.get_or_insert(b == BIN_REQUEST_MAGIC) => {
                        if b == BIN_REQUEST_MAGIC {
                            self.begin();
                            self.bin_op = 0;
                            self.bin_body = 0;
                            self.at = At::BinHeader(1);
                        }
                    }
                    b'*' => self.at = At::Count(0),
                    b'\r' | b'\n' | b' ' => {}
                    _ => {
                        self.begin();
                        self.at = At::Inline(false);
                        continue;
                    }
                },
                At::Count(n) => match b {
                    b'0'..=b'9' => self.at = At::Count(digit(n, b)),
                    b'\n' => {
                        self.begin();
                        self.args_left = n;
                        self.at = if n == 0 { At::Start } else { At::BulkHeader };
                    }
                    _ => {}
                },
                At::BulkHeader => {
                    if b == b'$' {
                        self.at = At::BulkLen(0);
                    }
                }
                At::BulkLen(n) => match b {
                    b'0'..=b'9' => self.at = At::BulkLen(digit(n, b)),
                    b'\n' => self.at = At::Bulk(n.saturating_add(2)),
                    _ => {}
                },
                At::Bulk(left) => {
                    // Only the words `dependent` looks at are kept: a
                    // pipelined `SET`'s key and value are skipped whole.
                    let word = match self.arg {
                        0 => Some(&mut self.name),
                        1 if reads_sub(&self.name) => Some(&mut self.sub),
                        2 if reads_param(&self.name, &self.sub) => Some(&mut self.param),
                        _ => None,
                    };
                    match word {
                        // The name or the subcommand: kept while it may
                        // still be a class's, as much of it as this read
                        // holds at once.
                        Some(w) if left > 2 && w.len <= WORD => {
                            let n = ((left - 2) as usize)
                                .min(bytes.len() - i)
                                .min(WORD + 1 - w.len);
                            for &c in &bytes[i..i + n] {
                                w.push(c);
                            }
                            self.at = At::Bulk(left - n as u64);
                            i += n;
                            continue;
                        }
                        _ => {
                            let n = left.min((bytes.len() - i) as u64);
                            self.at = At::Bulk(left - n);
                            i += n as usize;
                            if left == n {
                                self.end_arg();
                            }
                            continue;
                        }
                    }
                }
                At::BinHeader(at) => {
                    // Byte 1 is the opcode, bytes 8..12 the body's length
                    // (big endian); the rest is not needed.
                    match at {
                        1 => self.bin_op = b,
                        8..=11 => self.bin_body = (self.bin_body << 8) | u64::from(b),
                        _ => {}
                    }
                    if at < 23 {
                        self.at = At::BinHeader(at + 1);
                    } else if self.bin_body == 0 {
                        self.complete_binary();
                    } else {
                        self.at = At::BinBody(self.bin_body);
                    }
                }
                At::BinBody(left) => {
                    let n = left.min((bytes.len() - i) as u64);
                    i += n as usize;
                    if n == left {
                        self.complete_binary();
                    } else {
                        self.at = At::BinBody(left - n);
                    }
                    continue;
                }
                At::Inline(in_word) => match b {
                    b'\n' => {
                        self.complete();
                        self.at = At::Start;
                    }
                    b' ' | b'\t' | b'\r' => {
                        if in_word {
                            self.arg += 1;
                        }
                        self.at = At::Inline(false);
                    }
                    _ => {
                        if self.arg == 0 {
                            self.name.push(b);
                        } else if self.arg == 1 {
                            self.sub.push(b);
                        } else if self.arg == 2 {
                            self.param.push(b);
                        }
                        self.at = At::Inline(true);
                    }
                },
            }
            i += 1;
        }
    }

    /// A command starts.
    fn begin(&mut self) {
        self.arg = 0;
        self.name = Word::default();
        self.sub = Word::default();
        self.param = Word::default();
    }

    /// A bulk argument ended.
    fn end_arg(&mut self) {
        self.arg += 1;
        self.args_left = self.args_left.saturating_sub(1);
        if self.args_left == 0 {
            self.complete();
            self.at = At::Start;
        } else {
            self.at = At::BulkHeader;
        }
    }

    /// A whole binary request was read: named for the classes (`stats`
    /// for `STAT`; any other opcode is none of them).
    fn complete_binary(&mut self) {
        for &c in if self.bin_op == BIN_OP_STAT {
            &b"stats"[..]
        } else {
            &b"binary"[..]
        } {
            self.name.push(c);
        }
        self.complete();
        self.at = At::Start;
    }

    /// A whole command was read: its reply is in this input's output (or
    /// in its `EXEC`'s).
    fn complete(&mut self) {
        if self.name.len == 0 {
            return;
        }
        self.last = self.name;
        let node = dependent(&self.name, &self.sub, &self.param);
        if self.name.is("reset") {
            self.streaming = false;
            self.in_multi = false;
            self.queued = false;
        } else if self.in_multi {
            if self.name.is("exec") {
                self.pending |= self.queued;
                self.in_multi = false;
                self.queued = false;
            } else if self.name.is("discard") {
                self.in_multi = false;
                self.queued = false;
            } else {
                self.queued |= node;
            }
        } else if self.name.is("multi") {
            self.in_multi = true;
        } else {
            self.pending |= node;
            self.streaming |=
                self.name.is("monitor") || self.name.is("sync") || self.name.is("psync");
        }
    }
}

/// `n` with the decimal digit `b` appended (saturating: a length no input
/// has).
fn digit(n: u64, b: u8) -> u64 {
    n.saturating_mul(10).saturating_add(u64::from(b - b'0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resp(args: &[&str]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
        out
    }

    /// Feeds each input in turn; returns what `take` said before each
    /// later input and at the end (one verdict per input).
    fn verdicts(inputs: &[Vec<u8>]) -> Vec<bool> {
        let mut r = Replies::default();
        inputs
            .iter()
            .map(|i| {
                r.input(i);
                r.take()
            })
            .collect()
    }

    #[test]
    fn replies_that_describe_the_node_are_known() {
        for cmd in [
            &["CLIENT", "LIST"][..],
            &["client", "info"],
            &["CLIENT", "ID"],
            &["INFO"],
            &["INFO", "server"],
            &["HELLO", "3"],
            &["MEMORY", "USAGE", "k"],
            &["SLOWLOG", "GET", "10"],
            &["ACL", "LOG"],
            &["DEBUG", "OBJECT", "k"],
            &["SYNC"],
            &["CONFIG", "GET", "port"],
            &["config", "get", "*"],
            &["CONFIG", "SET", "port", "7001"],
            &["CONFIG", "SET", "dir", "/tmp"],
        ] {
            assert_eq!(verdicts(&[resp(cmd)]), [true], "{cmd:?}");
        }
    }

    #[test]
    fn replies_about_the_data_or_the_shared_configuration_are_not() {
        for cmd in [
            &["CONFIG", "SET", "maxmemory", "10mb"][..],
            &["CONFIG", "SET", "portx", "1"],
            &["GET", "info"],
            &["CLIENT", "SETNAME", "list"],
            &["SLOWLOG", "LEN"],
            &["DEBUG", "DIGEST"],
            &["SET", "k", "v"],
            &["PING"],
        ] {
            assert_eq!(verdicts(&[resp(cmd)]), [false], "{cmd:?}");
        }
    }

    #[test]
    fn a_pipeline_with_one_such_command_is_excused_and_the_next_input_not() {
        let mut pipeline = resp(&["SET", "k", "v"]);
        pipeline.extend(resp(&["CLIENT", "LIST"]));
        pipeline.extend(resp(&["GET", "k"]));
        assert_eq!(verdicts(&[pipeline, resp(&["GET", "k"])]), [true, false]);
    }

    #[test]
    fn a_command_split_across_reads_is_followed() {
        let whole = resp(&["SET", "big", &"x".repeat(1000)])
            .into_iter()
            .chain(resp(&["CLIENT", "INFO"]))
            .collect::<Vec<u8>>();
        for cut in [1, 3, 5, 9, 20, 1011, 1020, whole.len() - 3] {
            let mut r = Replies::default();
            r.input(&whole[..cut]);
            r.input(&whole[cut..]);
            assert!(r.take(), "cut at {cut}");
            assert_eq!(r.last_command().to_string(), "client");
        }
    }

    #[test]
    fn a_queued_command_makes_exec_node_dependent() {
        let v = verdicts(&[
            resp(&["MULTI"]),
            resp(&["CLIENT", "ID"]),
            resp(&["EXEC"]),
            resp(&["MULTI"]),
            resp(&["INCR", "x"]),
            resp(&["EXEC"]),
        ]);
        assert_eq!(v, [false, false, true, false, false, false]);
        let discarded = verdicts(&[
            resp(&["MULTI"]),
            resp(&["INFO"]),
            resp(&["DISCARD"]),
            resp(&["EXEC"]),
        ]);
        assert_eq!(discarded, [false, false, false, false]);
    }

    #[test]
    fn a_streaming_connection_stays_in_the_class_until_reset() {
        for start in ["MONITOR", "SYNC", "PSYNC"] {
            let v = verdicts(&[
                resp(&[start]),
                resp(&["PING"]),
                resp(&["RESET"]),
                resp(&["PING"]),
            ]);
            assert_eq!(v, [true, true, false, false], "{start}");
        }
    }

    #[test]
    fn inline_commands_are_read_too() {
        assert_eq!(
            verdicts(&[b"client  list\r\n".to_vec(), b"PING\r\n".to_vec()]),
            [true, false]
        );
        assert_eq!(verdicts(&[b"config get port\r\n".to_vec()]), [true]);
        assert_eq!(verdicts(&[b"config set maxmemory 1\r\n".to_vec()]), [false]);
    }

    /// A classifier fed `whole` in reads cut at `cuts` (each taken modulo
    /// the length, in order).
    fn fed_in_cuts(whole: &[u8], cuts: Vec<usize>) -> Replies {
        let mut at: Vec<usize> = cuts.into_iter().map(|c| c % (whole.len() + 1)).collect();
        at.sort_unstable();
        let mut r = Replies::default();
        let mut from = 0;
        for c in at.into_iter().chain([whole.len()]) {
            r.input(&whole[from..c]);
            from = c;
        }
        r
    }

    /// A memcached binary request: opcode `op`, extras, key and value.
    fn binary(op: u8, extras: &[u8], key: &[u8], value: &[u8]) -> Vec<u8> {
        let body = extras.len() + key.len() + value.len();
        let mut out = vec![BIN_REQUEST_MAGIC, op];
        out.extend((key.len() as u16).to_be_bytes());
        out.push(extras.len() as u8);
        out.extend([0, 0, 0]); // data type, vbucket
        out.extend((body as u32).to_be_bytes());
        out.extend([0u8; 12]); // opaque, cas
        out.extend(extras);
        out.extend(key);
        out.extend(value);
        out
    }

    #[test]
    fn memcached_stats_are_known_in_text_and_binary() {
        for text in [
            "stats\r\n",
            "stats settings\r\n",
            "STATS conns\r\n",
            "stats slabs\n",
        ] {
            assert_eq!(verdicts(&[text.as_bytes().to_vec()]), [true], "{text:?}");
        }
        assert_eq!(
            verdicts(&[
                b"get stats\r\n".to_vec(),
                b"set stats 0 0 1\r\nx\r\n".to_vec()
            ]),
            [false, false]
        );
        // A text connection whose value starts with the binary magic stays
        // a text connection.
        let mut value = b"set k 0 0 3\r\n".to_vec();
        value.extend([BIN_REQUEST_MAGIC, b'a', b'b']);
        value.extend(b"\r\n");
        assert_eq!(
            verdicts(&[b"version\r\n".to_vec(), value, b"stats\r\n".to_vec()]),
            [false, false, true]
        );
        // Binary: STAT (with or without a group) is known; a GET of a key
        // named "stats", a SET whose value holds newlines and "stats", not.
        const GET: u8 = 0x00;
        const SET: u8 = 0x01;
        let v = verdicts(&[
            binary(GET, &[], b"stats", &[]),
            binary(SET, &[0; 8], b"k", b"stats\r\nstats\r\n"),
            binary(BIN_OP_STAT, &[], &[], &[]),
            binary(BIN_OP_STAT, &[], b"settings", &[]),
            binary(GET, &[], b"k", &[]),
        ]);
        assert_eq!(v, [false, false, true, true, false]);
        let mut r = Replies::default();
        r.input(&binary(BIN_OP_STAT, &[], &[], &[]));
        assert_eq!(r.last_command().to_string(), "stats");
    }

    proptest::proptest! {
        /// memcached binary requests cut anywhere are classed as read whole.
        #[test]
        fn binary_requests_cut_anywhere_are_classed_alike(
            reqs in proptest::collection::vec((0u8..3, 0usize..40), 1..10),
            cuts in proptest::collection::vec(0usize..600, 0..8),
        ) {
            let whole: Vec<u8> = reqs
                .iter()
                .flat_map(|&(kind, len)| match kind {
                    0 => binary(0x00, &[], &vec![b'k'; len.max(1)], &[]),
                    1 => binary(0x01, &[0; 8], b"key", &vec![b'\n'; len]),
                    _ => binary(BIN_OP_STAT, &[], &b"settings"[..len.min(8)], &[]),
                })
                .collect();
            let mut r = fed_in_cuts(&whole, cuts);
            proptest::prop_assert_eq!(r.take(), reqs.iter().any(|&(kind, _)| kind == 2));
            let last = if reqs.last().unwrap().0 == 2 { "stats" } else { "binary" };
            let got = r.last_command();
            proptest::prop_assert_eq!(got.text(), last);
        }
    }

    proptest::proptest! {
        /// However a connection's bytes are cut into reads, each command
        /// is classed as when read whole, and what the parser keeps
        /// matches a plain reading of the words.
        #[test]
        fn reads_cut_anywhere_class_every_command_alike(
            cmds in proptest::collection::vec(
                proptest::sample::select(vec![
                    vec!["SET", "key:__rand_int__", "xxx"],
                    vec!["client", "list"],
                    vec!["CLIENT", "SETNAME", "a-long-connection-name-here"],
                    vec!["config", "set", "port", "7001"],
                    vec!["config", "set", "maxmemory", "1mb"],
                    vec!["CONFIG", "GET", "*"],
                    vec!["info"],
                    vec!["GET", "a-key-longer-than-sixteen-bytes"],
                    vec!["debug", "object", "k"],
                    vec!["slowlog", "len"],
                ]),
                1..12,
            ),
            cuts in proptest::collection::vec(0usize..400, 0..8),
        ) {
            let whole: Vec<u8> = cmds.iter().flat_map(|c| resp(c)).collect();
            let mut r = fed_in_cuts(&whole, cuts);
            let want = cmds.iter().any(|c| {
                let w = |i: usize| c.get(i).map_or(String::new(), |s| s.to_lowercase());
                match w(0).as_str() {
                    "info" => true,
                    "client" => w(1) == "list",
                    "config" => w(1) == "get" || (w(1) == "set" && w(2) == "port"),
                    "debug" => w(1) == "object",
                    _ => false,
                }
            });
            proptest::prop_assert_eq!(r.take(), want);
            let last = r.last_command();
            proptest::prop_assert_eq!(last.text(), cmds.last().unwrap()[0].to_lowercase());
        }
    }

    #[test]
    fn garbage_neither_panics_nor_counts_as_a_class() {
        let mut r = Replies::default();
        r.input(
            b"*99999999999999999999999\r\n$99999999999999999999\r\nxx\r\n\xff\x00*-1\r\n$-5\r\n",
        );
        r.input(&[0u8; 100]);
        assert!(!r.take());
    }
}
