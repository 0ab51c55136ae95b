//! Fetch with long-poll: read every requested partition on its owning shard; if fewer than
//! `min_bytes` came back, wait (on the owning shards) until any partition grows or `max_wait_ms`
//! passes, then read again. `max_bytes` and `partition_max_bytes` are honoured, with at least
//! one whole batch returned so a consumer always progresses.

use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kaas_wire::fetch_frame::{FetchPartitionOut, FetchResponseOut, FetchTopicOut};
use kaas_wire::kafka_protocol::messages::FetchRequest;

use super::{check_epoch, per_partition};
use crate::catalog::TopicMeta;
use crate::errors;
use crate::shard::Shard;

/// The most a Fetch answers whatever its `max_bytes` asks: Kafka's broker config
/// `fetch.max.bytes` at its default (55 MiB; read-only in Kafka, a constant here). Clients ask
/// for 50 MiB by default (librdkafka's and the Java client's `fetch.max.bytes`), so only a
/// request asking for more is cut.
const FETCH_MAX_BYTES: usize = 57_671_680;

#[derive(Clone)]
struct PartRead {
    error_code: i16,
    high_watermark: i64,
    log_start_offset: i64,
    records: Bytes,
}

impl PartRead {
    fn error(code: i16) -> Self {
        PartRead {
            error_code: code,
            high_watermark: -1,
            log_start_offset: -1,
            records: Bytes::new(),
        }
    }
}

#[derive(Clone)]
struct Wanted {
    topic_index: usize,
    partition: i32,
    meta: Option<Arc<TopicMeta>>,
    error: i16,
    fetch_offset: i64,
    max_bytes: usize,
    /// The leader epoch the client believes current (-1: not sent, before v9, or unknown).
    current_leader_epoch: i32,
}

