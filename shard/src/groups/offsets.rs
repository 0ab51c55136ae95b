//! Committed offsets, durable in a per-group log.
//!
//! Each group that commits gets its own [`PartitionLog`] under
//! `<data_dir>/__groups/<hex of group id>/` (the directory also holds `group.id`, the raw id).
//! A commit is one uncompressed record batch whose records are commits (key: topic and
//! partition; value: offset, leader epoch, metadata, commit time) or deletions (a null value).
//! This reuses the tested log engine: an OffsetCommit is acknowledged only after `wait_durable`
//! returns, and one fdatasync serves every commit that arrived before it (group commit), so
//! thousands of commits per second cost a handful of fsyncs. On load the log is replayed in
//! order; the last record for a partition wins.
//!
//! The log is kept small by snapshots: once it has grown by several segments since the last
//! snapshot, every live offset is appended again as one snapshot, and when that is durable the
//! log start moves to the snapshot (`delete_records_before`), dropping whole old segments. A
//! commit and its application to the in-memory table happen under one lock, so a snapshot
//! always includes every commit written before it and nothing acknowledged is ever dropped.
//!
//! The same log keeps the group's membership: whenever a classic group settles in a new
//! generation (or empties), its members, protocol and assignments are appended as one record
//! (key kind 2) before any member is told that generation, and the last such record is loaded
//! with the offsets (`kaas_groups::classic::stored` says why). A binary that predates the
//! record skips it with a warning and loads the group Empty, as it always did.
//!
//! A coordinator that moves between brokers (cluster mode) loads the same directory from the
//! shared data volume.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::Bytes;
use glommio::sync::Semaphore;
use kaas_groups::classic::{StoredGroup, StoredMember};
use kaas_storage::{LeaderEpoch, LogConfig, PartitionLog, StorageError};
use kaas_wire::batch::{self, BatchSpec, RecordKv, BATCH_HEADER_LEN};

use crate::catalog::TopicTable;

/// One committed offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedOffset {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
    pub commit_timestamp_ms: i64,
    /// The id of the topic the offset was committed for. Offsets are kept by topic name, and
    /// a topic deleted and created again under its name is another topic: an offset of the
    /// old one must not position a consumer of the new one (it skipped the new topic's
    /// records up to the old offset), as Kafka drops a deleted topic's offsets. Nil for an
    /// offset an older kaas stored, which did not record it.
    pub topic_id: uuid::Uuid,
}

impl CommittedOffset {
    /// Whether this offset, stored for `topic`/`partition`, belongs to the topic the catalog
    /// has under that name now: the topic exists, is the one committed for, and still has the
    /// partition. Offsets that do not are never answered, and are deleted
    /// ([`super::GroupManager::forget_deleted_topics`]).
    pub fn is_current(&self, topic: &str, partition: i32, catalog: &TopicTable) -> bool {
        catalog.get(topic).is_some_and(|t| {
            (self.topic_id.is_nil() || self.topic_id == t.id) && partition < t.partitions
        })
    }
}

/// topic -> partition -> committed offset, ordered so OffsetFetch answers are stable.
pub type OffsetTable = BTreeMap<String, BTreeMap<i32, CommittedOffset>>;

/// One record of a group's offset log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OffsetRecord {
    Commit {
        topic: String,
        partition: i32,
        value: CommittedOffset,
    },
    Delete {
        topic: String,
        partition: i32,
    },
    /// The group's settled membership (the last one written wins).
    Group(StoredGroup),
}

/// What a group's offset log holds: the live offsets and the last stored membership.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Replayed {
    pub offsets: OffsetTable,
    pub group: Option<StoredGroup>,
}

impl OffsetRecord {
    /// Applies this record to an in-memory table (a membership record leaves it unchanged).
    pub fn apply(self, table: &mut OffsetTable) {
        match self {
            OffsetRecord::Group(_) => {}
            OffsetRecord::Commit {
                topic,
                partition,
                value,
            } => {
                table.entry(topic).or_default().insert(partition, value);
            }
            OffsetRecord::Delete { topic, partition } => {
                if let Some(t) = table.get_mut(&topic) {
                    t.remove(&partition);
                    if t.is_empty() {
                        table.remove(&topic);
                    }
                }
            }
        }
    }
}

