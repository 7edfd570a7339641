//! One client connection's state (its protocol, name, subscriptions) and
//! the replies to its commands, as a Redis Sentinel gives them.

use lockstep_common::resp::{Proto, Value};

use super::glob::glob;
use super::view::SentinelView;

/// The Redis version this endpoint answers as in `HELLO`: the Sentinel
/// protocol of Redis 7.2 (RESP3, `HELLO`, `CLIENT SETINFO`).
pub const VERSION: &str = "7.2.0";

/// One connection's protocol state.
#[derive(Debug, Default)]
pub struct ClientConn {
    /// The connection's id (`CLIENT ID`, `HELLO`'s `id`).
    pub id: u64,
    /// What replies and messages are encoded in.
    pub proto: Proto,
    name: Option<Vec<u8>>,
    channels: Vec<Vec<u8>>,
    patterns: Vec<Vec<u8>>,
    /// Set by `QUIT`: close after the reply.
    pub quit: bool,
}

fn lower(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_ascii_lowercase()
}

fn error(text: impl Into<String>) -> Value {
    Value::Error(text.into())
}

fn arity(cmd: &str) -> Value {
    error(format!("ERR wrong number of arguments for '{cmd}' command"))
}

/// Redis's rule for client names: printable, no spaces.
fn valid_name(name: &[u8]) -> bool {
    name.iter().all(|&c| (b'!'..=b'~').contains(&c))
}

const BAD_NAME: &str = "ERR Client names cannot contain spaces, newlines or special characters.";

impl ClientConn {
    /// A fresh connection with id `id`, speaking RESP2.
    pub fn new(id: u64) -> Self {
        ClientConn {
            id,
            ..ClientConn::default()
        }
    }

    /// Whether the connection is in subscribe mode.
    pub fn subscribed(&self) -> bool {
        !self.channels.is_empty() || !self.patterns.is_empty()
    }

    fn count(&self) -> i64 {
        (self.channels.len() + self.patterns.len()) as i64
    }

    /// The replies to one command (several for (un)subscribing to several
    /// channels), to be encoded in [`ClientConn::proto`] as it is afterwards
    /// (`HELLO 3` answers in RESP3 already, as Redis does).
    pub fn handle(&mut self, snap: &SentinelView, args: &[Vec<u8>]) -> Vec<Value> {
        let Some(cmd) = args.first() else {
            return vec![];
        };
        let cmd = lower(cmd);
        let rest = &args[1..];
        // A RESP3 connection may run any command while subscribed; RESP2
        // has no way to tell replies from messages.
        let restricted = self.subscribed() && self.proto == Proto::Resp2;
        match cmd.as_str() {
            "subscribe" | "psubscribe" | "unsubscribe" | "punsubscribe" => {
                self.subscription(&cmd, rest)
            }
            "ping" if restricted => vec![Value::Array(vec![
                Value::bulk("pong"),
                Value::bulk(rest.first().cloned().unwrap_or_default()),
            ])],
            "quit" => {
                self.quit = true;
                vec![Value::Simple("OK".into())]
            }
            _ if restricted => vec![error(format!(
                "ERR Can't execute '{cmd}': only (P)SUBSCRIBE / (P)UNSUBSCRIBE / PING / QUIT are allowed in this context"
            ))],
            "ping" => vec![match rest.first() {
                Some(m) => Value::Bulk(m.clone()),
                None => Value::Simple("PONG".into()),
            }],
            "hello" => vec![self.hello(rest)],
            "client" => vec![self.client(rest)],
            "role" => vec![Value::Array(vec![
                Value::bulk("sentinel"),
                Value::Array(vec![Value::bulk(&snap.name)]),
            ])],
            "info" => vec![Value::bulk(snap.info())],
            "sentinel" => vec![snap.sentinel_command(rest)],
            _ => vec![error(format!("ERR unknown command '{cmd}'"))],
        }
    }

