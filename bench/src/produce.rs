//! A producer task: generates messages (paced or as fast as buffer space allows), accumulates
//! them into one batch per partition, seals a batch when it is full or its linger time is up,
//! and sends sealed batches to each partition's leader, several requests in flight per
//! connection, one batch per partition per request (Kafka refuses more for magic 2).
//!
//! Latency of a message is from its intended send time (the pacer's schedule, or the moment it
//! was made when unpaced) to the moment its produce response was read off the socket.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::SystemTime;

use anyhow::Result;
use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use kaas_wire::kafka_protocol::messages::produce_request::{
    PartitionProduceData, TopicProduceData,
};
use kaas_wire::kafka_protocol::messages::{ProduceRequest, ProduceResponse, TopicName};
use kaas_wire::kafka_protocol::protocol::StrBytes;

use crate::args::Opts;
use crate::client::Connection;
use crate::cluster::PRODUCE_VERSION_CAP;
use crate::pacer::{self, Pacer};
use crate::records::{self, BatchBuilder};
use crate::stats::{LiveCounters, SideStats, Window};

/// Produce requests at or above this version name the topic by id.
const PRODUCE_TOPIC_ID_VERSION: i16 = 13;
/// Messages generated per loop turn before the task looks at responses and timers again.
const GENERATE_CHUNK: usize = 2048;

/// What a producer task needs to know about the topic and the run.
pub struct ProducerSetup {
    pub index: u32,
    pub producers: u32,
    pub opts: Arc<Opts>,
    pub topic: String,
    pub topic_id: uuid::Uuid,
    /// Leader broker id of each partition.
    pub leaders: Vec<i32>,
    /// This task's own connection to every leader.
    pub conns: HashMap<i32, Arc<Connection>>,
    /// When the first message is due, and when generation stops.
    pub start_ns: u64,
    pub window: Window,
    pub live: Arc<LiveCounters>,
}

/// What a producer task reports when done.
pub struct ProducerOutcome {
    pub stats: SideStats,
    /// The produce version used, for the report.
    pub version: i16,
    /// A failure that stopped the task early (connection lost, undecodable response).
    pub fatal: Option<String>,
}

struct SealedBatch {
    partition: i32,
    bytes: Bytes,
    stamps_ns: Vec<u64>,
    payload_bytes: u64,
}

struct BatchMeta {
    partition: i32,
    size_bytes: usize,
    stamps_ns: Vec<u64>,
    payload_bytes: u64,
}

type Completion = (Vec<BatchMeta>, Result<Option<(ProduceResponse, u64)>>);

/// One broker's connection and its queue of sealed batches.
struct Lane {
    conn: Arc<Connection>,
    version: i16,
    ready: VecDeque<SealedBatch>,
}

struct Producer {
    opts: Arc<Opts>,
    topic: TopicName,
    topic_id: uuid::Uuid,
    acks: i16,
    /// Lane index of each partition's leader.
    lane_of: Vec<usize>,
    lanes: Vec<Lane>,
    open: Vec<BatchBuilder>,
    /// Bumped when a partition's batch is sealed, so stale linger entries are recognised.
    generation: Vec<u64>,
    /// (deadline, partition, generation) in creation order; deadlines are monotonic because
    /// the linger time is the same for every batch.
    linger: VecDeque<(u64, usize, u64)>,
    linger_ns: u64,
    sticky: usize,
    /// Bytes held: open batches (uncompressed) plus sealed batches not yet acknowledged.
    buffered_bytes: usize,
    /// Per-partition mark used while building one request.
    request_mark: Vec<u64>,
    request_seq: u64,
    /// Per-partition index into a response's batch list, reused between responses.
    meta_index: Vec<usize>,
    stamp_pool: Vec<Vec<u64>>,
    filler: Vec<u8>,
    window: Window,
    live: Arc<LiveCounters>,
    stats: SideStats,
    /// Messages whose intended send time is in the window: made, and answered (ack or error).
    made_in_window: u64,
    answered_in_window: u64,
    fatal: Option<String>,
}

impl Producer {
    fn partitions(&self) -> usize {
        self.open.len()
    }

    /// Seals partition `p`'s open batch into its leader's ready queue.
    fn seal(&mut self, p: usize) -> Result<()> {
        let b = &mut self.open[p];
        if b.is_empty() {
            return Ok(());
        }
        let uncompressed = b.size_bytes();
        let payload_bytes = b.payload_bytes;
        let mut out = BytesMut::with_capacity(uncompressed + 64);
        b.seal(&mut out, self.opts.compression)?;
        let stamps_ns =
            std::mem::replace(&mut b.stamps_ns, self.stamp_pool.pop().unwrap_or_default());
        self.buffered_bytes = self.buffered_bytes - uncompressed + out.len();
        self.generation[p] += 1;
        self.lanes[self.lane_of[p]].ready.push_back(SealedBatch {
            partition: p as i32,
            bytes: out.freeze(),
            stamps_ns,
            payload_bytes,
        });
        if !self.opts.keyed && p == self.sticky {
            self.sticky = (self.sticky + 1) % self.partitions();
        }
        Ok(())
    }