/// Record key kind: an offset commit (key = topic, partition).
const KEY_OFFSET: u8 = 1;
/// Record key kind: the group's settled membership (key = this byte alone).
const KEY_GROUP: u8 = 2;
/// Value format version.
const VALUE_V1: u8 = 1;

fn encode_key(topic: &str, partition: i32) -> Vec<u8> {
    let mut k = Vec::with_capacity(7 + topic.len());
    k.push(KEY_OFFSET);
    k.extend_from_slice(&(topic.len() as u16).to_be_bytes());
    k.extend_from_slice(topic.as_bytes());
    k.extend_from_slice(&partition.to_be_bytes());
    k
}

fn encode_value(v: &CommittedOffset) -> Vec<u8> {
    let mut out = Vec::with_capacity(25 + v.metadata.len());
    out.push(VALUE_V1);
    out.extend_from_slice(&v.offset.to_be_bytes());
    out.extend_from_slice(&v.leader_epoch.to_be_bytes());
    out.extend_from_slice(&v.commit_timestamp_ms.to_be_bytes());
    out.extend_from_slice(&(v.metadata.len() as u32).to_be_bytes());
    out.extend_from_slice(v.metadata.as_bytes());
    // After everything an older kaas reads, which ignores what follows the metadata.
    out.extend_from_slice(v.topic_id.as_bytes());
    out
}

fn put_str(out: &mut Vec<u8>, v: &str) {
    put_blob(out, v.as_bytes());
}

fn put_opt_str(out: &mut Vec<u8>, v: Option<&str>) {
    match v {
        Some(v) => put_str(out, v),
        None => out.extend_from_slice(&u32::MAX.to_be_bytes()),
    }
}

fn put_blob(out: &mut Vec<u8>, v: &[u8]) {
    // A member's metadata and assignment come from clients; each is far below 4 GiB (a
    // request is bounded by the broker's request size limit).
    let len = u32::try_from(v.len()).expect("a client-sent blob fits in u32");
    assert!(len != u32::MAX, "u32::MAX marks a null string");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(v);
}

fn encode_group(g: &StoredGroup) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.push(VALUE_V1);
    out.extend_from_slice(&g.generation.to_be_bytes());
    put_opt_str(&mut out, g.protocol_type.as_deref());
    put_opt_str(&mut out, g.protocol_name.as_deref());
    put_opt_str(&mut out, g.leader.as_deref());
    out.extend_from_slice(&(g.members.len() as u32).to_be_bytes());
    for m in &g.members {
        put_str(&mut out, &m.member_id);
        put_opt_str(&mut out, m.instance_id.as_deref());
        put_str(&mut out, &m.client_id);
        put_str(&mut out, &m.client_host);
        out.extend_from_slice(&m.session_timeout_ms.to_be_bytes());
        out.extend_from_slice(&m.rebalance_timeout_ms.to_be_bytes());
        put_str(&mut out, &m.protocol_type);
        out.extend_from_slice(&(m.protocols.len() as u32).to_be_bytes());
        for (name, metadata) in &m.protocols {
            put_str(&mut out, name);
            put_blob(&mut out, metadata);
        }
        put_blob(&mut out, &m.assignment);
    }
    out
}

fn decode_group(value: &[u8]) -> Option<StoredGroup> {
    let mut v = Cursor { b: value, at: 0 };
    if v.u8()? != VALUE_V1 {
        return None;
    }
    let generation = v.i32()?;
    let protocol_type = v.opt_str()?;
    let protocol_name = v.opt_str()?;
    let leader = v.opt_str()?;
    let count = v.u32()?;
    // Counts are not trusted for allocation: every element takes bytes, so the cursor runs
    // out (and decoding fails) long before a lying count could grow these vectors far.
    let mut members = Vec::new();
    for _ in 0..count {
        let member_id = v.str()?;
        let instance_id = v.opt_str()?;
        let client_id = v.str()?;
        let client_host = v.str()?;
        let session_timeout_ms = v.i32()?;
        let rebalance_timeout_ms = v.i32()?;
        let protocol_type = v.str()?;
        let n = v.u32()?;
        let mut protocols = Vec::new();
        for _ in 0..n {
            let name = v.str()?;
            let metadata = Bytes::copy_from_slice(v.blob()?);
            protocols.push((name, metadata));
        }
        let assignment = Bytes::copy_from_slice(v.blob()?);
        members.push(StoredMember {
            member_id,
            instance_id,
            client_id,
            client_host,
            session_timeout_ms,
            rebalance_timeout_ms,
            protocol_type,
            protocols,
            assignment,
        });
    }
    (v.at == value.len()).then_some(StoredGroup {
        generation,
        protocol_type,
        protocol_name,
        leader,
        members,
    })
}

