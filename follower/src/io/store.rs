//! The follower's durable log: RocksDB with one key per run of entries
//! that lay back to back in the ring (the run's first seq, big-endian, so
//! iteration is log order; see [`crate::io::entry_run`]) and a `meta`
//! column family for the view, commit and applied marks.
//!
//! A stored value is the run's ring position (u64 LE) followed by the
//! encoded entries, so a node that catches up from a peer knows where the
//! next entry starts in the ring. A value of one entry is what every value
//! was before runs: older stores read the same (a store written with runs
//! cannot be read by a build from before them).
//!
//! The log may start after seq 1: entries a snapshot covers are deleted
//! ([`LogStore::compact_through`]), and a node that installed a peer's
//! snapshot starts its log after it ([`LogStore::restart_after`]). The
//! meta key `base` then names the entry just before the oldest one kept
//! (seq, view, ring end), which is the log's end while nothing follows.

use std::path::Path;
use std::sync::Arc;

use lockstep_common::config::Durability;
use lockstep_common::entry::{self, EntryHeader};
use rocksdb::{
    ColumnFamilyDescriptor, CompactOptions, DBRawIterator, Options, WriteBatch, WriteOptions, DB,
};

use super::entry_run::{self, RunBuilder, RunEntry};
use super::recent_runs::RecentRuns;

const META: &str = "meta";
const K_VIEW: &[u8] = b"view";
const K_COMMIT: &[u8] = b"commit";
const K_APPLIED: &[u8] = b"applied";
const K_LOG_VIEW: &[u8] = b"log_view";
const K_BASE: &[u8] = b"base";
const K_ORIGIN: &[u8] = b"origin";

/// Why the store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// RocksDB reported an error.
    #[error("rocksdb: {0}")]
    Db(#[from] rocksdb::Error),
    /// A stored value does not decode.
    #[error("stored entry {seq} is corrupt: {what}")]
    Corrupt {
        /// Seq of the bad entry.
        seq: u64,
        /// What is wrong.
        what: String,
    },
    /// An append would leave a gap or go backwards.
    #[error("append of seq {got} but the log ends at {last}")]
    Gap {
        /// Seq offered.
        got: u64,
        /// Last stored seq.
        last: u64,
    },
}

/// One stored entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredEntry {
    /// Ring position where the entry starts.
    pub pos: u64,
    /// The encoded entry (header, payload, canary).
    pub bytes: Vec<u8>,
}

/// A stored entry read in place (see [`LogStore::visit`]), checked.
#[derive(Clone, Copy, Debug)]
pub struct Visited<'a> {
    /// Its seq.
    pub seq: u64,
    /// Ring position where it starts.
    pub pos: u64,
    /// Its header.
    pub header: EntryHeader,
    /// Its payload.
    pub payload: &'a [u8],
    /// The whole encoded entry (header, payload, canary).
    pub bytes: &'a [u8],
}

impl StoredEntry {
    /// Decodes the header (the bytes were checked when stored).
    pub fn header(&self) -> EntryHeader {
        EntryHeader::parse(&self.bytes).expect("stored entries were checked")
    }
    /// The payload bytes.
    pub fn payload(&self) -> &[u8] {
        let h = self.header();
        &self.bytes[entry::HEADER_LEN..entry::HEADER_LEN + h.len as usize]
    }
    /// Ring position just past this entry.
    pub fn end(&self) -> u64 {
        self.pos + self.bytes.len() as u64
    }
}

/// The last stored entry's identity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogEnd {
    /// Its seq (0: empty log).
    pub seq: u64,
    /// Its view.
    pub view: u64,
    /// Ring position just past it.
    pub end_pos: u64,
}

/// RocksDB-backed log store.
pub struct LogStore {
    /// Shared with a [`Reclaim`] that compacts a deleted prefix away
    /// while the store's users go on writing.
    db: Arc<DB>,
    /// Writes of entries and of the marks that follow them: synced with
    /// `durability = "fsync"` only. Made once, as `synced` (each write
    /// made its own: a RocksDB allocation and free per append).
    appends: WriteOptions,
    /// Writes that must be on disk when they return (views, a restart
    /// after an image, a cut): always synced.
    synced: WriteOptions,
    last: LogEnd,
    base: LogEnd,
    /// The newest runs as written, for reads right behind the ingest.
    recent: RecentRuns,
    /// The runs of the append being written (kept: no list allocated per
    /// append).
    written: Vec<(u64, Vec<u8>)>,
}

/// What [`LogStore::compact_through`] deleted.
#[must_use = "run `reclaim` once the store's lock is let go, or the disk space stays taken"]
pub struct Deleted {
    /// Entries deleted.
    pub entries: u64,
    /// The compaction that gives their disk space back (none when nothing
    /// was deleted).
    pub reclaim: Option<Reclaim>,
}

/// A compaction of a deleted prefix of the log. RocksDB compacts beside
/// the writes, so it runs without the store's lock.
pub struct Reclaim {
    db: Arc<DB>,
    end: [u8; 8],
}