    fn seal_all(&mut self) -> Result<()> {
        for p in 0..self.partitions() {
            self.seal(p)?;
        }
        self.linger.clear();
        Ok(())
    }

    /// Adds one message with intended send time `stamp_ns`.
    fn add_message(
        &mut self,
        now_ns: u64,
        wall_ms: i64,
        stamp_ns: u64,
        key: Option<&[u8]>,
    ) -> Result<()> {
        let size = self.opts.message_size;
        let mut p = match key {
            Some(k) => records::partition_for_key(k, self.partitions() as u32) as usize,
            None => self.sticky,
        };
        let rec = self.open[p].record_size_bytes(key.map(<[u8]>::len), size);
        if !self.open[p].is_empty() && self.open[p].size_bytes() + rec > self.opts.batch_size {
            self.seal(p)?;
            if key.is_none() {
                p = self.sticky;
                let rec = self.open[p].record_size_bytes(None, size);
                if !self.open[p].is_empty()
                    && self.open[p].size_bytes() + rec > self.opts.batch_size
                {
                    self.seal(p)?;
                    p = self.sticky;
                }
            }
        }
        let b = &mut self.open[p];
        if b.is_empty() {
            self.linger
                .push_back((now_ns + self.linger_ns, p, self.generation[p]));
            self.buffered_bytes += records::BATCH_HEADER_BYTES;
        }
        let before = b.size_bytes();
        b.append(wall_ms, stamp_ns, key, size, &self.filler);
        if self.window.contains(stamp_ns) {
            self.made_in_window += 1;
        }
        self.buffered_bytes += b.size_bytes() - before;
        Ok(())
    }

    /// Seals batches whose linger time is up.
    fn expire_linger(&mut self, now_ns: u64) -> Result<()> {
        while let Some(&(deadline, p, gen)) = self.linger.front() {
            if deadline > now_ns {
                break;
            }
            self.linger.pop_front();
            if self.generation[p] == gen {
                self.seal(p)?;
            }
        }
        Ok(())
    }

    /// Takes up to one ready batch per partition, within the request size limit.
    fn build_request(&mut self, lane: usize) -> (ProduceRequest, Vec<BatchMeta>) {
        self.request_seq += 1;
        let seq = self.request_seq;
        let max = self.opts.max_request_size;
        let version = self.lanes[lane].version;
        let mut skipped = Vec::new();
        let mut metas = Vec::new();
        let mut data = Vec::new();
        let mut size = 0usize;
        let ready = &mut self.lanes[lane].ready;
        while let Some(b) = ready.pop_front() {
            let p = b.partition as usize;
            if self.request_mark[p] == seq {
                skipped.push(b);
                continue;
            }
            if size > 0 && size + b.bytes.len() > max {
                ready.push_front(b);
                break;
            }
            self.request_mark[p] = seq;
            size += b.bytes.len();
            let mut pd = PartitionProduceData::default();
            pd.index = b.partition;
            metas.push(BatchMeta {
                partition: b.partition,
                size_bytes: b.bytes.len(),
                stamps_ns: b.stamps_ns,
                payload_bytes: b.payload_bytes,
            });
            pd.records = Some(b.bytes);
            data.push(pd);
        }
        for b in skipped.into_iter().rev() {
            ready.push_front(b);
        }
        let mut topic = TopicProduceData::default();
        if version >= PRODUCE_TOPIC_ID_VERSION {
            topic.topic_id = self.topic_id;
        } else {
            topic.name = self.topic.clone();
        }
        topic.partition_data = data;
        let mut req = ProduceRequest::default();
        req.acks = self.acks;
        req.timeout_ms = self.opts.request_timeout_ms;
        req.topic_data = vec![topic];
        (req, metas)
    }