    /// `HELLO [protover [AUTH user pass] [SETNAME name]]`: switches the
    /// protocol and answers Sentinel's map (no `role` field: Sentinel has
    /// none). No password is configured, so `AUTH default <any>` passes,
    /// as with Redis's `nopass` default user.
    fn hello(&mut self, args: &[Vec<u8>]) -> Value {
        let mut proto = self.proto;
        let mut opts = args;
        if let Some(v) = args.first() {
            proto = match std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.parse::<i64>().ok())
            {
                Some(2) => Proto::Resp2,
                Some(3) => Proto::Resp3,
                Some(_) => return error("NOPROTO unsupported protocol version"),
                None => return error("ERR Protocol version is not an integer or out of range"),
            };
            opts = &args[1..];
        }
        let mut name = None;
        let mut i = 0;
        while i < opts.len() {
            let more = opts.len() - 1 - i;
            match lower(&opts[i]).as_str() {
                "auth" if more >= 2 => {
                    if opts[i + 1] != b"default" {
                        return error(
                            "WRONGPASS invalid username-password pair or user is disabled.",
                        );
                    }
                    i += 3;
                }
                "setname" if more >= 1 => {
                    if !valid_name(&opts[i + 1]) {
                        return error(BAD_NAME);
                    }
                    name = Some(opts[i + 1].clone());
                    i += 2;
                }
                _ => {
                    return error(format!(
                        "ERR Syntax error in HELLO option '{}'",
                        String::from_utf8_lossy(&opts[i])
                    ))
                }
            }
        }
        if let Some(n) = name {
            self.set_name(n);
        }
        self.proto = proto;
        Value::Map(vec![
            (Value::bulk("server"), Value::bulk("redis")),
            (Value::bulk("version"), Value::bulk(VERSION)),
            (Value::bulk("proto"), Value::Int(proto.number())),
            (Value::bulk("id"), Value::Int(self.id as i64)),
            (Value::bulk("mode"), Value::bulk("sentinel")),
            (Value::bulk("modules"), Value::Array(vec![])),
        ])
    }

    fn set_name(&mut self, name: Vec<u8>) {
        self.name = if name.is_empty() { None } else { Some(name) };
    }

    /// `CLIENT SETNAME|GETNAME|SETINFO|ID`.
    fn client(&mut self, args: &[Vec<u8>]) -> Value {
        let Some(sub) = args.first() else {
            return arity("client");
        };
        let sub = lower(sub);
        match (sub.as_str(), &args[1..]) {
            ("setname", [name]) if !valid_name(name) => error(BAD_NAME),
            ("setname", [name]) => {
                self.set_name(name.clone());
                Value::Simple("OK".into())
            }
            ("getname", []) => self.name.as_ref().map_or(Value::Null, Value::bulk),
            ("setinfo", [attr, value]) => match lower(attr).as_str() {
                "lib-name" | "lib-ver" if valid_name(value) => Value::Simple("OK".into()),
                "lib-name" | "lib-ver" => error(format!(
                    "ERR {} cannot contain spaces, newlines or special characters.",
                    lower(attr)
                )),
                _ => error(format!(
                    "ERR Unrecognized option '{}'",
                    String::from_utf8_lossy(attr)
                )),
            },
            ("id", []) => Value::Int(self.id as i64),
            ("setname" | "getname" | "setinfo" | "id", _) => arity(&format!("client|{sub}")),
            _ => error(format!("ERR unknown subcommand '{sub}'. Try CLIENT HELP.")),
        }
    }

    fn subscription(&mut self, cmd: &str, names: &[Vec<u8>]) -> Vec<Value> {
        let plain = matches!(cmd, "subscribe" | "unsubscribe");
        let subscribing = !cmd.contains("unsub");
        if subscribing && names.is_empty() {
            return vec![arity(cmd)];
        }
        let names: Vec<Vec<u8>> = if !subscribing && names.is_empty() {
            if plain {
                self.channels.clone()
            } else {
                self.patterns.clone()
            }
        } else {
            names.to_vec()
        };
        let mut out = Vec::new();
        for name in &names {
            let list = if plain {
                &mut self.channels
            } else {
                &mut self.patterns
            };
            if subscribing {
                if !list.contains(name) {
                    list.push(name.clone());
                }
            } else {
                list.retain(|n| n != name);
            }
            out.push(Value::Push(vec![
                Value::bulk(cmd),
                Value::Bulk(name.clone()),
                Value::Int(self.count()),
            ]));
        }
        if out.is_empty() {
            out.push(Value::Push(vec![
                Value::bulk(cmd),
                Value::Null,
                Value::Int(self.count()),
            ]));
        }
        out
    }

    /// The messages this session gets for `payload` published on `channel`.
    pub fn deliver(&self, channel: &str, payload: &str) -> Vec<Value> {
        let mut out = Vec::new();
        if self.channels.iter().any(|c| c == channel.as_bytes()) {
            out.push(Value::Push(vec![
                Value::bulk("message"),
                Value::bulk(channel),
                Value::bulk(payload),
            ]));
        }
        for p in &self.patterns {
            if glob(p, channel.as_bytes()) {
                out.push(Value::Push(vec![
                    Value::bulk("pmessage"),
                    Value::Bulk(p.clone()),
                    Value::bulk(channel),
                    Value::bulk(payload),
                ]));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::all_up;
    use super::*;

    fn args(cmd: &str) -> Vec<Vec<u8>> {
        cmd.split(' ').map(|s| s.as_bytes().to_vec()).collect()
    }

    /// Runs `cmd` and returns its replies as the session encodes them.
    fn run(session: &mut ClientConn, cmd: &str) -> String {
        let mut out = Vec::new();
        for v in session.handle(&all_up(2), &args(cmd)) {
            out.extend(v.encode(session.proto));
        }
        String::from_utf8(out).unwrap()
    }

    fn hello_map(proto: u8, id: u64) -> String {
        format!("$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$5\r\n7.2.0\r\n$5\r\nproto\r\n:{proto}\r\n$2\r\nid\r\n:{id}\r\n$4\r\nmode\r\n$8\r\nsentinel\r\n$7\r\nmodules\r\n*0\r\n")
    }

    #[test]
    fn hello_switches_the_protocol_and_answers_sentinels_map() {
        let mut s = ClientConn::new(9);
        assert_eq!(run(&mut s, "HELLO"), format!("*12\r\n{}", hello_map(2, 9)));
        assert_eq!(s.proto, Proto::Resp2);
        assert_eq!(run(&mut s, "HELLO 3"), format!("%6\r\n{}", hello_map(3, 9)));
        assert_eq!(s.proto, Proto::Resp3);
        assert_eq!(run(&mut s, "HELLO"), format!("%6\r\n{}", hello_map(3, 9)));
        assert_eq!(
            run(&mut s, "HELLO 2"),
            format!("*12\r\n{}", hello_map(2, 9))
        );
        assert_eq!(s.proto, Proto::Resp2);
        assert_eq!(
            run(&mut s, "HELLO 3 AUTH default anything SETNAME app-1"),
            format!("%6\r\n{}", hello_map(3, 9))
        );
        assert_eq!(run(&mut s, "CLIENT GETNAME"), "$5\r\napp-1\r\n");
        let mut s = ClientConn::new(1);
        assert_eq!(
            run(&mut s, "HELLO 4"),
            "-NOPROTO unsupported protocol version\r\n"
        );
        assert_eq!(
            run(&mut s, "HELLO three"),
            "-ERR Protocol version is not an integer or out of range\r\n"
        );
        assert_eq!(
            run(&mut s, "HELLO 3 AUTH alice pw"),
            "-WRONGPASS invalid username-password pair or user is disabled.\r\n"
        );
        assert_eq!(
            run(&mut s, "HELLO 3 SETNAME"),
            "-ERR Syntax error in HELLO option 'SETNAME'\r\n"
        );
        assert_eq!(s.proto, Proto::Resp2, "a refused HELLO switches nothing");
    }

    #[test]
    fn client_names_and_infos() {
        let mut s = ClientConn::new(4);
        assert_eq!(run(&mut s, "CLIENT GETNAME"), "$-1\r\n");
        assert_eq!(run(&mut s, "CLIENT SETNAME worker"), "+OK\r\n");
        assert_eq!(run(&mut s, "client getname"), "$6\r\nworker\r\n");
        assert_eq!(run(&mut s, "CLIENT SETINFO LIB-NAME redis-py"), "+OK\r\n");
        assert_eq!(run(&mut s, "CLIENT SETINFO lib-ver 8.1.0"), "+OK\r\n");
        assert_eq!(
            run(&mut s, "CLIENT SETINFO color red"),
            "-ERR Unrecognized option 'color'\r\n"
        );
        assert_eq!(run(&mut s, "CLIENT ID"), ":4\r\n");
        assert!(run(&mut s, "CLIENT KILL x").starts_with("-ERR unknown subcommand 'kill'"));
        assert!(run(&mut s, "CLIENT SETNAME").starts_with("-ERR wrong number of arguments"));
        s.proto = Proto::Resp3;
        assert_eq!(run(&mut s, "CLIENT SETNAME "), "+OK\r\n");
        assert_eq!(run(&mut s, "CLIENT GETNAME"), "_\r\n");
    }

    #[test]
    fn subscriptions_in_resp2() {
        let mut s = ClientConn::new(1);
        assert_eq!(
            run(&mut s, "SUBSCRIBE +switch-master"),
            "*3\r\n$9\r\nsubscribe\r\n$14\r\n+switch-master\r\n:1\r\n"
        );
        assert_eq!(
            run(&mut s, "psubscribe *"),
            "*3\r\n$10\r\npsubscribe\r\n$1\r\n*\r\n:2\r\n"
        );
        assert!(s.subscribed());
        assert!(run(&mut s, "INFO").starts_with("-ERR Can't execute 'info'"));
        assert_eq!(run(&mut s, "PING"), "*2\r\n$4\r\npong\r\n$0\r\n\r\n");
        let payload = "shop 127.0.0.1 7001 127.0.0.1 7002";
        let msgs = s.deliver(SWITCH, payload);
        assert_eq!(msgs.len(), 2);
        assert_eq!(
            msgs[0].encode(Proto::Resp2),
            b"*3\r\n$7\r\nmessage\r\n$14\r\n+switch-master\r\n$34\r\nshop 127.0.0.1 7001 127.0.0.1 7002\r\n".to_vec()
        );
        assert!(msgs[1]
            .encode(Proto::Resp2)
            .starts_with(b"*4\r\n$8\r\npmessage\r\n$1\r\n*\r\n"));
        assert_eq!(
            run(&mut s, "UNSUBSCRIBE"),
            "*3\r\n$11\r\nunsubscribe\r\n$14\r\n+switch-master\r\n:1\r\n"
        );
        assert_eq!(s.deliver(SWITCH, payload).len(), 1);
        assert_eq!(
            run(&mut s, "PUNSUBSCRIBE"),
            "*3\r\n$12\r\npunsubscribe\r\n$1\r\n*\r\n:0\r\n"
        );
        assert_eq!(
            run(&mut s, "UNSUBSCRIBE"),
            "*3\r\n$11\r\nunsubscribe\r\n$-1\r\n:0\r\n"
        );
        assert!(!s.subscribed());
    }

    const SWITCH: &str = "+switch-master";

    #[test]
    fn subscriptions_in_resp3_are_push_messages() {
        let mut s = ClientConn::new(1);
        run(&mut s, "HELLO 3");
        assert_eq!(
            run(&mut s, "SUBSCRIBE +switch-master"),
            ">3\r\n$9\r\nsubscribe\r\n$14\r\n+switch-master\r\n:1\r\n"
        );
        assert_eq!(run(&mut s, "PING"), "+PONG\r\n");
        assert!(run(&mut s, "SENTINEL get-master-addr-by-name shop").starts_with("*2\r\n"));
        let msgs = s.deliver(SWITCH, "shop 127.0.0.1 7001 127.0.0.1 7002");
        assert_eq!(
            msgs[0].encode(s.proto),
            b">3\r\n$7\r\nmessage\r\n$14\r\n+switch-master\r\n$34\r\nshop 127.0.0.1 7001 127.0.0.1 7002\r\n".to_vec()
        );
        assert_eq!(
            run(&mut s, "UNSUBSCRIBE"),
            ">3\r\n$11\r\nunsubscribe\r\n$14\r\n+switch-master\r\n:0\r\n"
        );
        assert_eq!(
            run(&mut s, "UNSUBSCRIBE"),
            ">3\r\n$11\r\nunsubscribe\r\n_\r\n:0\r\n"
        );
    }
}