#[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
pub async fn fetch(shard: &Rc<Shard>, req: FetchRequest, version: i16) -> FetchResponseOut {
    if req.session_epoch > 0 {
        // kaas grants no fetch sessions (its answers carry session id 0, which clients take as
        // "keep sending full fetches"), so an incremental fetch names a session that does not
        // exist. Kafka's answer; served as a full fetch, it listed only the partitions that
        // changed and got an empty success.
        return FetchResponseOut {
            throttle_time_ms: 0,
            error_code: errors::FETCH_SESSION_ID_NOT_FOUND,
            session_id: 0,
            topics: Vec::new(),
        };
    }
    let started = Instant::now();
    let max_wait = Duration::from_millis(req.max_wait_ms.max(0) as u64);
    let min_bytes = req.min_bytes.max(0) as usize;
    // Taken as it is, as Kafka takes it: 0 is not "no limit" but one batch (KIP-74); and no
    // more than FETCH_MAX_BYTES, so one request cannot make the broker read and hold gigabytes.
    let max_bytes = (req.max_bytes.max(0) as usize).min(FETCH_MAX_BYTES);
    // Partitions are read concurrently, so without a share each could read its whole
    // partition_max_bytes only for most of it to be dropped by max_bytes below: a 1,000-partition
    // fetch would read (and hold) up to 1 GB for a 50 MB answer. Each partition therefore reads
    // at most its share of max_bytes (never below 64 KiB, and always at least one whole batch).
    let partitions_wanted: usize = req
        .topics
        .iter()
        .map(|t| t.partitions.len())
        .sum::<usize>()
        .max(1);
    let share = (max_bytes / partitions_wanted).max(64 * 1024);
    let snapshot = shard.catalog.snapshot();
    let uses_ids = version >= 13;
    // A fetch that says it comes from a replica (v15+ in ReplicaState). kaas keeps one copy of
    // each partition, so no broker follows one: Kafka answers such a fetch from a broker that
    // is not a follower of the partition NOT_LEADER_OR_FOLLOWER, with no records.
    let replica = if version >= 15 {
        req.replica_state.replica_id.0
    } else {
        req.replica_id.0
    };
    let from_replica = replica >= 0;

    let mut wanted = Vec::new();
    let mut topics_out = Vec::with_capacity(req.topics.len());
    for (ti, t) in req.topics.iter().enumerate() {
        let meta = if uses_ids {
            snapshot.by_id(t.topic_id).cloned()
        } else {
            snapshot.get(t.topic.as_str()).cloned()
        };
        let missing = if uses_ids {
            errors::UNKNOWN_TOPIC_ID
        } else {
            errors::UNKNOWN_TOPIC_OR_PARTITION
        };
        topics_out.push(FetchTopicOut {
            name: t.topic.to_string(),
            topic_id: *t.topic_id.as_bytes(),
            partitions: Vec::new(),
        });
        for p in &t.partitions {
            let (meta, error) = match &meta {
                None => (None, missing),
                Some(m) if p.partition < 0 || p.partition >= m.partitions => {
                    (None, errors::UNKNOWN_TOPIC_OR_PARTITION)
                }
                Some(_) if from_replica => (None, errors::NOT_LEADER_OR_FOLLOWER),
                Some(m) => (Some(m.clone()), errors::NONE),
            };
            wanted.push(Wanted {
                topic_index: ti,
                partition: p.partition,
                meta,
                error,
                fetch_offset: p.fetch_offset,
                max_bytes: (p.partition_max_bytes.max(0) as usize).min(share),
                current_leader_epoch: p.current_leader_epoch,
            });
        }
    }

    let mut reads = read_all(shard, &wanted).await;
    loop {
        let total: usize = reads.iter().map(|r| r.records.len()).sum();
        let any_error = reads.iter().any(|r| r.error_code != errors::NONE);
        let elapsed = started.elapsed();
        // A stopping broker answers a long poll with what it has (see `crate::stopping`).
        if total >= min_bytes
            || any_error
            || elapsed >= max_wait
            || wanted.is_empty()
            || shard.stopping.is_set()
        {
            break;
        }
        wait_any(shard, &wanted, max_wait - elapsed).await;
        reads = read_all(shard, &wanted).await;
    }

    // Enforce the response-wide max_bytes in request order, in whole batches: the first
    // partition with data always gets at least its first batch (KIP-74), and every partition
    // after it what fits of the budget left. (A partition kept whole past the budget made a
    // Fetch with max_bytes 500 answer three batches, 1,173 bytes.)
    let mut budget = max_bytes;
    let mut first = true;
    for (w, r) in wanted.iter().zip(reads) {
        let mut records = r.records;
        if records.len() > budget {
            records = within_budget(shard, w, budget, first).await;
        }
        if !records.is_empty() {
            budget = budget.saturating_sub(records.len());
            first = false;
        }
        if let (false, Some(m)) = (records.is_empty(), &w.meta) {
            shard
                .probe
                .topic(&shard.catalog, &m.name)
                .bytes_out
                .fetch_add(records.len() as u64, Ordering::Relaxed);
        }
        let lso = if r.high_watermark >= 0 {
            r.high_watermark
        } else {
            -1
        };
        topics_out[w.topic_index]
            .partitions
            .push(FetchPartitionOut {
                partition_index: w.partition,
                error_code: r.error_code,
                high_watermark: r.high_watermark,
                last_stable_offset: lso,
                log_start_offset: r.log_start_offset,
                records,
            });
    }
    // Session id 0: kaas keeps no fetch sessions, so clients send full requests (KIP-227).
    FetchResponseOut {
        topics: topics_out,
        ..Default::default()
    }
}

/// What of partition `w` fits in `limit` bytes, in whole batches: at least its first batch
/// when `at_least_one` (KIP-74), else nothing if that batch alone is larger. It is read again
/// with the smaller limit rather than cut here: the log finds the cut through its sparse index
/// and reads the batch headers that takes off the shard's thread, where walking the bytes
/// here would fault cold pages of history in on it. (At most the one partition that crosses
/// the budget, and the first, are read twice.)
async fn within_budget(shard: &Rc<Shard>, w: &Wanted, limit: usize, at_least_one: bool) -> Bytes {
    if limit == 0 && !at_least_one {
        return Bytes::new();
    }
    let again = Wanted {
        max_bytes: limit,
        ..w.clone()
    };
    let read = read_all(shard, std::slice::from_ref(&again)).await;
    let records = read
        .into_iter()
        .next()
        .map(|r| r.records)
        .unwrap_or_default();
    if records.len() > limit && !at_least_one {
        return Bytes::new();
    }
    records
}

