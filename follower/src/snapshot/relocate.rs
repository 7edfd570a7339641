//! Moving a server image to another node. CRIU records each open file,
//! mapping, directory and socket of the server by its path or address,
//! and a few of those belong to the node that took the image: its region
//! file (`/dev/shm/lockstep-<cluster>-<node>`), its server's working
//! directory and log, and its app address (the listener, and both ends of
//! every replay connection). Restored unchanged on another node, the
//! server would map the peer's region, write into the peer's directory and
//! collide with the peer's listener (on one host), or fail to bind (on
//! another). [`Relocation`] rewrites those records in a copy of the
//! image's `files.img`; everything else in the image (memory, the TCP
//! streams' state, the other files) is node-independent and is used as it
//! is. The restored preload notices that its region belongs to another
//! node and takes that node's identity (see the preload's `setup`).
//!
//! `files.img` is two magic words and then length-prefixed protobuf
//! `file_entry` messages (CRIU's `images/fdinfo.proto`); only the fields
//! named below are read, everything else is copied byte for byte, and an
//! entry that needs no change is not re-encoded.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::protobuf::{
    bad, encode, parse, repeated_u32, set_repeated_u32, set_varint, varint_field, ImageError,
    WIRE_LEN,
};

/// The file of an image directory that says where it was taken.
pub const ORIGIN_FILE: &str = "origin.json";
/// CRIU's image of the server's files, sockets included.
pub const FILES_IMG: &str = "files.img";

/// Where an image was taken: the node and what of its paths and addresses
/// the image names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    /// The node whose server it is.
    pub node: u64,
    /// That node's app address.
    pub app: SocketAddr,
    /// That node's region file.
    pub region: PathBuf,
    /// The server's working directory then.
    pub cwd: Option<PathBuf>,
    /// Where the server's stdin, stdout and stderr pointed (regular files
    /// only).
    pub stdio: Vec<Option<PathBuf>>,
}

/// What to change in an image taken on another node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Relocation {
    /// A file at (or a socket or directory under) `.0` moves to `.1`;
    /// the first that matches wins.
    pub paths: Vec<(PathBuf, PathBuf)>,
    /// The image's app address and this node's.
    pub app: Option<(SocketAddr, SocketAddr)>,
}

/// What [`Relocation::rewrite_files_img`] changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// File and socket paths.
    pub paths: usize,
    /// Socket addresses (an end of a socket each).
    pub addrs: usize,
}

// file_entry (fdinfo.proto) and the fields read of its parts.
const FE_REG: u32 = 3;
const FE_ISK: u32 = 4;
const FE_USK: u32 = 16;
const REG_NAME: u32 = 6;
const ISK_FAMILY: u32 = 3;
const ISK_SRC_PORT: u32 = 7;
const ISK_DST_PORT: u32 = 8;
const ISK_SRC_ADDR: u32 = 11;
const ISK_DST_ADDR: u32 = 12;
const USK_NAME: u32 = 11;
const USK_NAME_DIR: u32 = 14;
const AF_INET: u64 = 2;
const AF_INET6: u64 = 10;

/// An address as CRIU stores it: the words of `in_addr`/`in6_addr` in
/// the machine's byte order.
fn ip_of(family: u64, words: &[u32]) -> Option<IpAddr> {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    match (family, bytes.len()) {
        (AF_INET, 4) => Some(IpAddr::V4(Ipv4Addr::new(
            bytes[0], bytes[1], bytes[2], bytes[3],
        ))),
        (AF_INET6, 16) => Some(IpAddr::V6(Ipv6Addr::from(
            <[u8; 16]>::try_from(bytes.as_slice()).ok()?,
        ))),
        _ => None,
    }
}

fn words_of(ip: IpAddr) -> Vec<u32> {
    let bytes: Vec<u8> = match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    };
    bytes
        .chunks(4)
        .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// IPv4-mapped IPv6 as IPv4.
