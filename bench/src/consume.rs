//! A consumer task: fetches its partitions from their leaders with sessionless Fetch requests
//! (no consumer group: the bench tracks offsets itself), one fetch in flight per broker.
//!
//! Records are counted from batch headers (record count at byte 57, next offset from the last
//! offset delta); only the end-to-end mode walks the records, to read the send time in each
//! value.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use anyhow::Result;
use kaas_wire::kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kaas_wire::kafka_protocol::messages::{BrokerId, FetchRequest, TopicName};
use kaas_wire::kafka_protocol::protocol::StrBytes;
use tokio::sync::watch;

use crate::args::Opts;
use crate::client::Connection;
use crate::cluster::FETCH_VERSION_CAP;
use crate::records;
use crate::stats::{LiveCounters, SideStats, Window};

/// Fetch requests at or above this version name the topic by id.
const FETCH_TOPIC_ID_VERSION: i16 = 13;
const OFFSET_OUT_OF_RANGE: i16 = 1;

/// How far consumers should go; changed by the run while they work.
#[derive(Debug, Clone, PartialEq)]
pub enum ConsumeUntil {
    /// Keep reading whatever arrives.
    Running,
    /// Stop each partition once it reaches this offset (exclusive end).
    Offsets(Arc<BTreeMap<i32, i64>>),
    /// Stop now.
    Stop,
}

pub struct ConsumerSetup {
    pub opts: Arc<Opts>,
    pub topic: String,
    pub topic_id: uuid::Uuid,
    /// Assigned partitions with their start offsets.
    pub start: BTreeMap<i32, i64>,
    pub leaders: Vec<i32>,
    pub conns: HashMap<i32, Arc<Connection>>,
    pub until: watch::Receiver<ConsumeUntil>,
    /// Read the send time out of every value (end-to-end mode).
    pub e2e: bool,
    pub window: Window,
    pub live: Arc<LiveCounters>,
}

pub struct ConsumerOutcome {
    pub stats: SideStats,
    pub version: i16,
    /// Every partition reached its end offset.
    pub caught_up: bool,
    /// When the task finished, on the bench clock.
    pub finished_ns: u64,
    pub fatal: Option<String>,
}

struct PartitionCursor {
    partition: i32,
    next_offset: i64,
}

/// Runs the consumer until told to stop or until every partition reached its end offset.
pub async fn run_consumer(setup: ConsumerSetup) -> Result<ConsumerOutcome> {
    let mut by_leader: BTreeMap<i32, Vec<PartitionCursor>> = BTreeMap::new();
    for (&p, &offset) in &setup.start {
        by_leader
            .entry(setup.leaders[p as usize])
            .or_default()
            .push(PartitionCursor {
                partition: p,
                next_offset: offset,
            });
    }
    let setup = Arc::new(setup);
    let mut version = 0;
    let mut lanes = Vec::new();
    for (leader, cursors) in by_leader {
        let conn = setup.conns[&leader].clone();
        version = conn.version_for::<FetchRequest>(FETCH_VERSION_CAP)?;
        lanes.push(fetch_lane(setup.clone(), conn, version, cursors));
    }
    let results = futures::future::join_all(lanes).await;
    let mut out = ConsumerOutcome {
        stats: SideStats::default(),
        version,
        caught_up: true,
        finished_ns: crate::pacer::now_ns(),
        fatal: None,
    };
    for (stats, caught_up, fatal) in results {
        out.stats.merge(&stats);
        out.caught_up &= caught_up;
        if out.fatal.is_none() {
            out.fatal = fatal;
        }
    }
    Ok(out)
}