async fn read_all(shard: &Rc<Shard>, wanted: &[Wanted]) -> Vec<PartRead> {
    let mut items = Vec::new();
    let mut slots = Vec::new();
    let mut out: Vec<PartRead> = Vec::with_capacity(wanted.len());
    for (i, w) in wanted.iter().enumerate() {
        match &w.meta {
            Some(m) => {
                slots.push(i);
                items.push((
                    shard.owner_of(&m.name, w.partition),
                    (
                        m.clone(),
                        w.partition,
                        w.fetch_offset,
                        w.max_bytes,
                        w.current_leader_epoch,
                    ),
                ));
                out.push(PartRead::error(errors::NONE));
            }
            None => out.push(PartRead::error(w.error)),
        }
    }
    let results = per_partition(
        shard,
        items,
        |s, (meta, partition, offset, max, current)| {
            read_partition(s, meta, partition, offset, max, current)
        },
        PartRead::error(errors::NOT_LEADER_OR_FOLLOWER),
    )
    .await;
    for (i, r) in slots.into_iter().zip(results) {
        out[i] = r;
    }
    out
}

/// Runs on the shard that owns the partition.
async fn read_partition(
    shard: Rc<Shard>,
    meta: Arc<TopicMeta>,
    partition: i32,
    offset: i64,
    max_bytes: usize,
    current_leader_epoch: i32,
) -> PartRead {
    let log = match shard.partition(&meta, partition).await {
        Ok(l) => l,
        Err(e) => return PartRead::error(errors::storage(&e)),
    };
    // Cluster mode fences a fetch from an older leadership, as Kafka does: the client then
    // refreshes its metadata and validates its position (OffsetForLeaderEpoch) before reading
    // on, instead of reading across a leader change it has not checked. A single node's epoch
    // never changes while it runs, so there is nothing to fence there.
    if shard.cluster.enabled() {
        if let Err(code) = check_epoch(current_leader_epoch, log.leader_epoch().0) {
            return PartRead::error(code);
        }
    }
    match log.read_visible(offset, max_bytes.max(1)).await {
        Ok(r) => PartRead {
            error_code: errors::NONE,
            high_watermark: r.high_watermark,
            log_start_offset: r.log_start_offset,
            records: r.records,
        },
        Err(e) => PartRead {
            error_code: errors::storage(&e),
            high_watermark: log.high_watermark(),
            log_start_offset: log.log_start_offset(),
            records: Bytes::new(),
        },
    }
}

/// Returns when any wanted partition has data past its fetch offset, or after `timeout`.
async fn wait_any(shard: &Rc<Shard>, wanted: &[Wanted], timeout: Duration) {
    let mut by_shard: Vec<Vec<(Arc<TopicMeta>, i32, i64)>> =
        (0..shard.nshards).map(|_| Vec::new()).collect();
    for w in wanted {
        if let Some(m) = &w.meta {
            by_shard[shard.owner_of(&m.name, w.partition)].push((
                m.clone(),
                w.partition,
                w.fetch_offset,
            ));
        }
    }
    let waits: Vec<_> = by_shard
        .into_iter()
        .enumerate()
        .filter(|(_, v)| !v.is_empty())
        .map(|(target, parts)| {
            Box::pin(crate::mesh::on_shard(
                shard,
                target,
                move |s: Rc<Shard>| async move {
                    // Signals, not logs: a long poll over thousands of partitions must not keep
                    // their logs busy (the open-file budget closes only idle ones). A log that
                    // is not open now is not waited on (the read pass just opened it, so it was
                    // closed for room since); one closed while waiting wakes the poll early.
                    let mut signals = Vec::new();
                    for (meta, partition, offset) in parts {
                        if !s.serves(&meta.name, partition) {
                            continue;
                        }
                        if let Some(log) = s.open_partition(meta.id, partition) {
                            match log.data_signal(offset) {
                                Some(rx) => signals.push(rx),
                                None => return,
                            }
                        }
                    }
                    if signals.is_empty() {
                        glommio::timer::sleep(timeout).await;
                    } else {
                        // An error means the log was closed: wake, and the read looks again.
                        let _ = futures::future::select_all(signals).await;
                    }
                },
            ))
        })
        .collect();
    let stopping = shard.stopping.wait();
    let timer = async { glommio::timer::sleep(timeout).await };
    if waits.is_empty() {
        futures_lite::future::or(timer, stopping).await;
        return;
    }
    let all = futures::future::select_all(waits);
    futures_lite::future::or(
        async {
            all.await;
        },
        futures_lite::future::or(timer, stopping),
    )
    .await;
}