impl Reclaim {
    /// Syncs the write-ahead log (the deletion with it), drops the files
    /// wholly inside the deleted range (cheap: no data is rewritten), then
    /// compacts what is left of it (blocks for as long as that takes,
    /// beside RocksDB's own compactions rather than instead of them).
    pub fn run(self) {
        // The deletion must be on disk before any file goes: dropping one
        // is synced into RocksDB's manifest at once, while the deletion's
        // write may sit in the page cache (memory-ack), and a power loss
        // between the two would leave holes inside the log the node says
        // it holds.
        if let Err(e) = self.db.flush_wal(true) {
            log::warn!("syncing the log before reclaiming its deleted prefix: {e}");
            return;
        }
        // RocksDB's range here includes its end: the last deleted key.
        let last = u64::from_be_bytes(self.end).saturating_sub(1);
        if last > 0 {
            if let Err(e) = self.db.delete_file_in_range(key(0), key(last)) {
                log::warn!("dropping the deleted log's files: {e}");
            }
        }
        let mut opts = CompactOptions::default();
        opts.set_exclusive_manual_compaction(false);
        self.db
            .compact_range_opt(None::<&[u8]>, Some(&self.end), &opts);
    }
}

impl Deleted {
    /// Gives the deleted entries' disk space back now; returns how many
    /// were deleted.
    pub fn reclaim_now(self) -> u64 {
        if let Some(r) = self.reclaim {
            r.run();
        }
        self.entries
    }
}

