//! A minimal memcached text-protocol client for the tests.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A minimal memcached text-protocol client.
pub struct Memcache {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

/// One item as a key dump sees it: flags and value (no CAS id).
pub type McItem = (u32, Vec<u8>);

impl Memcache {
    /// Connects to a memcached server.
    pub fn connect(addr: SocketAddr) -> std::io::Result<Memcache> {
        let s = TcpStream::connect(addr)?;
        s.set_read_timeout(Some(Duration::from_secs(60)))?;
        s.set_nodelay(true)?;
        Ok(Memcache {
            r: BufReader::new(s.try_clone()?),
            w: s,
        })
    }

    /// Reads one reply line (without CRLF).
    pub fn line(&mut self) -> std::io::Result<String> {
        let mut l = String::new();
        if self.r.read_line(&mut l)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(l.trim_end_matches("\r\n").to_string())
    }

    /// Sends `bytes` and reads one reply line.
    pub fn request(&mut self, bytes: &[u8]) -> std::io::Result<String> {
        self.w.write_all(bytes)?;
        self.line()
    }

    /// `set`/`add`/`replace`/`append`/`prepend` (or `cas` with `cas`).
    pub fn store(
        &mut self,
        cmd: &str,
        key: &str,
        flags: u32,
        value: &[u8],
        cas: Option<u64>,
    ) -> std::io::Result<String> {
        let cas = cas.map(|c| format!(" {c}")).unwrap_or_default();
        let mut b = format!("{cmd} {key} {flags} 0 {}{cas}\r\n", value.len()).into_bytes();
        b.extend_from_slice(value);
        b.extend_from_slice(b"\r\n");
        self.request(&b)
    }

    /// `gets key`: flags, value and CAS id, or None.
    pub fn gets(&mut self, key: &str) -> std::io::Result<Option<(u32, Vec<u8>, u64)>> {
        self.w.write_all(format!("gets {key}\r\n").as_bytes())?;
        let l = self.line()?;
        if l == "END" {
            return Ok(None);
        }
        let f: Vec<&str> = l.split_whitespace().collect();
        let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, l.clone());
        if f.len() < 5 || f[0] != "VALUE" {
            return Err(bad());
        }
        let flags: u32 = f[2].parse().map_err(|_| bad())?;
        let len: usize = f[3].parse().map_err(|_| bad())?;
        let cas: u64 = f[4].parse().map_err(|_| bad())?;
        let mut v = vec![0u8; len + 2];
        self.r.read_exact(&mut v)?;
        v.truncate(len);
        let end = self.line()?;
        if end != "END" {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, end));
        }
        Ok(Some((flags, v, cas)))
    }

    /// Every key, from `lru_crawler metadump all` (percent-decoded).
    pub fn keys(&mut self) -> std::io::Result<Vec<String>> {
        self.w.write_all(b"lru_crawler metadump all\r\n")?;
        let mut keys = Vec::new();
        loop {
            let l = self.line()?;
            if l == "END" {
                return Ok(keys);
            }
            if l.starts_with("ERROR") || l.starts_with("BUSY") || l.starts_with("CLIENT_ERROR") {
                return Err(std::io::Error::other(l));
            }
            if let Some(k) = l.split_whitespace().find_map(|f| f.strip_prefix("key=")) {
                keys.push(percent_decode(k));
            }
        }
    }

    /// Every item: key → (flags, value), CAS ids left out. The keys come
    /// from memcached's crawler, which may miss items its LRU maintainer
    /// moves meanwhile: to compare replicas, read known keys ([`items`]).
    ///
    /// [`items`]: Memcache::items
    pub fn dump(&mut self) -> std::io::Result<std::collections::BTreeMap<String, McItem>> {
        let keys = self.keys()?;
        self.items(keys)
    }

    /// The items of `keys` that exist: key → (flags, value), CAS ids left
    /// out.
    pub fn items(
        &mut self,
        keys: impl IntoIterator<Item = String>,
    ) -> std::io::Result<std::collections::BTreeMap<String, McItem>> {
        let mut out = std::collections::BTreeMap::new();
        for k in keys {
            if let Some((flags, v, _)) = self.gets(&k)? {
                out.insert(k, (flags, v));
            }
        }
        Ok(out)
    }
}

/// `s` with its `%XX` escapes decoded.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(x) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(x);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).to_string()
}