fn canon(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// `ip` in the family of a socket of `family` (None: it has no form there).
fn in_family(ip: IpAddr, family: u64) -> Option<IpAddr> {
    match (canon(ip), family) {
        (IpAddr::V4(v4), AF_INET) => Some(IpAddr::V4(v4)),
        (IpAddr::V4(v4), AF_INET6) => Some(IpAddr::V6(v4.to_ipv6_mapped())),
        (IpAddr::V6(v6), AF_INET6) => Some(IpAddr::V6(v6)),
        _ => None,
    }
}

impl Relocation {
    /// The relocation of an image taken at `from` to a node at `to`.
    pub fn between(from: &Origin, to: &Origin) -> Relocation {
        let mut paths = vec![(from.region.clone(), to.region.clone())];
        if let (Some(a), Some(b)) = (&from.cwd, &to.cwd) {
            paths.push((a.clone(), b.clone()));
        }
        for (a, b) in from.stdio.iter().zip(&to.stdio) {
            if let (Some(a), Some(b)) = (a, b) {
                paths.push((a.clone(), b.clone()));
            }
        }
        paths.retain(|(a, b)| a != b);
        Relocation {
            paths,
            app: (from.app != to.app).then_some((from.app, to.app)),
        }
    }

    /// Where `path` (as an image names it) moves, if it does.
    fn path(&self, path: &[u8]) -> Option<Vec<u8>> {
        for (from, to) in &self.paths {
            let from = from.as_os_str().as_encoded_bytes();
            let to = to.as_os_str().as_encoded_bytes();
            if path == from {
                return Some(to.to_vec());
            }
            if path.len() > from.len() && path.starts_with(from) && path[from.len()] == b'/' {
                let mut p = to.to_vec();
                p.extend_from_slice(&path[from.len()..]);
                return Some(p);
            }
        }
        None
    }

    /// Where a socket end at `ip:port` moves: the image's app address (a
    /// wildcard listener stands for each of the host's addresses, so any
    /// address with the app's port is one, loopback included) becomes this
    /// node's, keeping a wildcard a wildcard and a specific address where
    /// this node names none.
    ///
    /// Any other end at the image host's own address (the client end of a
    /// replay connection, the preload's tcp transport connections to the
    /// peers) moves to this node's address with its port: on another host
    /// the old address is not there to bind, and CRIU could not restore
    /// the image at all. (A moved connection to a peer is dead — the peer
    /// never knew it — and is replaced when it is next used.)
    fn endpoint(&self, ip: IpAddr, port: u16, family: u64) -> Option<(IpAddr, u16)> {
        let (from, to) = self.app?;
        let (ip_c, from_c) = (canon(ip), canon(from.ip()));
        if port != from.port() {
            let moves = ip_c == from_c
                && !from_c.is_unspecified()
                && !to.ip().is_unspecified()
                && canon(to.ip()) != from_c;
            return moves.then(|| (in_family(to.ip(), family).unwrap_or(ip), port));
        }
        if !(ip_c == from_c || ip_c.is_unspecified() || from_c.is_unspecified()) {
            return None;
        }
        let new_ip = if ip_c.is_unspecified() || to.ip().is_unspecified() {
            ip
        } else {
            in_family(to.ip(), family).unwrap_or(ip)
        };
        Some((new_ip, to.port()))
    }

    /// Rewrites one `file_entry`; None when nothing in it moves.
    fn entry(&self, msg: &[u8], changes: &mut Changes) -> Result<Option<Vec<u8>>, ImageError> {
        let mut fields = parse(msg)?;
        let mut changed = false;
        for f in fields.iter_mut().filter(|f| f.wire == WIRE_LEN) {
            let inner = match f.num {
                FE_REG => self.reg(&f.bytes, changes)?,
                FE_USK => self.usk(&f.bytes, changes)?,
                FE_ISK => self.isk(&f.bytes, changes)?,
                _ => None,
            };
            if let Some(inner) = inner {
                f.bytes = Cow::Owned(inner);
                changed = true;
            }
        }
        Ok(changed.then(|| encode(&fields)))
    }

    fn reg(&self, msg: &[u8], changes: &mut Changes) -> Result<Option<Vec<u8>>, ImageError> {
        self.rename(msg, &[REG_NAME], changes)
    }

    fn usk(&self, msg: &[u8], changes: &mut Changes) -> Result<Option<Vec<u8>>, ImageError> {
        // An absolute name, or a relative one with its directory.
        self.rename(msg, &[USK_NAME, USK_NAME_DIR], changes)
    }

    /// Moves the path fields `nums` of a message.
    fn rename(
        &self,
        msg: &[u8],
        nums: &[u32],
        changes: &mut Changes,
    ) -> Result<Option<Vec<u8>>, ImageError> {
        let mut fields = parse(msg)?;
        let mut changed = false;
        for f in fields
            .iter_mut()
            .filter(|f| f.wire == WIRE_LEN && nums.contains(&f.num))
        {
            if let Some(p) = self.path(&f.bytes) {
                f.bytes = Cow::Owned(p);
                changes.paths += 1;
                changed = true;
            }
        }
        Ok(changed.then(|| encode(&fields)))
    }

    fn isk(&self, msg: &[u8], changes: &mut Changes) -> Result<Option<Vec<u8>>, ImageError> {
        if self.app.is_none() {
            return Ok(None);
        }
        let mut fields = parse(msg)?;
        let family =
            varint_field(&fields, ISK_FAMILY).ok_or_else(|| bad("socket without family"))?;
        let mut changed = false;
        for (port_num, addr_num) in [(ISK_SRC_PORT, ISK_SRC_ADDR), (ISK_DST_PORT, ISK_DST_ADDR)] {
            let Some(port) = varint_field(&fields, port_num) else {
                continue;
            };
            let Some(ip) = ip_of(family, &repeated_u32(&fields, addr_num)?) else {
                continue;
            };
            if let Some((ip2, port2)) = self.endpoint(ip, port as u16, family) {
                set_varint(&mut fields, port_num, u64::from(port2));
                set_repeated_u32(&mut fields, addr_num, &words_of(ip2));
                changes.addrs += 1;
                changed = true;
            }
        }
        Ok(changed.then(|| encode(&fields)))
    }

    /// `files.img` with this relocation applied, and what changed.
    pub fn rewrite_files_img(&self, img: &[u8]) -> Result<(Vec<u8>, Changes), ImageError> {
        let head = img.get(..8).ok_or_else(|| bad("shorter than its magic"))?;
        let mut out = head.to_vec();
        let mut changes = Changes::default();
        let mut at = 8;
        while at < img.len() {
            let len = img
                .get(at..at + 4)
                .ok_or_else(|| bad("truncated entry length"))?;
            let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
            let msg = img
                .get(at + 4..at + 4 + len)
                .ok_or_else(|| bad(format!("entry at byte {at} runs past the end")))?;
            match self.entry(msg, &mut changes)? {
                Some(new) => {
                    out.extend_from_slice(&(new.len() as u32).to_le_bytes());
                    out.extend_from_slice(&new);
                }
                None => out.extend_from_slice(&img[at..at + 4 + len]),
            }
            at += 4 + len;
        }
        Ok((out, changes))
    }

    /// A copy of the image in `src` relocated into the empty directory
    /// `dst`: every file hard-linked (copied across file systems) but
    /// `files.img`, which is rewritten.
    pub fn copy_image(&self, src: &Path, dst: &Path) -> anyhow::Result<Changes> {
        use anyhow::Context;
        std::fs::create_dir_all(dst).with_context(|| format!("cannot create {}", dst.display()))?;
        let mut changes = Changes::default();
        for e in std::fs::read_dir(src).with_context(|| format!("cannot read {}", src.display()))? {
            let e = e?;
            if !e.file_type()?.is_file() {
                continue;
            }
            let (from, to) = (e.path(), dst.join(e.file_name()));
            if e.file_name() == FILES_IMG {
                let img = std::fs::read(&from)?;
                let (new, c) = self.rewrite_files_img(&img)?;
                std::fs::write(&to, new)?;
                changes = c;
            } else if std::fs::hard_link(&from, &to).is_err() {
                std::fs::copy(&from, &to)
                    .with_context(|| format!("cannot copy {}", from.display()))?;
            }
        }
        Ok(changes)
    }
}

/// `path` with node `from`'s id replaced by `to`'s in its last component
/// that names it as a number of its own (`server-2.log` → `server-3.log`):
/// where a node's file is when no server of this node shows it.
pub fn swap_node_id(path: &Path, from: u64, to: u64) -> Option<PathBuf> {
    let from_s = from.to_string();
    let comps: Vec<_> = path.components().collect();
    for (i, c) in comps.iter().enumerate().rev() {
        let s = c.as_os_str().to_str()?;
        let mut out = String::new();
        let mut found = false;
        let mut rest = s;
        while !rest.is_empty() {
            let digits = rest.chars().take_while(char::is_ascii_digit).count();
            if digits > 0 {
                let (num, tail) = rest.split_at(digits);
                if num == from_s {
                    out.push_str(&to.to_string());
                    found = true;
                } else {
                    out.push_str(num);
                }
                rest = tail;
            } else {
                let other = rest
                    .char_indices()
                    .find(|(_, ch)| ch.is_ascii_digit())
                    .map_or(rest.len(), |(i, _)| i);
                out.push_str(&rest[..other]);
                rest = &rest[other..];
            }
        }
        if found {
            let mut p: PathBuf = comps[..i].iter().collect();
            p.push(out);
            p.extend(&comps[i + 1..]);
            return Some(p);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::super::protobuf::build::{lfield, vfield};
    use super::*;

    /// A file_entry of a regular file at `path`.
    fn reg_entry(id: u64, path: &str) -> Vec<u8> {
        let mut reg = Vec::new();
        vfield(1, id, &mut reg);
        vfield(2, 0o2, &mut reg);
        vfield(3, 0, &mut reg);
        lfield(5, &[8, 0, 16, 0], &mut reg);
        lfield(REG_NAME, path.as_bytes(), &mut reg);
        vfield(8, 1 << 20, &mut reg);
        let mut fe = Vec::new();
        vfield(1, 1, &mut fe);
        vfield(2, id, &mut fe);
        lfield(FE_REG, &reg, &mut fe);
        fe
    }

    /// A file_entry of an IPv4 TCP socket `src` → `dst`.
    fn isk_entry(id: u64, src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
        let mut isk = Vec::new();
        vfield(1, id, &mut isk);
        vfield(2, 900 + id, &mut isk);
        vfield(ISK_FAMILY, AF_INET, &mut isk);
        vfield(ISK_SRC_PORT, u64::from(src.port()), &mut isk);
        vfield(ISK_DST_PORT, u64::from(dst.port()), &mut isk);
        vfield(9, 0x802, &mut isk);
        for w in words_of(src.ip()) {
            vfield(ISK_SRC_ADDR, u64::from(w), &mut isk);
        }
        for w in words_of(dst.ip()) {
            vfield(ISK_DST_ADDR, u64::from(w), &mut isk);
        }
        lfield(13, &[8, 0], &mut isk);
        let mut fe = Vec::new();
        vfield(1, 4, &mut fe);
        vfield(2, id, &mut fe);
        lfield(FE_ISK, &isk, &mut fe);
        fe
    }

    fn image(entries: &[Vec<u8>]) -> Vec<u8> {
        let mut img = b"CVT810VY".to_vec();
        for e in entries {
            img.extend_from_slice(&(e.len() as u32).to_le_bytes());
            img.extend_from_slice(e);
        }
        img
    }

    fn entries(img: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut at = 8;
        while at < img.len() {
            let len = u32::from_le_bytes(img[at..at + 4].try_into().unwrap()) as usize;
            out.push(img[at + 4..at + 4 + len].to_vec());
            at += 4 + len;
        }
        out
    }

    fn origin(node: u64, port: u16) -> Origin {
        Origin {
            node,
            app: format!("127.0.0.1:{port}").parse().unwrap(),
            region: format!("/dev/shm/lockstep-c-{node}").into(),
            cwd: Some(format!("/var/lib/c/server-{node}").into()),
            stdio: vec![None, Some(format!("/var/lib/c/server-{node}.log").into())],
        }
    }

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_peers_paths_and_app_address_become_this_nodes() {
        let r = Relocation::between(&origin(2, 7002), &origin(13, 7013));
        let img = image(&[
            reg_entry(1, "/usr/bin/redis-server"),
            reg_entry(2, "/dev/shm/lockstep-c-2"),
            reg_entry(3, "/var/lib/c/server-2"),
            reg_entry(4, "/var/lib/c/server-2/dump.rdb"),
            reg_entry(5, "/var/lib/c/server-2.log"),
            reg_entry(6, "/var/lib/c/server-20"),
            isk_entry(7, a("127.0.0.1:7002"), a("0.0.0.0:0")),
            isk_entry(8, a("127.0.0.1:7002"), a("127.0.0.1:41000")),
            isk_entry(9, a("127.0.0.1:41000"), a("127.0.0.1:7002")),
            isk_entry(10, a("127.0.0.1:41001"), a("127.0.0.1:6379")),
        ]);
        let (out, changes) = r.rewrite_files_img(&img).unwrap();
        assert_eq!(changes, Changes { paths: 4, addrs: 3 });
        let (before, after) = (entries(&img), entries(&out));
        assert_eq!(after.len(), before.len());
        assert_eq!(
            after[0], before[0],
            "an untouched entry is copied as it was"
        );
        assert_eq!(after[5], before[5], "server-20 is not under server-2");
        assert_eq!(after[9], before[9], "another port is left alone");
        assert_eq!(after[1], reg_entry(2, "/dev/shm/lockstep-c-13"));
        assert_eq!(after[2], reg_entry(3, "/var/lib/c/server-13"));
        assert_eq!(after[3], reg_entry(4, "/var/lib/c/server-13/dump.rdb"));
        assert_eq!(after[4], reg_entry(5, "/var/lib/c/server-13.log"));
        assert_eq!(after[6], isk_entry(7, a("127.0.0.1:7013"), a("0.0.0.0:0")));
        assert_eq!(
            after[7],
            isk_entry(8, a("127.0.0.1:7013"), a("127.0.0.1:41000"))
        );
        assert_eq!(
            after[8],
            isk_entry(9, a("127.0.0.1:41000"), a("127.0.0.1:7013"))
        );
        // The same node: nothing to do.
        let same = Relocation::between(&origin(2, 7002), &origin(2, 7002));
        assert_eq!(same, Relocation::default());
        assert_eq!(same.rewrite_files_img(&img).unwrap().0, img);
    }

    #[test]
    fn wildcard_listeners_and_other_hosts_addresses() {
        // Between hosts: one port, two addresses.
        let r = Relocation {
            paths: vec![],
            app: Some((a("10.0.0.2:6379"), a("10.0.0.3:6379"))),
        };
        let img = image(&[
            isk_entry(1, a("10.0.0.2:6379"), a("0.0.0.0:0")),
            isk_entry(2, a("127.0.0.1:40000"), a("10.0.0.2:6379")),
            // A replay connection's two ends, and the preload's transport
            // connection to a peer's control port: every end at the old
            // host's address moves (CRIU binds it back at restore).
            isk_entry(3, a("10.0.0.2:44608"), a("10.0.0.2:6379")),
            isk_entry(4, a("10.0.0.2:6379"), a("10.0.0.2:44608")),
            isk_entry(5, a("10.0.0.2:34174"), a("10.0.0.4:7100")),
        ]);
        let (out, changes) = r.rewrite_files_img(&img).unwrap();
        let after = entries(&out);
        assert_eq!(after[0], isk_entry(1, a("10.0.0.3:6379"), a("0.0.0.0:0")));
        assert_eq!(
            after[1],
            isk_entry(2, a("127.0.0.1:40000"), a("10.0.0.3:6379"))
        );
        assert_eq!(
            after[2],
            isk_entry(3, a("10.0.0.3:44608"), a("10.0.0.3:6379"))
        );
        assert_eq!(
            after[3],
            isk_entry(4, a("10.0.0.3:6379"), a("10.0.0.3:44608"))
        );
        assert_eq!(
            after[4],
            isk_entry(5, a("10.0.0.3:34174"), a("10.0.0.4:7100"))
        );
        assert_eq!(changes.addrs, 2 + 4 + 1);
        // A wildcard app: the listener stays a wildcard, loopback ends
        // keep their address.
        let r = Relocation {
            paths: vec![],
            app: Some((a("0.0.0.0:7002"), a("0.0.0.0:7003"))),
        };
        let img = image(&[
            isk_entry(1, a("0.0.0.0:7002"), a("0.0.0.0:0")),
            isk_entry(2, a("127.0.0.1:7002"), a("127.0.0.1:40000")),
        ]);
        let after = entries(&r.rewrite_files_img(&img).unwrap().0);
        assert_eq!(after[0], isk_entry(1, a("0.0.0.0:7003"), a("0.0.0.0:0")));
        assert_eq!(
            after[1],
            isk_entry(2, a("127.0.0.1:7003"), a("127.0.0.1:40000"))
        );
    }

    #[test]
    fn a_malformed_image_is_an_error_not_a_panic() {
        let r = Relocation::between(&origin(2, 7002), &origin(3, 7003));
        let img = image(&[reg_entry(2, "/dev/shm/lockstep-c-2")]);
        for cut in 0..img.len() {
            let _ = r.rewrite_files_img(&img[..cut]);
        }
        assert!(r.rewrite_files_img(&img[..img.len() - 3]).is_err());
        assert!(r.rewrite_files_img(b"CVT").is_err());
        let mut garbage = img.clone();
        garbage[13] = 0xff;
        let _ = r.rewrite_files_img(&garbage);
    }

    #[test]
    fn a_node_id_is_swapped_in_the_last_component_that_names_it() {
        let p = |s: &str| PathBuf::from(s);
        assert_eq!(
            swap_node_id(&p("/tmp/disk2/server-2.log"), 2, 3),
            Some(p("/tmp/disk2/server-3.log"))
        );
        assert_eq!(
            swap_node_id(&p("/tmp/t31076-c/server-2"), 2, 11),
            Some(p("/tmp/t31076-c/server-11"))
        );
        assert_eq!(
            swap_node_id(&p("/tmp/node2/data"), 2, 3),
            Some(p("/tmp/node3/data"))
        );
        assert_eq!(swap_node_id(&p("/tmp/server-20.log"), 2, 3), None);
        assert_eq!(swap_node_id(&p("/var/log/redis.log"), 2, 3), None);
    }
}