    /// Sends what the lanes have ready, as far as in-flight slots allow.
    async fn send_ready(
        &mut self,
        inflight: &mut FuturesUnordered<BoxFuture<'static, Completion>>,
    ) -> Result<()> {
        for lane in 0..self.lanes.len() {
            while !self.lanes[lane].ready.is_empty() && self.lanes[lane].conn.has_free_slot() {
                let (req, metas) = self.build_request(lane);
                let l = &self.lanes[lane];
                let pending = l
                    .conn
                    .try_send_versioned(&req, l.version, self.acks != 0)
                    .await?
                    .expect("a free slot was checked by this task, the slot's only user");
                let sent_ns = pacer::now_ns();
                inflight.push(
                    async move {
                        let r = pending.wait_timed().await;
                        // acks=0: no response; the message counts as sent when written.
                        let r = r.map(|o| o.or(Some((ProduceResponse::default(), sent_ns))));
                        (metas, r)
                    }
                    .boxed(),
                );
            }
        }
        Ok(())
    }

    fn complete(&mut self, (metas, result): Completion) {
        for m in &metas {
            self.buffered_bytes -= m.size_bytes;
        }
        for m in &metas {
            self.answered(&m.stamps_ns);
        }
        match result {
            Err(e) => {
                let n: u64 = metas.iter().map(|m| m.stamps_ns.len() as u64).sum();
                self.stats.add_errors(-1, n);
                self.live.add_errors(n);
                if self.fatal.is_none() {
                    self.fatal = Some(format!("{e:#}"));
                }
            }
            Ok(None) => unreachable!("mapped to a default response above"),
            Ok(Some((resp, received_ns))) => {
                let no_response = self.acks == 0;
                for (i, m) in metas.iter().enumerate() {
                    self.meta_index[m.partition as usize] = i;
                }
                let mut answered = vec![no_response; metas.len()];
                for t in &resp.responses {
                    for pr in &t.partition_responses {
                        let Some(&i) = self.meta_index.get(pr.index as usize) else {
                            continue;
                        };
                        if metas.get(i).map(|m| m.partition) != Some(pr.index) || answered[i] {
                            continue;
                        }
                        answered[i] = true;
                        if pr.error_code != 0 {
                            let n = metas[i].stamps_ns.len() as u64;
                            self.stats.add_errors(pr.error_code, n);
                            self.live.add_errors(n);
                        } else {
                            self.acknowledge(&metas[i], received_ns, !no_response);
                        }
                    }
                }
                for (i, m) in metas.iter().enumerate() {
                    if no_response {
                        self.acknowledge(m, received_ns, false);
                    } else if !answered[i] {
                        // The broker left a partition out of its answer.
                        let n = m.stamps_ns.len() as u64;
                        self.stats.add_errors(-2, n);
                        self.live.add_errors(n);
                    }
                }
            }
        }
        for m in metas {
            let mut v = m.stamps_ns;
            v.clear();
            self.stamp_pool.push(v);
        }
    }

    fn acknowledge(&mut self, m: &BatchMeta, acked_ns: u64, with_latency: bool) {
        let n = m.stamps_ns.len() as u64;
        self.stats.total_messages += n;
        self.stats.total_bytes += m.payload_bytes;
        if self.window.contains(acked_ns) {
            self.stats.window_messages += n;
            self.stats.window_bytes += m.payload_bytes;
        }
        if with_latency {
            let mut sum_us = 0u64;
            for &s in &m.stamps_ns {
                let lat = acked_ns.saturating_sub(s);
                sum_us += lat / 1000;
                if self.window.contains(s) {
                    self.stats.latency.record_ns(lat);
                }
            }
            self.live.add_latency(sum_us, n);
        }
        self.live.add(n, m.payload_bytes);
    }

    /// Notes that the broker answered (or failed) for these messages.
    fn answered(&mut self, stamps_ns: &[u64]) {
        let w = self.window;
        self.answered_in_window += stamps_ns.iter().filter(|&&s| w.contains(s)).count() as u64;
    }
}

fn wall_clock_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Writes the key of message `k` as 16 decimal digits (no allocation).
fn key_digits(k: u64, out: &mut [u8; 16]) {
    let mut v = k;
    for slot in out.iter_mut().rev() {
        *slot = b'0' + (v % 10) as u8;
        v /= 10;
    }
}