/// A bounds-checked cursor over bytes we wrote ourselves (still checked: disks lie).
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let s = self.b.get(self.at..end)?;
        self.at = end;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|s| s[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|s| u16::from_be_bytes([s[0], s[1]]))
    }
    fn i32(&mut self) -> Option<i32> {
        self.take(4)
            .map(|s| i32::from_be_bytes(s.try_into().expect("4 bytes")))
    }
    fn i64(&mut self) -> Option<i64> {
        self.take(8)
            .map(|s| i64::from_be_bytes(s.try_into().expect("8 bytes")))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|s| u32::from_be_bytes(s.try_into().expect("4 bytes")))
    }
    fn blob(&mut self) -> Option<&'a [u8]> {
        let len = self.u32()?;
        if len == u32::MAX {
            return None;
        }
        self.take(len as usize)
    }
    fn str(&mut self) -> Option<String> {
        std::str::from_utf8(self.blob()?).ok().map(str::to_string)
    }
    /// A string or null (`Some(None)`); `None` when the bytes do not parse.
    fn opt_str(&mut self) -> Option<Option<String>> {
        let at = self.at;
        if self.u32()? == u32::MAX {
            return Some(None);
        }
        self.at = at;
        self.str().map(Some)
    }
    /// A zig-zag varint (Kafka's record encoding; `kaas_wire::varint`'s rules).
    fn varint(&mut self) -> Option<i64> {
        kaas_wire::varint::read_varint(self.b, &mut self.at)
    }
    /// A varint-length-prefixed byte string; -1 is null.
    fn bytes(&mut self) -> Option<Option<&'a [u8]>> {
        let len = self.varint()?;
        if len < 0 {
            return Some(None);
        }
        self.take(usize::try_from(len).ok()?).map(Some)
    }
}

/// Decodes one record's key and value.
pub fn decode_record(key: &[u8], value: Option<&[u8]>) -> Option<OffsetRecord> {
    let mut k = Cursor { b: key, at: 0 };
    match k.u8()? {
        KEY_OFFSET => {}
        KEY_GROUP if key.len() == 1 => return decode_group(value?).map(OffsetRecord::Group),
        _ => return None,
    }
    let tlen = k.u16()? as usize;
    let topic = std::str::from_utf8(k.take(tlen)?).ok()?.to_string();
    let partition = k.i32()?;
    let Some(value) = value else {
        return Some(OffsetRecord::Delete { topic, partition });
    };
    let mut v = Cursor { b: value, at: 0 };
    if v.u8()? != VALUE_V1 {
        return None;
    }
    let offset = v.i64()?;
    let leader_epoch = v.i32()?;
    let commit_timestamp_ms = v.i64()?;
    let mlen = u32::from_be_bytes(v.take(4)?.try_into().ok()?) as usize;
    let metadata = std::str::from_utf8(v.take(mlen)?).ok()?.to_string();
    // Absent in what an older kaas wrote.
    let topic_id = v
        .take(16)
        .and_then(|id| uuid::Uuid::from_slice(id).ok())
        .unwrap_or_default();
    Some(OffsetRecord::Commit {
        topic,
        partition,
        value: CommittedOffset {
            offset,
            leader_epoch,
            metadata,
            commit_timestamp_ms,
            topic_id,
        },
    })
}