/// Fetch loop against one broker. Returns its stats, whether it caught up, and a fatal error.
#[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
async fn fetch_lane(
    setup: Arc<ConsumerSetup>,
    conn: Arc<Connection>,
    version: i16,
    mut cursors: Vec<PartitionCursor>,
) -> (SideStats, bool, Option<String>) {
    let opts = &setup.opts;
    let mut until = setup.until.clone();
    let mut stats = SideStats::default();
    let mut scratch = Vec::new();
    let topic_name = TopicName(StrBytes::from_string(setup.topic.clone()));
    let mut index_of: HashMap<i32, usize> = HashMap::new();
    for (i, c) in cursors.iter().enumerate() {
        index_of.insert(c.partition, i);
    }
    loop {
        let target = until.borrow_and_update().clone();
        let targets = match &target {
            ConsumeUntil::Stop => return (stats, false, None),
            ConsumeUntil::Offsets(t) => Some(t.clone()),
            ConsumeUntil::Running => None,
        };
        let done = |c: &PartitionCursor| {
            targets
                .as_ref()
                .and_then(|t| t.get(&c.partition))
                .is_some_and(|&end| c.next_offset >= end)
        };
        if targets.is_some() && cursors.iter().all(done) {
            return (stats, true, None);
        }
        if let Some(limit) = opts.messages {
            if setup
                .live
                .messages
                .load(std::sync::atomic::Ordering::Relaxed)
                >= limit
            {
                return (stats, false, None);
            }
        }
        let mut topic = FetchTopic::default();
        if version >= FETCH_TOPIC_ID_VERSION {
            topic.topic_id = setup.topic_id;
        } else {
            topic.topic = topic_name.clone();
        }
        for c in cursors.iter().filter(|c| !done(c)) {
            let mut fp = FetchPartition::default();
            fp.partition = c.partition;
            fp.current_leader_epoch = -1;
            fp.fetch_offset = c.next_offset;
            fp.last_fetched_epoch = -1;
            fp.log_start_offset = -1;
            fp.partition_max_bytes = opts.fetch_partition_max_bytes as i32;
            topic.partitions.push(fp);
        }
        let mut req = FetchRequest::default();
        req.replica_id = BrokerId(-1);
        req.replica_state.replica_id = BrokerId(-1);
        req.max_wait_ms = opts.fetch_max_wait_ms;
        req.min_bytes = 1;
        req.max_bytes = opts.fetch_max_bytes.min(i32::MAX as usize) as i32;
        req.isolation_level = 0;
        req.session_id = 0;
        req.session_epoch = -1;
        req.topics = vec![topic];
        let pending = match conn.send_versioned(&req, version, true).await {
            Ok(p) => p,
            Err(e) => return (stats, false, Some(format!("{e:#}"))),
        };
        let resp = tokio::select! {
            r = pending.wait_timed() => r,
            // Re-check the target; the late answer is dropped.
            changed = until.changed() => {
                if changed.is_err() {
                    return (stats, false, None);
                }
                continue;
            }
        };
        let (resp, received_ns) = match resp {
            Ok(Some(r)) => r,
            Ok(None) => unreachable!("fetch always expects a response"),
            Err(e) => {
                stats.add_errors(-1, 1);
                return (stats, false, Some(format!("{e:#}")));
            }
        };
        if resp.error_code != 0 {
            stats.add_errors(resp.error_code, 1);
            setup.live.add_errors(1);
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        }
        let in_window = setup.window.contains(received_ns);
        let mut had_error = false;
        for t in &resp.responses {
            for pd in &t.partitions {
                let Some(&i) = index_of.get(&pd.partition_index) else {
                    continue;
                };
                let cursor = &mut cursors[i];
                if pd.error_code != 0 {
                    stats.add_errors(pd.error_code, 1);
                    setup.live.add_errors(1);
                    had_error = true;
                    if pd.error_code == OFFSET_OUT_OF_RANGE
                        && pd.log_start_offset > cursor.next_offset
                    {
                        cursor.next_offset = pd.log_start_offset;
                    }
                    continue;
                }
                let Some(data) = &pd.records else { continue };
                let (mut messages, mut bytes, mut lat_sum_us, mut lat_n) = (0u64, 0u64, 0u64, 0u64);
                for batch in records::batches(data) {
                    let next = batch.next_offset();
                    if next <= cursor.next_offset {
                        continue; // entirely before the fetch offset
                    }
                    let skip = (cursor.next_offset - batch.base_offset()).max(0) as u64;
                    cursor.next_offset = next;
                    if batch.is_control() {
                        continue;
                    }
                    let count = (batch.record_count() as u64).saturating_sub(skip);
                    messages += count;
                    bytes += batch.bytes.len() as u64;
                    if setup.e2e {
                        let mut idx = 0u64;
                        let window = setup.window;
                        let hist = &mut stats.latency;
                        let r = batch.for_each_stamp(&mut scratch, |stamp| {
                            if idx >= skip {
                                let lat = received_ns.saturating_sub(stamp);
                                lat_sum_us += lat / 1000;
                                lat_n += 1;
                                if window.contains(stamp) {
                                    hist.record_ns(lat);
                                }
                            }
                            idx += 1;
                        });
                        if let Err(e) = r {
                            return (
                                stats,
                                false,
                                Some(format!("partition {}: {e:#}", cursor.partition)),
                            );
                        }
                    }
                }
                stats.total_messages += messages;
                stats.total_bytes += bytes;
                if in_window {
                    stats.window_messages += messages;
                    stats.window_bytes += bytes;
                }
                setup.live.add(messages, bytes);
                if lat_n > 0 {
                    setup.live.add_latency(lat_sum_us, lat_n);
                }
            }
        }
        if had_error {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}