/// Runs one producer until the window ends, then drains what is in flight (bounded by the
/// request timeout).
#[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
pub async fn run_producer(setup: ProducerSetup) -> Result<ProducerOutcome> {
    let opts = setup.opts.clone();
    let n = setup.leaders.len();
    let mut lane_ids: Vec<i32> = setup.conns.keys().copied().collect();
    lane_ids.sort_unstable();
    let mut lanes = Vec::new();
    for id in &lane_ids {
        let conn = setup.conns[id].clone();
        let version = conn.version_for::<ProduceRequest>(PRODUCE_VERSION_CAP)?;
        lanes.push(Lane {
            conn,
            version,
            ready: VecDeque::new(),
        });
    }
    let version = lanes.first().map(|l| l.version).unwrap_or(0);
    let lane_of = setup
        .leaders
        .iter()
        .map(|l| lane_ids.binary_search(l).expect("a connection per leader"))
        .collect();
    let mut pr = Producer {
        topic: TopicName(StrBytes::from_string(setup.topic.clone())),
        topic_id: setup.topic_id,
        acks: opts.acks.wire_value(),
        lane_of,
        lanes,
        open: (0..n).map(|_| BatchBuilder::default()).collect(),
        generation: vec![0; n],
        linger: VecDeque::new(),
        linger_ns: opts.linger_ms * 1_000_000,
        sticky: (setup.index as usize * 7919) % n,
        buffered_bytes: 0,
        request_mark: vec![0; n],
        request_seq: 0,
        meta_index: vec![usize::MAX; n],
        stamp_pool: Vec::new(),
        filler: records::filler(opts.message_size, 0x5eed + setup.index as u64),
        window: setup.window,
        live: setup.live.clone(),
        stats: SideStats::default(),
        made_in_window: 0,
        answered_in_window: 0,
        fatal: None,
        opts: opts.clone(),
    };
    let mut pacer = Pacer::for_producer(opts.rate, setup.start_ns, setup.index, setup.producers);
    let mut inflight: FuturesUnordered<BoxFuture<'static, Completion>> = FuturesUnordered::new();
    let stop_ns = setup.window.end_ns;
    let drain_deadline_ns = stop_ns + (opts.request_timeout_ms.max(0) as u64 + 5_000) * 1_000_000;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (setup.index as u64 + 1);
    let mut key = [0u8; 16];
    let mut stopping = false;
    tokio::time::sleep_until(pacer::instant_of(setup.start_ns).into()).await;
    loop {
        let now = pacer::now_ns();
        if !stopping && (now >= stop_ns || pr.fatal.is_some()) {
            stopping = true;
            pr.seal_all()?;
        }
        if !stopping {
            let wall_ms = wall_clock_ms();
            let mut made = 0;
            while made < GENERATE_CHUNK && pr.buffered_bytes < opts.buffer_memory {
                let Some(stamp) = pacer.take_due(now) else {
                    break;
                };
                let k = if opts.keyed {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    key_digits(rng % opts.key_count, &mut key);
                    Some(&key[..])
                } else {
                    None
                };
                pr.add_message(now, wall_ms, stamp, k)?;
                made += 1;
            }
        }
        pr.expire_linger(now)?;
        if let Err(e) = pr.send_ready(&mut inflight).await {
            if pr.fatal.is_none() {
                pr.fatal = Some(format!("{e:#}"));
            }
            break;
        }
        while let Some(Some(done)) = inflight.next().now_or_never() {
            pr.complete(done);
        }
        let idle = pr.lanes.iter().all(|l| l.ready.is_empty()) && inflight.is_empty();
        if stopping && idle {
            break;
        }
        if stopping && now >= drain_deadline_ns {
            break;
        }
        // Sleep until the next thing that needs this task: a response, the next paced message,
        // a linger deadline or the end of the window.
        let mut wake = if stopping { drain_deadline_ns } else { stop_ns };
        let has_room = pr.buffered_bytes < opts.buffer_memory;
        if !stopping && has_room {
            match pacer.next_due_ns() {
                Some(t) => wake = wake.min(t),
                None => wake = now, // unpaced with room: keep generating
            }
        }
        if let Some(&(deadline, _, _)) = pr.linger.front() {
            wake = wake.min(deadline);
        }
        if wake <= now {
            tokio::task::yield_now().await;
            continue;
        }
        if inflight.is_empty() {
            tokio::time::sleep_until(pacer::instant_of(wake).into()).await;
        } else {
            tokio::select! {
                biased;
                Some(done) = inflight.next() => pr.complete(done),
                _ = tokio::time::sleep_until(pacer::instant_of(wake).into()) => {}
            }
        }
    }
    // Requests still in flight past the drain deadline are abandoned; their messages, and any
    // never sent, count as unacknowledged.
    drop(inflight);
    pr.stats.unacknowledged = pr.made_in_window - pr.answered_in_window;
    Ok(ProducerOutcome {
        stats: pr.stats,
        version,
        fatal: pr.fatal,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys are the fixed-width decimal form of the key number.
    #[test]
    fn key_digits_are_fixed_width() {
        let mut k = [0u8; 16];
        key_digits(42, &mut k);
        assert_eq!(&k, b"0000000000000042");
        key_digits(1_234_567_890_123_456, &mut k);
        assert_eq!(&k, b"1234567890123456");
    }
}