fn key(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

fn u64_value(v: Option<Vec<u8>>) -> u64 {
    v.and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
        .unwrap_or(0)
}

/// A memtable's size: once full it is flushed to a table file while a new
/// one takes the writes.
const MEMTABLE_BYTES: usize = 32 << 20;

/// Memtables a column family may hold, the one taking writes included:
/// RocksDB stops every write while this many wait for their flush (and,
/// above three, slows writes down once all but one wait). Four: a second
/// and a third filling while one is flushed neither stop nor slow the log.
const MEMTABLES: i32 = 4;

/// The write-ahead log's bound: past it RocksDB flushes the column families
/// that hold the oldest WAL file back, so it can go. RocksDB's default is
/// four times all memtables (about 1 GiB here), and the `meta` column
/// family, written rarely, holds every WAL file back until then: measured,
/// a 100 MB Redis at 4 M entries kept 1.1 GB per node with 240 MB of
/// snapshots and a log a few hundred MB long. Four memtables' worth: the
/// entries' own memtables are flushed long before, so the bound flushes
/// `meta` alone. (At one memtable's worth, the bound fell due as each
/// memtable filled: the entries' column family switched memtables twice in
/// a row and RocksDB stopped all writes until the first flush ended, every
/// acknowledgement held 100–250 ms every few seconds under load.)
const WAL_LIMIT: u64 = 4 * MEMTABLE_BYTES as u64;

// The rule the stall broke: the WAL bound must not fall due as one
// memtable fills, and one extra switch must not stop the writes.
const _: () = assert!(WAL_LIMIT >= 2 * MEMTABLE_BYTES as u64 && MEMTABLES >= 3);

impl LogStore {
    /// Opens (creating if needed) the store at `dir`.
    pub fn open(dir: &Path, durability: Durability) -> Result<LogStore, StoreError> {
        Self::open_with(dir, durability, WAL_LIMIT)
    }

    fn open_with(
        dir: &Path,
        durability: Durability,
        wal_limit: u64,
    ) -> Result<LogStore, StoreError> {
        let mut opts = Options::default();
        opts.set_max_total_wal_size(wal_limit);
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        // Entries are small, short-lived (deleted below the next snapshot)
        // and mostly incompressible inputs: compressing them costs the
        // flushes and compactions CPU the servers need. A column family
        // takes its own options, not the DB's: each gets these.
        opts.set_compression_type(rocksdb::DBCompressionType::None);
        opts.set_write_buffer_size(MEMTABLE_BYTES);
        opts.set_max_write_buffer_number(MEMTABLES);
        let cfs = vec![
            ColumnFamilyDescriptor::new(rocksdb::DEFAULT_COLUMN_FAMILY_NAME, opts.clone()),
            ColumnFamilyDescriptor::new(META, opts.clone()),
        ];
        let db = DB::open_cf_descriptors(&opts, dir, cfs)?;
        let write_options = |sync| {
            let mut wo = WriteOptions::default();
            wo.set_sync(sync);
            wo
        };
        let mut store = LogStore {
            db: Arc::new(db),
            appends: write_options(durability == Durability::Fsync),
            synced: write_options(true),
            last: LogEnd::default(),
            base: LogEnd::default(),
            recent: RecentRuns::default(),
            written: Vec::new(),
        };
        store.base = store.read_base()?;
        store.last = store.scan_last()?;
        Ok(store)
    }

    fn read_base(&self) -> Result<LogEnd, StoreError> {
        let cf = self.db.cf_handle(META).expect("meta column family");
        let Some(v) = self.db.get_cf(cf, K_BASE)? else {
            return Ok(LogEnd::default());
        };
        let word = |i: usize| {
            v.get(i * 8..i * 8 + 8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
        };
        match (word(0), word(1), word(2)) {
            (Some(seq), Some(view), Some(end_pos)) => Ok(LogEnd { seq, view, end_pos }),
            _ => Err(StoreError::Corrupt {
                seq: 0,
                what: "bad base record".into(),
            }),
        }
    }

    fn base_value(base: LogEnd) -> [u8; 24] {
        let mut v = [0u8; 24];
        v[..8].copy_from_slice(&base.seq.to_le_bytes());
        v[8..16].copy_from_slice(&base.view.to_le_bytes());
        v[16..].copy_from_slice(&base.end_pos.to_le_bytes());
        v
    }

    fn scan_last(&self) -> Result<LogEnd, StoreError> {
        let mut it = self.db.raw_iterator();
        it.seek_to_last();
        let Some((first, v)) = Self::run_at(&it)? else {
            return Ok(self.base);
        };
        let mut last = None;
        for e in Self::run_entries(first, v) {
            last = Some(e?);
        }
        let e = last.ok_or(StoreError::Corrupt {
            seq: first,
            what: "empty run".into(),
        })?;
        let stored = Self::check(&e)?;
        Ok(LogEnd {
            seq: e.seq,
            view: stored.header.view,
            end_pos: e.pos + e.bytes.len() as u64,
        })
    }

    /// The run the iterator is at: its first seq and value (None past the
    /// end).
    fn run_at<'a>(it: &'a DBRawIterator<'_>) -> Result<Option<(u64, &'a [u8])>, StoreError> {
        it.status()?;
        let (Some(k), Some(v)) = (it.key(), it.value()) else {
            return Ok(None);
        };
        let first = u64::from_be_bytes(k.try_into().map_err(|_| StoreError::Corrupt {
            seq: 0,
            what: "bad key".into(),
        })?);
        Ok(Some((first, v)))
    }

    /// The entries of the run stored under `first`, errors as the store's.
    fn run_entries(first: u64, v: &[u8]) -> impl Iterator<Item = Result<RunEntry<'_>, StoreError>> {
        entry_run::entries(first, v).map(|r| r.map_err(Self::run_error))
    }

    fn run_error(e: entry_run::RunError) -> StoreError {
        StoreError::Corrupt {
            seq: e.seq(),
            what: e.to_string(),
        }
    }

    /// Checks one entry of a run (its header, length and CRC).
    fn check<'a>(e: &RunEntry<'a>) -> Result<Visited<'a>, StoreError> {
        let (header, payload) =
            entry::decode(e.bytes, u32::MAX).map_err(|err| StoreError::Corrupt {
                seq: e.seq,
                what: err.to_string(),
            })?;
        Ok(Visited {
            seq: e.seq,
            pos: e.pos,
            header,
            payload,
            bytes: e.bytes,
        })
    }

    /// An iterator at the run that holds `seq`, or at the first run after
    /// it when none does (or past the end).
    fn seek_run(&self, seq: u64) -> DBRawIterator<'_> {
        let mut it = self.db.raw_iterator();
        it.seek_for_prev(key(seq));
        if !it.valid() {
            it.seek(key(seq));
        }
        it
    }

    /// Identity of the last stored entry (the base while the log is
    /// empty after a compaction or a snapshot install).
    pub fn last(&self) -> LogEnd {
        self.last
    }

    /// Bytes the log takes in RocksDB: its tables and memtables (an
    /// estimate RocksDB keeps; 0 when it cannot say).
    pub fn disk_bytes(&self) -> u64 {
        [
            "rocksdb.total-sst-files-size",
            "rocksdb.cur-size-all-mem-tables",
        ]
        .iter()
        .filter_map(|p| self.db.property_int_value(*p).ok().flatten())
        .sum()
    }

    /// The first seq the log holds (or would hold next, when empty):
    /// entries below it were compacted or never stored.
    pub fn oldest(&self) -> u64 {
        self.base.seq + 1
    }

    /// The view of entry `seq` when it is the (compacted) entry this log
    /// starts after; None for any other seq.
    pub fn base_view_at(&self, seq: u64) -> Option<u64> {
        (seq != 0 && seq == self.base.seq).then_some(self.base.view)
    }

    /// Deletes every entry up to `seq` (a snapshot a majority holds covers
    /// them; see `protocol::snapshot::compaction_point`): one range delete
    /// with the new base and a commit point at least `seq` (compacted
    /// entries were committed: a restart must not probe or cut below
    /// them), as durable as an append. Nothing past the log's end;
    /// already compacted seqs are a no-op. The disk space comes back when
    /// the returned [`Deleted::reclaim`] runs, which the caller does after
    /// letting go of the store: a compaction takes 100 ms and more, and an
    /// ingest waiting on the store's lock meanwhile held every commit.
    pub fn compact_through(&mut self, seq: u64) -> Result<Deleted, StoreError> {
        let seq = seq.min(self.last.seq);
        if seq <= self.base.seq {
            return Ok(Deleted {
                entries: 0,
                reclaim: None,
            });
        }
        let base = if seq == self.last.seq {
            self.last
        } else {
            let e = self.get(seq)?.ok_or(StoreError::Corrupt {
                seq,
                what: "missing below the log's end".into(),
            })?;
            LogEnd {
                seq,
                view: e.header().view,
                end_pos: e.end(),
            }
        };
        let deleted = seq - self.base.seq;
        // Runs wholly at or below seq go; the one that holds seq + 1
        // stays whole (readers skip what it holds below the base).
        let cut = if seq < self.last.seq {
            self.run_start(seq + 1)?.unwrap_or(seq + 1).min(seq + 1)
        } else {
            seq + 1
        };
        let cf = self.db.cf_handle(META).expect("meta column family");
        let mut batch = WriteBatch::default();
        batch.delete_range(key(0), key(cut));
        batch.put_cf(cf, K_BASE, Self::base_value(base));
        batch.put_cf(cf, K_COMMIT, self.commit()?.max(seq).to_le_bytes());
        // As durable as an append here, not more (an fsync here held the
        // store's lock, and with it every ack, for the disk's time); the
        // reclaim syncs it before it drops any file. Should the machine
        // lose it before, the entries come back whole with the old base
        // (committed entries a snapshot also holds: harmless).
        self.db.write_opt(batch, &self.appends)?;
        self.base = base;
        if self.last.seq == seq {
            self.last = base;
            self.recent.clear();
        } else {
            self.recent.forget_through(seq);
        }
        Ok(Deleted {
            entries: deleted,
            reclaim: Some(Reclaim {
                db: Arc::clone(&self.db),
                end: key(cut),
            }),
        })
    }

    /// Makes the log start after `base` (a peer's snapshot at `base.seq`
    /// was installed): every stored entry goes, the next append is
    /// `base.seq + 1`, the commit point is at least `base.seq`. One synced
    /// write.
    pub fn restart_after(&mut self, base: LogEnd) -> Result<(), StoreError> {
        let cf = self.db.cf_handle(META).expect("meta column family");
        let mut batch = WriteBatch::default();
        batch.delete_range(key(0), key(u64::MAX));
        batch.delete(key(u64::MAX));
        batch.put_cf(cf, K_BASE, Self::base_value(base));
        batch.put_cf(cf, K_COMMIT, self.commit()?.max(base.seq).to_le_bytes());
        self.db.write_opt(batch, &self.synced)?;
        self.base = base;
        self.last = base;
        self.recent.clear();
        self.db.compact_range(None::<&[u8]>, None::<&[u8]>);
        Ok(())
    }

    /// Appends entries `(pos, encoded bytes)` that must continue the log
    /// without a gap; one RocksDB write (fsynced in `fsync` mode), one key
    /// per run of entries back to back in the ring.
    pub fn append(&mut self, entries: &[(u64, &[u8])]) -> Result<(), StoreError> {
        self.append_from(entries.iter().copied()).map(|_| ())
    }

    /// [`Self::append`] from an iterator (gone through twice: once to size
    /// the runs' buffers, so that the ingest path allocates per run, not
    /// per entry); returns how many entries it appended.
    pub fn append_from<'a>(
        &mut self,
        entries: impl Iterator<Item = (u64, &'a [u8])> + Clone,
    ) -> Result<u64, StoreError> {
        let total: usize = entries.clone().map(|(_, b)| b.len()).sum();
        if total == 0 {
            return Ok(0);
        }
        let mut last = self.last;
        let mut runs = RunBuilder::expecting(total);
        let mut written = std::mem::take(&mut self.written);
        written.clear();
        let mut n = 0;
        for (pos, bytes) in entries {
            let h = EntryHeader::parse(bytes).map_err(|e| StoreError::Corrupt {
                seq: last.seq + 1,
                what: e.to_string(),
            })?;
            if h.seq != last.seq + 1 {
                return Err(StoreError::Gap {
                    got: h.seq,
                    last: last.seq,
                });
            }
            if bytes.len() != h.footprint() {
                // Runs split at footprints: the ring's entries are exactly that.
                return Err(StoreError::Corrupt {
                    seq: h.seq,
                    what: format!("{} bytes for a footprint of {}", bytes.len(), h.footprint()),
                });
            }
            written.extend(runs.push(h.seq, pos, bytes));
            last = LogEnd {
                seq: h.seq,
                view: h.view,
                end_pos: pos + bytes.len() as u64,
            };
            n += 1;
        }
        written.extend(runs.take());
        let mut batch = WriteBatch::default();
        for (first, value) in &written {
            batch.put(key(*first), value);
        }
        self.db.write_opt(batch, &self.appends)?;
        self.last = last;
        for (first, value) in written.drain(..) {
            self.recent.push(first, value);
        }
        self.written = written;
        Ok(n)
    }

    /// The entry with seq `seq`, if stored (never one below the base: a
    /// run the compaction kept may still hold some).
    pub fn get(&self, seq: u64) -> Result<Option<StoredEntry>, StoreError> {
        if seq <= self.base.seq {
            return Ok(None);
        }
        let mut first = self.chunk(seq, 1, usize::MAX)?.into_iter();
        Ok(first.next().filter(|(q, _)| *q == seq).map(|(_, e)| e))
    }

    /// Up to `max` entries starting at `from`, in order (the tests' read;
    /// the apply thread reads in place, see [`Self::visit`]).
    #[cfg(test)]
    pub fn range(&self, from: u64, max: usize) -> Result<Vec<(u64, StoredEntry)>, StoreError> {
        self.chunk(from, max, usize::MAX)
    }

    /// Up to `max` entries starting at `from`, in order, stopping after
    /// the entry that reaches `max_bytes` of encoded entries (at least
    /// one entry, whatever its size): one chunk of a fetch's answer.
    pub fn chunk(
        &self,
        from: u64,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<(u64, StoredEntry)>, StoreError> {
        let mut out = Vec::new();
        let mut bytes = 0;
        self.visit(from, max, |e| {
            bytes += e.bytes.len();
            out.push((
                e.seq,
                StoredEntry {
                    pos: e.pos,
                    bytes: e.bytes.to_vec(),
                },
            ));
            bytes < max_bytes
        })?;
        Ok(out)
    }

    /// Hands `visit` up to `max` stored entries from `from` on, in order
    /// and in place (checked, not copied: the apply thread copies each
    /// straight into the apply ring), until it returns false or the log
    /// ends. Nothing past them is read or checked.
    pub fn visit(
        &self,
        from: u64,
        max: usize,
        mut visit: impl FnMut(Visited<'_>) -> bool,
    ) -> Result<(), StoreError> {
        let from = from.max(self.base.seq + 1);
        let mut left = max;
        // Visits the entries from `from` on until told to stop (returns
        // false then).
        let mut take = |entries: &mut dyn Iterator<Item = Result<RunEntry<'_>, StoreError>>| {
            for e in entries {
                if left == 0 {
                    return Ok(false);
                }
                let e = e?;
                if e.seq < from {
                    continue;
                }
                left -= 1;
                if !visit(Self::check(&e)?) {
                    return Ok(false);
                }
            }
            Ok::<bool, StoreError>(true)
        };
        if let Some(recent) = self.recent.entries_from(from) {
            take(&mut recent.map(|r| r.map_err(Self::run_error)))?;
        } else {
            let mut it = self.seek_run(from);
            while let Some((first, v)) = Self::run_at(&it)? {
                if !take(&mut Self::run_entries(first, v))? {
                    break;
                }
                it.next();
            }
        }
        Ok(())
    }

    /// Removes every entry after `seq` (uncommitted tail of an old view).
    /// Never below the base: compacted entries were committed, and the
    /// entries after them are fetched again rather than left as a gap.
    pub fn truncate_after(&mut self, seq: u64) -> Result<(), StoreError> {
        if seq < self.base.seq {
            log::error!(
                "asked to cut the log after seq {seq}, below its compacted start {}: cutting after {0} instead",
                self.base.seq
            );
        }
        let seq = seq.max(self.base.seq);
        if seq >= self.last.seq {
            return Ok(());
        }
        let mut batch = WriteBatch::default();
        // The run that holds seq + 1 keeps its entries up to seq.
        if let Some((first, kept)) = self.run_prefix_through(seq)? {
            batch.put(key(first), kept);
        }
        batch.delete_range(key(seq + 1), key(u64::MAX));
        batch.delete(key(u64::MAX));
        self.db.write_opt(batch, &self.synced)?;
        self.recent.clear();
        self.last = self.scan_last()?;
        Ok(())
    }

    /// When the run that holds `seq + 1` starts at or before `seq`: its
    /// first seq and the value of its entries up to `seq`.
    fn run_prefix_through(&self, seq: u64) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
        let mut it = self.db.raw_iterator();
        it.seek_for_prev(key(seq + 1));
        let Some((first, v)) = Self::run_at(&it)? else {
            return Ok(None);
        };
        if first > seq {
            return Ok(None);
        }
        let mut runs = RunBuilder::default();
        for e in Self::run_entries(first, v) {
            let e = e?;
            if e.seq > seq {
                break;
            }
            // One run in, one run out: the entries were one run before.
            let _ = runs.push(e.seq, e.pos, e.bytes);
        }
        Ok(runs.take())
    }

    /// The first seq of the run that holds `seq`.
    fn run_start(&self, seq: u64) -> Result<Option<u64>, StoreError> {
        let mut it = self.db.raw_iterator();
        it.seek_for_prev(key(seq));
        Ok(Self::run_at(&it)?.map(|(first, _)| first))
    }

    fn meta_get(&self, k: &[u8]) -> Result<u64, StoreError> {
        let cf = self.db.cf_handle(META).expect("meta column family");
        Ok(u64_value(self.db.get_cf(cf, k)?))
    }

    fn meta_put_synced(&self, k: &[u8], v: u64) -> Result<(), StoreError> {
        let cf = self.db.cf_handle(META).expect("meta column family");
        self.db.put_cf_opt(cf, k, v.to_le_bytes(), &self.synced)?;
        Ok(())
    }

    fn meta_put(&self, k: &[u8], v: u64) -> Result<(), StoreError> {
        let cf = self.db.cf_handle(META).expect("meta column family");
        self.db.put_cf_opt(cf, k, v.to_le_bytes(), &self.appends)?;
        Ok(())
    }

    /// Stored view (0: never set).
    pub fn view(&self) -> Result<u64, StoreError> {
        self.meta_get(K_VIEW)
    }
    /// Stores the view (always synced: a promise to refuse older views).
    pub fn set_view(&self, v: u64) -> Result<(), StoreError> {
        self.meta_put_synced(K_VIEW, v)
    }
    /// The view whose leader this log follows (0: none yet).
    pub fn log_view(&self) -> Result<u64, StoreError> {
        self.meta_get(K_LOG_VIEW)
    }

    /// Records the view whose leader this log follows (synced: always
    /// durable, a restart must not forget it).
    pub fn set_log_view(&self, v: u64) -> Result<(), StoreError> {
        self.meta_put_synced(K_LOG_VIEW, v)
    }

    /// When the cluster's log began, µs since the epoch (0: not known):
    /// kept apart from the log, which compaction cuts.
    pub fn origin(&self) -> Result<u64, StoreError> {
        self.meta_get(K_ORIGIN)
    }
    /// Records when the cluster's log began (synced: it never changes).
    pub fn set_origin(&self, us: u64) -> Result<(), StoreError> {
        self.meta_put_synced(K_ORIGIN, us)
    }

    /// Stored commit mark.
    pub fn commit(&self) -> Result<u64, StoreError> {
        self.meta_get(K_COMMIT)
    }
    /// Stores the commit mark.
    pub fn set_commit(&self, v: u64) -> Result<(), StoreError> {
        self.meta_put(K_COMMIT, v)
    }
    /// Stored applied mark.
    pub fn applied(&self) -> Result<u64, StoreError> {
        self.meta_get(K_APPLIED)
    }
    /// Stores the applied mark.
    pub fn set_applied(&self, v: u64) -> Result<(), StoreError> {
        self.meta_put(K_APPLIED, v)
    }

    /// Flushes memtables and WAL (clean shutdown).
    pub fn flush(&self) -> Result<(), StoreError> {
        self.db.flush_wal(true)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_common::entry::{encode, Kind};

    fn e(seq: u64, view: u64, payload: &[u8]) -> Vec<u8> {
        encode(&EntryHeader::new(Kind::Data, view, seq, 1, 0), payload)
    }

    fn tmpdir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("lockstep-store-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn append_get_range_and_reopen() {
        let d = tmpdir("basic");
        {
            let mut s = LogStore::open(&d, Durability::MemoryAck).unwrap();
            assert_eq!(s.last(), LogEnd::default());
            let a = e(1, 1, b"hello");
            let b = e(2, 1, b"world");
            s.append(&[(0, &a), (128, &b)]).unwrap();
            assert_eq!(s.last().seq, 2);
            assert_eq!(s.last().end_pos, 128 + b.len() as u64);
            assert_eq!(s.get(2).unwrap().unwrap().payload(), b"world");
            assert!(matches!(
                s.append(&[(0, &e(5, 1, b""))]),
                Err(StoreError::Gap { got: 5, last: 2 })
            ));
            s.set_applied(2).unwrap();
            s.set_view(3).unwrap();
        }
        let s = LogStore::open(&d, Durability::Fsync).unwrap();
        assert_eq!(s.last().seq, 2);
        assert_eq!(s.applied().unwrap(), 2);
        assert_eq!(s.view().unwrap(), 3);
        let r = s.range(1, 10).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].1.pos, 0);
        assert_eq!(r[1].1.payload(), b"world");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn truncate_drops_the_tail() {
        let d = tmpdir("trunc");
        let mut s = LogStore::open(&d, Durability::MemoryAck).unwrap();
        let es: Vec<Vec<u8>> = (1..=5).map(|i| e(i, 1, b"x")).collect();
        let refs: Vec<(u64, &[u8])> = es
            .iter()
            .enumerate()
            .map(|(i, b)| (i as u64 * 128, b.as_slice()))
            .collect();
        s.append(&refs).unwrap();
        s.truncate_after(3).unwrap();
        assert_eq!(s.last().seq, 3);
        assert!(s.get(4).unwrap().is_none());
        s.append(&[(384, &e(4, 2, b"new"))]).unwrap();
        assert_eq!(s.get(4).unwrap().unwrap().header().view, 2);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn visit_hands_out_entries_in_place_from_memory_and_from_disk_and_stops_when_told() {
        let d = tmpdir("visit");
        let seen = |s: &LogStore, from: u64, max: usize| {
            let mut out = Vec::new();
            s.visit(from, max, |v| {
                assert_eq!(v.header.seq, v.seq);
                assert_eq!(v.payload, format!("p{}", v.seq).as_bytes());
                assert_eq!(v.bytes.len(), v.header.footprint());
                out.push((v.seq, v.pos));
                true
            })
            .unwrap();
            out
        };
        let mut s = LogStore::open(&d, Durability::MemoryAck).unwrap();
        let es: Vec<Vec<u8>> = (1..=6)
            .map(|i| e(i, 1, format!("p{i}").as_bytes()))
            .collect();
        let mut pos = 0;
        let mut refs = Vec::new();
        for b in &es {
            refs.push((pos, b.as_slice()));
            pos += b.len() as u64;
        }
        assert_eq!(s.append_from(refs.iter().copied()).unwrap(), 6);
        assert_eq!(s.append_from(std::iter::empty()).unwrap(), 0);
        let want: Vec<(u64, u64)> = (3..=6).map(|i| (i, refs[i as usize - 1].0)).collect();
        // From the recent runs (what the apply thread reads under load).
        assert_eq!(seen(&s, 3, 10), want);
        assert_eq!(seen(&s, 3, 2), want[..2]);
        drop(s);
        // From RocksDB's values (a reopened store has no recent runs).
        let s = LogStore::open(&d, Durability::MemoryAck).unwrap();
        assert_eq!(seen(&s, 3, 10), want);
        assert_eq!(seen(&s, 3, 1), want[..1]);
        assert!(seen(&s, 7, 10).is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }

    fn append_n(s: &mut LogStore, from: u64, to: u64, payload: &[u8]) {
        let es: Vec<Vec<u8>> = (from..=to).map(|i| e(i, 1, payload)).collect();
        let mut pos = s.last().end_pos;
        let mut refs = Vec::new();
        for b in &es {
            refs.push((pos, b.as_slice()));
            pos += b.len() as u64;
        }
        s.append(&refs).unwrap();
    }

    fn disk_bytes(dir: &std::path::Path) -> u64 {
        std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok()?.metadata().ok())
            .filter(|m| m.is_file())
            .map(|m| m.len())
            .sum()
    }

    #[test]
    fn compaction_deletes_the_prefix_frees_the_disk_and_survives_a_reopen() {
        let d = tmpdir("compact");
        // Incompressible, as RocksDB compresses what repeats.
        let mut x = 0x9e3779b97f4a7c15u64;
        let payload: Vec<u8> = (0..4000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let mut s = LogStore::open(&d, Durability::MemoryAck).unwrap();
        append_n(&mut s, 1, 3000, &payload);
        s.flush().unwrap();
        s.db.flush().unwrap();
        let before = disk_bytes(&d);
        assert!(before > 3000 * 4000, "{before}");
        let end_2000 = s.get(2000).unwrap().unwrap().end();
        assert_eq!(s.compact_through(2000).unwrap().reclaim_now(), 2000);
        assert_eq!(s.oldest(), 2001);
        assert!(s.get(2000).unwrap().is_none());
        assert_eq!(s.range(1, 10).unwrap()[0].0, 2001);
        assert!(s.commit().unwrap() >= 2000);
        let after = disk_bytes(&d);
        assert!(after < before / 2, "{after} of {before} bytes left");
        // A cut below the base keeps the base; appends go on after the end.
        s.truncate_after(10).unwrap();
        assert_eq!(s.last().seq, 2000);
        assert_eq!(s.last().end_pos, end_2000);
        append_n(&mut s, 2001, 2002, b"x");
        drop(s);
        let s = LogStore::open(&d, Durability::MemoryAck).unwrap();
        assert_eq!(s.oldest(), 2001);
        assert_eq!(s.last().seq, 2002);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_compactions_reclaim_runs_beside_appends_and_keeps_every_live_entry() {
        let d = tmpdir("reclaim");
        let payload = vec![0x5a; 4000];
        let mut s = LogStore::open(&d, Durability::MemoryAck).unwrap();
        // Several files, the oldest wholly below the compaction point.
        for chunk in 0..6 {
            append_n(&mut s, chunk * 500 + 1, chunk * 500 + 500, &payload);
            s.db.flush().unwrap();
        }
        let deleted = s.compact_through(2000).unwrap();
        assert_eq!(deleted.entries, 2000);
        // The reclaim owns what it needs: the store is free for appends
        // (the ingest's) while it runs.
        let reclaim = std::thread::spawn(move || deleted.reclaim_now());
        append_n(&mut s, 3001, 4000, &payload);
        assert_eq!(reclaim.join().unwrap(), 2000);
        assert_eq!(s.oldest(), 2001);
        assert!(s.get(2000).unwrap().is_none());
        assert_eq!(s.range(2001, 1).unwrap()[0].0, 2001);
        assert_eq!(s.last().seq, 4000);
        drop(s);
        let s = LogStore::open(&d, Durability::MemoryAck).unwrap();
        assert_eq!((s.oldest(), s.last().seq), (2001, 4000));
        assert_eq!(s.range(2001, 2000).unwrap().len(), 2000);
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Bytes of the write-ahead log files in `dir`.
    fn wal_bytes(dir: &Path) -> u64 {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
            .map(|e| e.metadata().unwrap().len())
            .sum()
    }

    #[test]
    fn the_write_ahead_log_stays_bounded_while_the_log_is_compacted() {
        let d = tmpdir("wal");
        let limit = 1 << 20;
        let mut s = LogStore::open_with(&d, Durability::MemoryAck, limit).unwrap();
        let payload = vec![7u8; 4000];
        // 16 MB of entries, the meta column family written now and then
        // and the log compacted behind, as a follower does.
        let mut peak = 0;
        for chunk in 0..40u64 {
            let first = chunk * 100 + 1;
            append_n(&mut s, first, first + 99, &payload);
            s.set_applied(first + 99).unwrap();
            if chunk >= 4 {
                s.compact_through(first - 300).unwrap().reclaim_now();
            }
            peak = peak.max(wal_bytes(&d));
        }
        assert!(peak < 4 * limit, "the WAL grew to {peak} bytes");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_log_restarted_after_an_installed_snapshot_appends_from_there() {
        let d = tmpdir("restart");
        let mut s = LogStore::open(&d, Durability::MemoryAck).unwrap();
        append_n(&mut s, 1, 5, b"old");
        let base = LogEnd {
            seq: 900,
            view: 3,
            end_pos: 4096,
        };
        s.restart_after(base).unwrap();
        assert_eq!(s.last(), base);
        assert_eq!(s.oldest(), 901);
        assert!(s.get(3).unwrap().is_none());
        assert!(matches!(
            s.append(&[(0, &e(6, 1, b""))]),
            Err(StoreError::Gap { got: 6, last: 900 })
        ));
        append_n(&mut s, 901, 902, b"new");
        drop(s);
        let s = LogStore::open(&d, Durability::MemoryAck).unwrap();
        assert_eq!(s.last().seq, 902);
        assert_eq!(s.oldest(), 901);
        assert!(s.commit().unwrap() >= 900);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_store_of_one_key_per_entry_reads_the_same() {
        // What every store held before runs: each entry under its own seq.
        let d = tmpdir("one-per-key");
        let es: Vec<Vec<u8>> = (1..=4).map(|i| e(i, 1, b"x")).collect();
        {
            let s = LogStore::open(&d, Durability::MemoryAck).unwrap();
            for (i, b) in es.iter().enumerate() {
                let mut v = (i as u64 * 128).to_le_bytes().to_vec();
                v.extend_from_slice(b);
                s.db.put(key(i as u64 + 1), v).unwrap();
            }
        }
        let mut s = LogStore::open(&d, Durability::MemoryAck).unwrap();
        assert_eq!(s.last().seq, 4);
        assert_eq!(s.last().end_pos, 4 * 128);
        let r = s.range(2, 10).unwrap();
        assert_eq!(
            r.iter().map(|(q, e)| (*q, e.pos)).collect::<Vec<_>>(),
            [(2, 128), (3, 256), (4, 384)]
        );
        append_n(&mut s, 5, 6, b"y");
        s.truncate_after(5).unwrap();
        assert_eq!(s.range(1, 10).unwrap().len(), 5);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn an_append_of_bytes_other_than_the_footprint_is_refused() {
        let d = tmpdir("footprint");
        let mut s = LogStore::open(&d, Durability::MemoryAck).unwrap();
        let mut a = e(1, 1, b"x");
        a.extend_from_slice(&[0; 64]);
        assert!(matches!(
            s.append(&[(0, &a)]),
            Err(StoreError::Corrupt { seq: 1, .. })
        ));
        assert_eq!(s.last().seq, 0);
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Every read of the store agrees with the model (`base`: the
    /// compaction point).
    fn reads_as_the_model(
        st: &LogStore,
        model: &std::collections::BTreeMap<u64, (u64, Vec<u8>)>,
        base: u64,
    ) -> Result<(), proptest::test_runner::TestCaseError> {
        let want: Vec<(u64, u64, Vec<u8>)> = model
            .iter()
            .map(|(q, (p, b))| (*q, *p, b.clone()))
            .collect();
        let got: Vec<(u64, u64, Vec<u8>)> = st
            .range(0, usize::MAX)
            .unwrap()
            .into_iter()
            .map(|(q, e)| (q, e.pos, e.bytes))
            .collect();
        proptest::prop_assert_eq!(&got, &want);
        proptest::prop_assert_eq!(st.oldest(), base + 1);
        if let Some((q, (p, b))) = model.iter().next_back() {
            proptest::prop_assert_eq!(st.last().seq, *q);
            proptest::prop_assert_eq!(st.last().end_pos, p + b.len() as u64);
        } else {
            proptest::prop_assert_eq!(st.last().seq, base);
        }
        for q in [
            base,
            base + 1,
            (base + st.last().seq) / 2,
            st.last().seq,
            st.last().seq + 1,
        ] {
            let got = st.get(q).unwrap().map(|e| (e.pos, e.bytes));
            proptest::prop_assert_eq!(got, model.get(&q).cloned(), "get({})", q);
        }
        // A chunk from anywhere starts where the model does.
        let from = base.saturating_sub(3) + 1 + (st.last().seq - base) / 3;
        let c = st.chunk(from, 5, usize::MAX).unwrap();
        let want: Vec<u64> = model.range(from..).take(5).map(|(q, _)| *q).collect();
        proptest::prop_assert_eq!(c.iter().map(|(q, _)| *q).collect::<Vec<_>>(), want);
        Ok(())
    }

    /// What a model of the log says after each operation.
    #[derive(Debug, Clone)]
    enum Op {
        /// Appends this many entries of these payload sizes, after a jump
        /// in the ring or not.
        Append(Vec<usize>, bool),
        /// Cuts after this fraction of the log (per mille).
        Truncate(u16),
        /// Compacts through this fraction of the log (per mille).
        Compact(u16),
        Reopen,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (proptest::collection::vec(0usize..3000, 1..40), any::<bool>())
                .prop_map(|(v, j)| Op::Append(v, j)),
            1 => (0u16..1000).prop_map(Op::Truncate),
            1 => (0u16..1000).prop_map(Op::Compact),
            1 => Just(Op::Reopen),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
        /// Runs, cuts inside them, compactions that keep a run across the
        /// base and reopens: the store always reads as the model.
        #[test]
        fn the_store_reads_as_a_model_of_the_log(ops in proptest::collection::vec(op(), 1..25)) {
            use std::collections::BTreeMap;
            let d = tmpdir("model");
            let _ = std::fs::remove_dir_all(&d);
            let mut s = Some(LogStore::open(&d, Durability::MemoryAck).unwrap());
            let mut model: BTreeMap<u64, (u64, Vec<u8>)> = BTreeMap::new();
            let mut base = 0u64;
            for op in ops {
                let st = s.as_mut().unwrap();
                let last = st.last();
                match op {
                    Op::Append(sizes, jump) => {
                        let mut pos = last.end_pos + if jump { 4096 } else { 0 };
                        let es: Vec<(u64, Vec<u8>)> = sizes.iter().enumerate().map(|(i, n)| {
                            let b = e(last.seq + 1 + i as u64, 1, &vec![i as u8; *n]);
                            let at = pos;
                            pos += b.len() as u64;
                            (at, b)
                        }).collect();
                        let refs: Vec<(u64, &[u8])> = es.iter().map(|(p, b)| (*p, b.as_slice())).collect();
                        st.append(&refs).unwrap();
                        for (i, (p, b)) in es.into_iter().enumerate() {
                            model.insert(last.seq + 1 + i as u64, (p, b));
                        }
                    }
                    Op::Truncate(f) => {
                        let at = base + (last.seq - base) * u64::from(f) / 1000;
                        st.truncate_after(at).unwrap();
                        model.retain(|q, _| *q <= at);
                    }
                    Op::Compact(f) => {
                        let at = base + (last.seq - base) * u64::from(f) / 1000;
                        st.compact_through(at).unwrap().reclaim_now();
                        if at > base {
                            base = at;
                        }
                        model.retain(|q, _| *q > base);
                    }
                    Op::Reopen => {
                        drop(s.take());
                        s = Some(LogStore::open(&d, Durability::MemoryAck).unwrap());
                    }
                }
                // Once as read (mostly from the recent runs), once from
                // RocksDB alone.
                let st = s.as_mut().unwrap();
                reads_as_the_model(st, &model, base)?;
                let recent = std::mem::take(&mut st.recent);
                reads_as_the_model(st, &model, base)?;
                st.recent = recent;
            }
            drop(s);
            std::fs::remove_dir_all(&d).unwrap();
        }
    }
}