/// The (key, value) records of one uncompressed batch (the only kind this module writes).
/// `None` when the batch is compressed or a record does not parse.
pub fn batch_records(bytes: &[u8]) -> Option<Vec<RecordKv<'_>>> {
    let h = batch::peek_header(bytes).ok()?;
    if h.compression() != 0 {
        return None;
    }
    let body = bytes.get(BATCH_HEADER_LEN..h.total_len())?;
    let mut c = Cursor { b: body, at: 0 };
    let mut out = Vec::with_capacity(h.record_count.clamp(0, 10_000) as usize);
    for _ in 0..h.record_count {
        let len = usize::try_from(c.varint()?).ok()?;
        let rec = c.take(len)?;
        let mut r = Cursor { b: rec, at: 0 };
        r.u8()?; // attributes
        r.varint()?; // timestamp delta
        r.varint()?; // offset delta
        let key = r.bytes()?;
        let value = r.bytes()?;
        out.push((key, value));
    }
    Some(out)
}

/// Encodes records as one or more batches (at most `BATCH_RECORDS` each) ready to append.
fn build_batches(records: &[OffsetRecord], now_ms: i64) -> Vec<u8> {
    const BATCH_RECORDS: usize = 4096;
    let mut out = Vec::new();
    for chunk in records.chunks(BATCH_RECORDS) {
        let encoded: Vec<(Vec<u8>, Option<Vec<u8>>)> = chunk
            .iter()
            .map(|r| match r {
                OffsetRecord::Commit {
                    topic,
                    partition,
                    value,
                } => (encode_key(topic, *partition), Some(encode_value(value))),
                OffsetRecord::Delete { topic, partition } => (encode_key(topic, *partition), None),
                OffsetRecord::Group(g) => (vec![KEY_GROUP], Some(encode_group(g))),
            })
            .collect();
        let kvs: Vec<RecordKv<'_>> = encoded
            .iter()
            .map(|(k, v)| (Some(k.as_slice()), v.as_deref()))
            .collect();
        out.extend_from_slice(&batch::build_batch(
            BatchSpec {
                timestamp: now_ms,
                ..BatchSpec::default()
            },
            &kvs,
        ));
    }
    out
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The file in a group directory holding the raw group id.
pub const GROUP_ID_FILE: &str = "group.id";

/// The directory name of a group: the hex of its id, or for ids too long for a file name a hex
/// prefix plus a hash (the raw id is in `group.id` either way).
pub fn group_dir_name(group_id: &str) -> String {
    const MAX_HEX: usize = 200;
    let hex: String = group_id.bytes().map(|b| format!("{b:02x}")).collect();
    if hex.len() <= MAX_HEX {
        return hex;
    }
    format!(
        "{}-{:08x}{:08x}",
        &hex[..MAX_HEX - 40],
        super::fnv1a_32(group_id.as_bytes()),
        super::fnv1a_32(
            group_id
                .as_bytes()
                .iter()
                .rev()
                .copied()
                .collect::<Vec<_>>()
                .as_slice()
        )
    )
}

/// A group's open offset log.
pub struct OffsetLog {
    dir: PathBuf,
    log: Rc<PartitionLog>,
    /// Serialises "append, then apply to the table" so that a snapshot, taken under the same
    /// lock, sees every commit that was written before it.
    lock: Semaphore,
    bytes_since_snapshot: Cell<u64>,
    snapshotting: Cell<bool>,
    segment_bytes: u64,
}

/// How many segments' worth of commits may pile up before the log is rewritten as a snapshot.
const SNAPSHOT_AFTER_SEGMENTS: u64 = 4;

impl OffsetLog {
    /// Opens (creating if needed) the offset log in `dir` and replays it: the live offsets and
    /// the last stored membership.
    pub async fn open(
        dir: PathBuf,
        segment_bytes: u64,
        sync_scope: kaas_storage::SyncScope,
    ) -> Result<(Rc<OffsetLog>, Replayed), StorageError> {
        let log = PartitionLog::open(
            dir.clone(),
            // Rolled by size only, never aged out: retention would drop committed offsets.
            LogConfig {
                segment_bytes,
                segment_ms: u64::MAX / 4,
                retention_ms: -1,
                retention_bytes: -1,
                delete_enabled: false,
                sync_scope,
                ..LogConfig::default()
            },
            LeaderEpoch(0),
        )
        .await?;
        let mut table = OffsetTable::new();
        let mut group = None;
        let mut offset = log.log_start_offset();
        let end = log.log_end_offset();
        let mut skipped = 0usize;
        while offset < end {
            let read = log.read(offset, 4 << 20).await?;
            if read.records.is_empty() {
                break;
            }
            let mut at = 0usize;
            let bytes = &read.records[..];
            while at < bytes.len() {
                let h = batch::verify_batch(&bytes[at..]).map_err(|e| StorageError::Corrupt {
                    path: dir.clone(),
                    position: at as u64,
                    detail: e.to_string(),
                })?;
                let b = &bytes[at..at + h.total_len()];
                match batch_records(b) {
                    Some(recs) => {
                        for (k, v) in recs {
                            match k.and_then(|k| decode_record(k, v)) {
                                Some(OffsetRecord::Group(g)) => group = Some(g),
                                Some(r) => r.apply(&mut table),
                                None => skipped += 1,
                            }
                        }
                    }
                    None => skipped += 1,
                }
                offset = h.last_offset() + 1;
                at += h.total_len();
            }
        }
        if skipped > 0 {
            tracing::warn!(dir = %dir.display(), skipped, "offset log held records this version cannot read; they were skipped");
        }
        let size = log.size_bytes();
        let me = Rc::new(OffsetLog {
            dir,
            log,
            lock: Semaphore::new(1),
            bytes_since_snapshot: Cell::new(size),
            snapshotting: Cell::new(false),
            segment_bytes,
        });
        Ok((
            me,
            Replayed {
                offsets: table,
                group,
            },
        ))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Appends `records`, runs `apply` (which must update the in-memory table) before any later
    /// append can start, and returns once the records are durable.
    pub async fn append(
        &self,
        records: &[OffsetRecord],
        apply: impl FnOnce(),
    ) -> Result<(), StorageError> {
        let bytes = build_batches(records, now_ms());
        let end = {
            let _permit = self
                .lock
                .acquire_permit(1)
                .await
                .map_err(|_| StorageError::Closed)?;
            let end = self.append_locked(&bytes).await?;
            apply();
            end
        };
        self.bytes_since_snapshot
            .set(self.bytes_since_snapshot.get() + bytes.len() as u64);
        self.log.wait_durable(end).await
    }

    async fn append_locked(&self, bytes: &[u8]) -> Result<i64, StorageError> {
        let mut headers = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let h = batch::peek_header(&bytes[at..]).map_err(|e| StorageError::Corrupt {
                path: self.dir.clone(),
                position: at as u64,
                detail: e.to_string(),
            })?;
            at += h.total_len();
            headers.push(h);
        }
        let outcome = self
            .log
            .append(bytes, &headers, self.log.leader_epoch())
            .await?;
        Ok(outcome.end_offset())
    }

    /// Whether enough has been written since the last snapshot to rewrite the log.
    pub fn wants_snapshot(&self) -> bool {
        !self.snapshotting.get()
            && self.bytes_since_snapshot.get() > SNAPSHOT_AFTER_SEGMENTS * self.segment_bytes
    }

    /// Appends every live offset (`live` is called under the append lock, so it sees every
    /// commit written so far) and, once that is durable, drops everything before it.
    pub async fn snapshot(&self, live: impl FnOnce() -> Vec<OffsetRecord>) {
        if self.snapshotting.replace(true) {
            return;
        }
        let result = async {
            let (start, end, written) = {
                let _permit = self
                    .lock
                    .acquire_permit(1)
                    .await
                    .map_err(|_| StorageError::Closed)?;
                let records = live();
                let start = self.log.log_end_offset();
                if records.is_empty() {
                    (start, start, 0)
                } else {
                    let bytes = build_batches(&records, now_ms());
                    let end = self.append_locked(&bytes).await?;
                    (start, end, bytes.len() as u64)
                }
            };
            self.log.wait_durable(end).await?;
            self.log.delete_records_before(start).await?;
            self.bytes_since_snapshot.set(written);
            Ok::<_, StorageError>(())
        }
        .await;
        if let Err(e) = result {
            tracing::warn!(dir = %self.dir.display(), error = %e, "offset log snapshot failed; the log keeps its history and will try again");
        }
        self.snapshotting.set(false);
    }

    pub fn size_bytes(&self) -> u64 {
        self.log.size_bytes()
    }

    pub async fn close(&self) -> Result<(), StorageError> {
        self.log.close().await
    }
}

/// Writes `path`'s directory entry durably (after creating a file or directory in it).
pub fn sync_dir(path: &Path) -> Result<(), StorageError> {
    kaas_durable::sync_dir(path).map_err(|e| StorageError::Io {
        op: "fsyncing directory",
        path: path.to_path_buf(),
        detail: e.to_string(),
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    fn commit(topic: &str, partition: i32, offset: i64, metadata: &str) -> OffsetRecord {
        OffsetRecord::Commit {
            topic: topic.into(),
            partition,
            value: CommittedOffset {
                offset,
                leader_epoch: 3,
                metadata: metadata.into(),
                commit_timestamp_ms: 42,
                topic_id: uuid::Uuid::from_u128(7),
            },
        }
    }

    fn stored_group(generation: i32) -> StoredGroup {
        let member = |id: &str, instance: Option<&str>| StoredMember {
            member_id: id.into(),
            instance_id: instance.map(str::to_string),
            client_id: "client-ü".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout_ms: 45_000,
            rebalance_timeout_ms: 300_000,
            protocol_type: "consumer".into(),
            protocols: vec![
                ("range".into(), Bytes::from_static(b"\0\x01sub")),
                ("cooperative-sticky".into(), Bytes::new()),
            ],
            assignment: Bytes::from(vec![7u8; 300]),
        };
        StoredGroup {
            generation,
            protocol_type: Some("consumer".into()),
            protocol_name: Some("range".into()),
            leader: Some("m-1".into()),
            members: vec![member("m-1", None), member("m-2", Some("host-2"))],
        }
    }

    // Records survive encoding into batches and decoding back, tombstones and memberships
    // (with members, and emptied) included.
    #[test]
    fn records_round_trip() {
        let emptied = StoredGroup {
            generation: 8,
            protocol_type: Some("consumer".into()),
            protocol_name: None,
            leader: None,
            members: vec![],
        };
        let recs = vec![
            OffsetRecord::Group(stored_group(7)),
            OffsetRecord::Group(emptied),
            commit("orders", 0, 10, ""),
            commit("ørders-ü", 7, i64::MAX, "some metadata"),
            OffsetRecord::Delete {
                topic: "orders".into(),
                partition: 0,
            },
        ];
        let bytes = build_batches(&recs, 1);
        let h = batch::verify_batch(&bytes).unwrap();
        assert_eq!(h.total_len(), bytes.len());
        let decoded: Vec<OffsetRecord> = batch_records(&bytes)
            .unwrap()
            .into_iter()
            .map(|(k, v)| decode_record(k.unwrap(), v).unwrap())
            .collect();
        assert_eq!(decoded, recs);
        let mut table = OffsetTable::new();
        for r in decoded {
            r.apply(&mut table);
        }
        assert_eq!(table.len(), 1);
        assert_eq!(table["ørders-ü"][&7].offset, i64::MAX);
    }

    // Truncated or garbage records are refused, never a panic.
    #[test]
    fn garbage_is_refused() {
        let bytes = build_batches(&[commit("t", 1, 5, "m")], 1);
        for cut in 0..bytes.len() {
            let _ = batch_records(&bytes[..cut]);
        }
        assert!(decode_record(&[1, 0, 9, b'a'], None).is_none());
        assert!(decode_record(&[], None).is_none());
        assert!(decode_record(&encode_key("t", 1), Some(&[1, 2, 3])).is_none());
        let group = encode_group(&stored_group(3));
        for cut in 0..group.len() {
            assert!(decode_record(&[KEY_GROUP], Some(&group[..cut])).is_none());
        }
        let mut longer = group.clone();
        longer.push(0);
        assert!(decode_record(&[KEY_GROUP], Some(&longer)).is_none());
        // A member count far beyond the bytes fails without allocating for it.
        let mut lying = encode_group(&StoredGroup {
            members: vec![],
            ..stored_group(3)
        });
        let n = lying.len();
        lying[n - 4..].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(decode_record(&[KEY_GROUP], Some(&lying)).is_none());
        assert!(decode_record(&[KEY_GROUP], None).is_none());
    }

    /// Runs `f` on a glommio executor of its own (the groups' IO runs on a shard's).
    pub(in crate::groups) fn run<F: std::future::Future<Output = ()> + 'static>(
        f: impl FnOnce() -> F + Send + 'static,
    ) {
        glommio::LocalExecutorBuilder::default()
            .io_memory(2 << 20)
            .spawn(move || async move { f().await })
            .unwrap()
            .join()
            .unwrap();
    }

    // Commits survive a reopen; snapshots shrink the log without losing any commit, including
    // commits written concurrently with the snapshot; deletions stay deleted.
    #[test]
    #[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
    fn log_replays_and_snapshots() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g");
        run(move || async move {
            let segment = 64 << 10;
            let (log, replayed) =
                OffsetLog::open(path.clone(), segment, kaas_storage::SyncScope::default())
                    .await
                    .unwrap();
            assert_eq!(replayed, Replayed::default());
            let table = Rc::new(std::cell::RefCell::new(replayed.offsets));
            // The membership, rewritten every 100 rounds: the last one must survive snapshots.
            let group = Rc::new(std::cell::RefCell::new(None::<StoredGroup>));
            let mut want = OffsetTable::new();
            let mut snapshots = 0;
            for round in 0..2000i64 {
                let recs = vec![
                    commit(
                        "orders",
                        (round % 7) as i32,
                        round,
                        "meta-data-of-some-length",
                    ),
                    commit(&format!("t{}", round % 3), 0, round * 2, ""),
                ];
                for r in recs.clone() {
                    r.apply(&mut want);
                }
                let t = table.clone();
                let applied = recs.clone();
                log.append(&recs, move || {
                    for r in applied {
                        r.apply(&mut t.borrow_mut());
                    }
                })
                .await
                .unwrap();
                if round % 100 == 0 {
                    let g = stored_group(round as i32);
                    let applied = group.clone();
                    let record = g.clone();
                    log.append(&[OffsetRecord::Group(g)], move || {
                        *applied.borrow_mut() = Some(record);
                    })
                    .await
                    .unwrap();
                }
                if log.wants_snapshot() {
                    snapshots += 1;
                    let t = table.clone();
                    let g = group.clone();
                    let live = move || {
                        let mut live: Vec<OffsetRecord> = t
                            .borrow()
                            .iter()
                            .flat_map(|(topic, ps)| {
                                ps.iter().map(move |(p, v)| OffsetRecord::Commit {
                                    topic: topic.clone(),
                                    partition: *p,
                                    value: v.clone(),
                                })
                            })
                            .collect();
                        live.extend(g.borrow().clone().map(OffsetRecord::Group));
                        live
                    };
                    // A commit racing the snapshot must survive it.
                    let racing = vec![commit("race", round as i32, round, "")];
                    racing[0].clone().apply(&mut want);
                    let t2 = table.clone();
                    let applied = racing.clone();
                    let (_, r) = futures::join!(
                        log.snapshot(live),
                        log.append(&racing, move || {
                            for r in applied {
                                r.apply(&mut t2.borrow_mut());
                            }
                        })
                    );
                    r.unwrap();
                }
            }
            let delete = vec![OffsetRecord::Delete {
                topic: "t0".into(),
                partition: 0,
            }];
            delete[0].clone().apply(&mut want);
            log.append(&delete, || {}).await.unwrap();
            assert!(snapshots > 0, "the log never asked for a snapshot");
            assert!(
                log.size_bytes() < 8 * segment,
                "snapshots did not bound the log: {} bytes",
                log.size_bytes()
            );
            log.close().await.unwrap();
            let (reopened, replayed) =
                OffsetLog::open(path, segment, kaas_storage::SyncScope::default())
                    .await
                    .unwrap();
            assert_eq!(replayed.offsets, want);
            assert_eq!(replayed.group, Some(stored_group(1900)));
            reopened.close().await.unwrap();
        });
    }

    // Directory names are file-name safe and distinct for long ids.
    #[test]
    fn dir_names() {
        assert_eq!(group_dir_name("ab"), "6162");
        let a = group_dir_name(&"x".repeat(300));
        let b = group_dir_name(&format!("{}y", "x".repeat(299)));
        assert!(a.len() < 255 && b.len() < 255);
        assert_ne!(a, b);
    }
}
