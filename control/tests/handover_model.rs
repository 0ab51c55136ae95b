//! An adversarial model of the cluster's central safety rule: no acknowledged write is lost when
//! a partition changes leader. Pure: one scheduler picks, step by step, which broker does what
//! and how much time passes, pausing any broker anywhere (between its fence check and its write,
//! between a Lease write and learning its result, between computing a file and landing it).
//!
//! The decisions are the real ones — `ElectionState`, `handover::next_leadership`,
//! `handover::silent_for`, `handover::lost_leadership`,
//! `heartbeat::AckFloor`, `assignment::accept` — and the glue around them follows
//! `src/cluster.rs` and `shard::handlers::produce`: a broker writes only while it serves the
//! partition and its fence is open, and acknowledges only if, after the write landed, its fence
//! is still open and the same leadership term still serves the partition.
//!
//! Invariant: a write acknowledged by a leader is never superseded: no later leadership term
//! that opened the log before the write landed went on to write (its higher-epoch segment
//! would cut the write at the next recovery).
//!
//! A broker that missed an election while paused may still accept a deposed controller's file
//! that landed late, and "take over" by it; it never gets to write (its fence stays closed), so
//! in this model that costs availability only. What it costs on real files is listed in the
//! module docs of `kaas_control::handover`.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use kaas_control::assignment::{accept, diff, Assignment, BrokerEntry, Decision, Health};
use kaas_control::balancer::{self, BrokerId, TopicPartition};
use kaas_control::election::{
    ElectionAction, ElectionConfig, ElectionState, LeaseRecord, WriteError,
};
use kaas_control::handover::{self, Standing, Timing};
use kaas_control::heartbeat::AckFloor;
use proptest::prelude::*;

const BROKERS: i32 = 3;
const PARTITIONS: i32 = 4;
const ELECTION: ElectionConfig = ElectionConfig {
    lease_duration_ms: 4_000,
    renew_deadline_ms: 2_000,
    retry_period_ms: 500,
};
const FENCE_MS: u64 = 800;
const RELEASE_MS: u64 = 1_300;
/// The Lease write timeout (the driver's `io_timeout`, one retry period).
const IO_TIMEOUT_MS: u64 = 500;

fn tp(p: i32) -> TopicPartition {
    TopicPartition::new("t", p)
}

#[derive(Debug, Clone)]
enum Event {
    Tick(u64),
    /// The broker is stopped (SIGSTOP) for this many ms from now.
    Pause(i32, u64),
    Election(i32),
    /// A SIGTERM drain: the holder releases the Lease and stops acting as controller, but
    /// keeps serving its partitions (and reporting) until a file takes them away.
    Release(i32),
    Status(i32),
    Deliver(i32),
    AckDeliver(i32),
    Round(i32, u8),
    FileLand(i32),
    Watch(i32),
    BeginWrite(i32, i32),
    Land(i32),
    AckCheck(i32),
}

fn event() -> impl Strategy<Value = Event> {
    let b = 0..BROKERS;
    prop_oneof![
        6 => (1u64..400).prop_map(Event::Tick),
        1 => (b.clone(), 100u64..9_000).prop_map(|(b, ms)| Event::Pause(b, ms)),
        4 => b.clone().prop_map(Event::Election),
        1 => b.clone().prop_map(Event::Release),
        3 => b.clone().prop_map(Event::Status),
        3 => b.clone().prop_map(Event::Deliver),
        3 => b.clone().prop_map(Event::AckDeliver),
        3 => (b.clone(), any::<u8>()).prop_map(|(b, s)| Event::Round(b, s)),
        2 => b.clone().prop_map(Event::FileLand),
        3 => b.clone().prop_map(Event::Watch),
        4 => (b.clone(), 0..PARTITIONS).prop_map(|(b, p)| Event::BeginWrite(b, p)),
        3 => b.clone().prop_map(Event::Land),
        3 => b.prop_map(Event::AckCheck),
    ]
}

/// Where a broker's Lease round is.
#[derive(Debug, Clone)]
enum LeasePhase {
    Idle,
    /// A write was asked for at `sent`; it lands (and is fed back) at the next step.
    Writing {
        record: LeaseRecord,
        sent: u64,
    },
    /// It landed with `result`; the result is fed back at the next step (a pause may come
    /// between).
    Feeding {
        result: Result<LeaseRecord, WriteError>,
    },
}

/// A controller's term: from noticing it leads at `epoch` until it stops.
#[derive(Debug, Clone)]
struct Term {
    epoch: u64,
    start: u64,
    prev_holder: Option<i32>,
    /// broker → (last status arrival, applied key).
    registry: BTreeMap<i32, (u64, (u64, u64))>,
    floor: AckFloor,
    last: Option<Assignment>,
    /// The chain version `last` was claimed or written as: the base of the next write.
    seq: u64,
    /// A write of this term was refused: claim again before the next round.
    reclaim: bool,
}

#[derive(Debug, Clone)]
struct Write {
    partition: i32,
    /// The leadership term (global sequence number of the take-over) it was written under.
    term: u64,
    landed: Option<u64>,
}

#[derive(Debug, Clone)]
struct Node {
    paused_until: u64,
    election: ElectionState,
    phase: LeasePhase,
    holder_seen: Option<i32>,
    lease_epoch_seen: u64,
    fence_until: u64,
    acked_epoch: u64,
    applied: Option<Assignment>,
    /// partition → the take-over's global sequence number (its term).
    serving: BTreeMap<i32, u64>,
    term: Option<Term>,
    seq: u64,
    /// Statuses sent, by sequence: send time.
    sent: BTreeMap<u64, u64>,
    inbox: VecDeque<(i32, u64, (u64, u64))>,
    acks: VecDeque<(u64, u64)>,
    /// A computed file and the chain version it was based on, not landed yet.
    pending_file: Option<(Assignment, u64)>,
    writes: Vec<Write>,
}

struct World {
    now: u64,
    seq: u64,
    lease: LeaseRecord,
    file: Option<Assignment>,
    nodes: Vec<Node>,
    /// (partition, take-over sequence number, broker).
    openings: Vec<(i32, u64, i32)>,
    /// (partition, term, landed sequence number, broker).
    acked: Vec<(i32, u64, u64, i32)>,
    /// Terms that landed at least one write (acknowledged or not).
    landed_terms: std::collections::BTreeSet<u64>,
    /// The chain version of `file` (`assignment::write_fenced` appends after it or fails).
    file_seq: u64,
}

fn holder_of(record: &LeaseRecord) -> Option<i32> {
    record
        .holder
        .as_deref()
        .and_then(|h| h.split('@').next()?.parse::<i32>().ok())
}

fn timing() -> Timing {
    Timing {
        broker_fence: Duration::from_millis(FENCE_MS),
        release_after: Duration::from_millis(RELEASE_MS),
    }
}

impl World {
    fn new() -> World {
        let nodes = (0..BROKERS)
            .map(|id| Node {
                paused_until: 0,
                election: ElectionState::new(format!("{id}@h"), ELECTION).unwrap(),
                phase: LeasePhase::Idle,
                holder_seen: None,
                lease_epoch_seen: 0,
                fence_until: 0,
                acked_epoch: 0,
                applied: None,
                serving: BTreeMap::new(),
                term: None,
                seq: 0,
                sent: BTreeMap::new(),
                inbox: VecDeque::new(),
                acks: VecDeque::new(),
                pending_file: None,
                writes: Vec::new(),
            })
            .collect();
        World {
            now: 0,
            seq: 0,
            lease: LeaseRecord::default(),
            file: None,
            nodes,
            openings: Vec::new(),
            acked: Vec::new(),
            landed_terms: Default::default(),
            file_seq: 0,
        }
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn cas(&mut self, record: &LeaseRecord) -> Result<LeaseRecord, WriteError> {
        if record.resource_version != self.lease.resource_version {
            return Err(WriteError::Conflict);
        }
        let version = self.lease.resource_version.parse::<u64>().unwrap_or(0) + 1;
        self.lease = LeaseRecord {
            resource_version: version.to_string(),
            ..record.clone()
        };
        Ok(self.lease.clone())
    }

    #[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
    fn apply(&mut self, e: &Event) {
        let now = self.now;
        match *e {
            Event::Tick(ms) => self.now += ms,
            Event::Pause(b, ms) => self.nodes[b as usize].paused_until = now + ms,
            _ => {
                let b = match *e {
                    Event::Election(b)
                    | Event::Release(b)
                    | Event::Status(b)
                    | Event::Deliver(b)
                    | Event::AckDeliver(b)
                    | Event::Round(b, _)
                    | Event::FileLand(b)
                    | Event::Watch(b)
                    | Event::BeginWrite(b, _)
                    | Event::Land(b)
                    | Event::AckCheck(b) => b,
                    _ => unreachable!(),
                };
                if now < self.nodes[b as usize].paused_until {
                    return;
                }
                match *e {
                    Event::Election(b) => self.election(b, now),
                    Event::Release(b) => self.release(b, now),
                    Event::Status(b) => self.status(b, now),
                    Event::Deliver(c) => self.deliver(c, now),
                    Event::AckDeliver(b) => {
                        let n = &mut self.nodes[b as usize];
                        while let Some((sent, epoch)) = n.acks.pop_front() {
                            n.fence_until = n.fence_until.max(sent + FENCE_MS);
                            n.acked_epoch = epoch;
                            n.lease_epoch_seen = n.lease_epoch_seen.max(epoch);
                        }
                    }
                    Event::Round(c, choice) => self.round(c, choice, now),
                    Event::FileLand(c) => {
                        // `assignment::write_fenced`: lands only as the version after its base.
                        if let Some((f, base)) = self.nodes[c as usize].pending_file.take() {
                            let landed = base == self.file_seq;
                            if landed {
                                self.file = Some(f.clone());
                                self.file_seq += 1;
                            }
                            if let Some(t) = self.nodes[c as usize].term.as_mut() {
                                if landed {
                                    t.last = Some(f);
                                    t.seq = self.file_seq;
                                } else {
                                    t.reclaim = true;
                                }
                            }
                        }
                    }
                    Event::Watch(b) => self.watch(b),
                    Event::BeginWrite(b, p) => {
                        let n = &mut self.nodes[b as usize];
                        if let Some(&term) = n.serving.get(&p) {
                            if now < n.fence_until {
                                n.writes.push(Write {
                                    partition: p,
                                    term,
                                    landed: None,
                                });
                            }
                        }
                    }
                    Event::Land(b) => {
                        let seq = self.next_seq();
                        let n = &mut self.nodes[b as usize];
                        if let Some(w) = n.writes.iter_mut().find(|w| w.landed.is_none()) {
                            w.landed = Some(seq);
                        }
                    }
                    Event::AckCheck(b) => {
                        let n = &mut self.nodes[b as usize];
                        let (fence, serving) = (n.fence_until, n.serving.clone());
                        let mut done = Vec::new();
                        let landed_terms = &mut self.landed_terms;
                        n.writes.retain(|w| {
                            let Some(landed) = w.landed else { return true };
                            landed_terms.insert(w.term);
                            if now < fence && serving.get(&w.partition) == Some(&w.term) {
                                done.push((w.partition, w.term, landed, b));
                            }
                            false
                        });
                        self.acked.extend(done);
                    }
                    _ => unreachable!(),
                }
            }
        }
    }

    /// One phase of the Lease round (`ElectionDriver::round`), then what `src/cluster.rs` does
    /// with the published view.
    fn election(&mut self, b: i32, now: u64) {
        let phase = self.nodes[b as usize].phase.clone();
        match phase {
            LeasePhase::Idle => {
                let observed = self.lease.clone();
                let n = &mut self.nodes[b as usize];
                let action = n.election.step(&observed, now);
                let holder = holder_of(&observed);
                n.holder_seen = holder;
                let epoch = n.election.epoch().unwrap_or(observed.lease_transitions);
                n.lease_epoch_seen = n.lease_epoch_seen.max(epoch);
                match action {
                    ElectionAction::Acquire { new_record }
                    | ElectionAction::Renew { new_record } => {
                        n.phase = LeasePhase::Writing {
                            record: new_record,
                            sent: now,
                        }
                    }
                    ElectionAction::StepDown | ElectionAction::Wait => {}
                }
            }
            LeasePhase::Writing { record, sent } => {
                // The write lands now, whenever that is; past the timeout the driver already
                // gave up on it and feeds a failure.
                let result = self.cas(&record);
                let n = &mut self.nodes[b as usize];
                n.phase = LeasePhase::Feeding {
                    result: if now > sent + IO_TIMEOUT_MS {
                        Err(WriteError::Unavailable)
                    } else {
                        result
                    },
                };
            }
            LeasePhase::Feeding { result } => {
                let n = &mut self.nodes[b as usize];
                // The driver publishes the stored record as the one last seen.
                if let Ok(stored) = &result {
                    n.holder_seen = holder_of(stored);
                }
                n.election.on_write_result(result, now);
                n.phase = LeasePhase::Idle;
            }
        }
        // The controller loop notices a new term (or its end) right away.
        let n = &mut self.nodes[b as usize];
        let leads = n.election.is_leader(now);
        match (&n.term, leads, n.election.epoch()) {
            (Some(t), true, Some(e)) if t.epoch == e => {}
            (_, true, Some(e)) => {
                let n = &mut self.nodes[b as usize];
                // `controller_loop`: only a holder whose Lease ran out has a known gap.
                let prev_holder = n
                    .election
                    .expired_holder()
                    .and_then(|h| h.split('@').next()?.parse::<i32>().ok());
                n.term = Some(Term {
                    epoch: e,
                    start: now,
                    prev_holder,
                    registry: BTreeMap::new(),
                    floor: AckFloor::for_epoch(e),
                    last: None,
                    seq: 0,
                    reclaim: true,
                });
                // The controller loop claims assignment.json before its first round.
                self.claim(b);
            }
            _ => n.term = None,
        }
    }

    /// `ElectionDriver::release`, as a SIGTERM drain calls it: one compare-and-swap writing
    /// `holder: None`, after which this broker never acts as controller again. Its partitions
    /// stay served, and its fence stays open as acknowledged, until a file moves them.
    fn release(&mut self, b: i32, now: u64) {
        let n = &mut self.nodes[b as usize];
        if !matches!(n.phase, LeasePhase::Idle) {
            return; // the driver releases between rounds
        }
        let record = n.election.release();
        n.term = None;
        if let Some(record) = record {
            let result = self.cas(&record);
            let n = &mut self.nodes[b as usize];
            n.election.on_write_result(result, now);
        }
    }

    /// `assignment::claim_epoch` (one compare-and-swap, so one step) and what `src/cluster/controller.rs`
    /// does with it: republish the newest file known under this term's epoch, and acknowledge
    /// no broker before it applied that file. Refused (deposed): the term ends.
    fn claim(&mut self, b: i32) {
        let head = self.file.clone();
        let n = &mut self.nodes[b as usize];
        let Some(term) = n.term.as_mut() else { return };
        if head
            .as_ref()
            .is_some_and(|h| h.controller_epoch > term.epoch)
        {
            n.term = None;
            return;
        }
        let base = [head.as_ref(), n.applied.as_ref()]
            .into_iter()
            .flatten()
            .max_by_key(|a| a.order_key())
            .cloned();
        term.reclaim = false;
        term.seq = self.file_seq;
        if let Some(mut next) = base {
            if !(next.controller_epoch == term.epoch && head.as_ref() == Some(&next)) {
                next.controller_epoch = term.epoch;
                next.assignment_version += 1;
                self.file = Some(next.clone());
                self.file_seq += 1;
                term.seq = self.file_seq;
            }
            term.floor.raise_all(next.order_key());
            term.last = Some(next);
        }
    }

    fn status(&mut self, b: i32, now: u64) {
        let n = &mut self.nodes[b as usize];
        let Some(c) = n.holder_seen else { return };
        n.seq += 1;
        let seq = n.seq;
        n.sent.insert(seq, now);
        let applied = n.applied.as_ref().map_or((0, 0), |a| a.order_key());
        self.nodes[c as usize].inbox.push_back((b, seq, applied));
    }

    /// The controller's heartbeat server records and (maybe) acknowledges its inbox.
    fn deliver(&mut self, c: i32, now: u64) {
        let inbox: Vec<_> = self.nodes[c as usize].inbox.drain(..).collect();
        for (b, seq, applied) in inbox {
            let n = &mut self.nodes[c as usize];
            let leads = n.election.is_leader(now);
            let Some(term) = n.term.as_mut() else {
                continue;
            };
            if !leads {
                continue;
            }
            term.registry.insert(b, (now, applied));
            if term.floor.allows(BrokerId(b), applied) {
                let epoch = term.epoch;
                let sent = self.nodes[b as usize].sent[&seq];
                self.nodes[b as usize].acks.push_back((sent, epoch));
            }
        }
    }

    /// One controller round (`src/cluster/controller.rs::recompute`), with the adversary choosing where
    /// the balancer wants each partition.
    fn round(&mut self, c: i32, choice: u8, now: u64) {
        if !self.nodes[c as usize].election.is_leader(now)
            || self.nodes[c as usize].pending_file.is_some()
        {
            // A round awaits its write before the next one starts.
            return;
        }
        if self.nodes[c as usize]
            .term
            .as_ref()
            .is_some_and(|t| t.reclaim)
        {
            self.claim(c);
        }
        let n = &mut self.nodes[c as usize];
        let Some(term) = n.term.as_mut() else { return };
        let previous = [term.last.clone(), n.applied.clone()]
            .into_iter()
            .flatten()
            .max_by_key(|a| a.order_key());
        let alive: Vec<i32> = (0..BROKERS)
            .filter(|b| {
                *b == c
                    || term
                        .registry
                        .get(b)
                        .is_some_and(|(seen, _)| now.saturating_sub(*seen) <= RELEASE_MS)
            })
            .collect();
        let desired: balancer::LeaderMap = (0..PARTITIONS)
            .map(|p| {
                let pick = (choice as usize / (p as usize + 1) + p as usize) % alive.len();
                (tp(p), BrokerId(alive[pick]))
            })
            .collect();
        let version = previous.as_ref().map_or(0, |p| p.assignment_version) + 1;
        let leading_for = Duration::from_millis(now - term.start);
        let gap = Duration::from_millis(ELECTION.lease_duration_ms - ELECTION.renew_deadline_ms);
        let registry = term.registry.clone();
        let prev_holder = term.prev_holder;
        let standing = |b: BrokerId| {
            let record = registry.get(&b.0);
            Standing {
                applied: record.map(|r| r.1),
                silent_for: handover::silent_for(
                    record.map(|r| Duration::from_millis(now - r.0)),
                    leading_for,
                    (Some(b.0) == prev_holder).then_some(gap),
                ),
            }
        };
        let (partitions, pending) = handover::next_leadership(
            previous.as_ref(),
            &desired,
            (term.epoch, version),
            standing,
            &timing(),
        );
        let rows = (0..BROKERS)
            .map(|id| BrokerEntry {
                id: BrokerId(id),
                host: "h".into(),
                port: 1,
                rack: None,
                health: Health::Alive,
            })
            .collect();
        let mut next = Assignment::new(term.epoch, version, rows, partitions, []);
        next.pending = pending;
        if let Some(prev) = &previous {
            for broker in handover::lost_leadership(prev, &next) {
                term.floor.raise(broker, (term.epoch, version));
            }
        }
        // Written now; it lands on disk at a later step (a pause may come between).
        n.pending_file = Some((next, term.seq));
    }

    /// The watcher and applier: accept the file on disk, relinquish, take over, report.
    fn watch(&mut self, b: i32) {
        let Some(candidate) = self.file.clone() else {
            return;
        };
        let n = &self.nodes[b as usize];
        if accept(n.applied.as_ref(), &candidate, n.lease_epoch_seen) != Decision::Accept {
            return;
        }
        let mut d = diff(n.applied.as_ref(), &candidate, BrokerId(b));
        // `apply_loop` and `Shard::revalidate`: a file that does not follow the applied one
        // may hide files that moved a kept partition away and back; a kept partition another
        // broker took over since this one opened it (its stored epoch rose) is reopened.
        let consecutive = n.applied.as_ref().is_some_and(|a| {
            (a.controller_epoch, a.assignment_version + 1) == candidate.order_key()
        });
        if !consecutive {
            let kept: Vec<TopicPartition> = candidate
                .led_by(BrokerId(b))
                .filter(|t| {
                    n.serving.get(&t.partition).is_some_and(|&mine| {
                        self.openings
                            .iter()
                            .any(|&(p, seq, _)| p == t.partition && seq > mine)
                    })
                })
                .cloned()
                .collect();
            d.relinquish.extend(kept.iter().cloned());
            d.take_over.extend(kept);
        }
        for t in &d.relinquish {
            // Leave the serving set, then wait for the writes in flight: they land now.
            let n = &mut self.nodes[b as usize];
            n.serving.remove(&t.partition);
            let inflight = n
                .writes
                .iter()
                .filter(|w| w.partition == t.partition && w.landed.is_none())
                .count();
            for _ in 0..inflight {
                let seq = self.next_seq();
                let n = &mut self.nodes[b as usize];
                if let Some(w) = n
                    .writes
                    .iter_mut()
                    .find(|w| w.partition == t.partition && w.landed.is_none())
                {
                    w.landed = Some(seq);
                }
            }
        }
        for t in &d.take_over {
            let seq = self.next_seq();
            self.nodes[b as usize].serving.insert(t.partition, seq);
            self.openings.push((t.partition, seq, b));
        }
        let n = &mut self.nodes[b as usize];
        n.lease_epoch_seen = n.lease_epoch_seen.max(candidate.controller_epoch);
        n.applied = Some(candidate);
    }

    /// Acknowledged writes that a later leadership term superseded: it opened the log before
    /// the write landed and then wrote (its first write starts a segment at a higher epoch from
    /// the offsets it recovered, so recovery cuts the older epoch's data past it — see
    /// `kaas_storage::divergence`). A term that never writes supersedes nothing.
    fn lost(&self) -> Vec<String> {
        let wrote = |term: u64| {
            self.nodes
                .iter()
                .flat_map(|n| &n.writes)
                .any(|w| w.term == term && w.landed.is_some())
                || self.landed_terms.contains(&term)
        };
        let mut out = Vec::new();
        for &(p, term, landed, by) in &self.acked {
            for &(op, open, who) in &self.openings {
                if op == p && open > term && open < landed && wrote(open) {
                    out.push(format!(
                        "partition {p}: write by broker {by} (term {term}) landed at {landed}, \
                         after broker {who} took the partition over at {open}, and was acknowledged"
                    ));
                }
            }
        }
        out
    }
}

/// Every action of every broker, once.
fn all_actions() -> Vec<Event> {
    use Event::*;
    (0..BROKERS)
        .flat_map(|b| {
            [
                Election(b),
                Election(b),
                Status(b),
                Deliver(b),
                AckDeliver(b),
                Round(b, 0),
                FileLand(b),
                Watch(b),
                BeginWrite(b, 0),
                Land(b),
                AckCheck(b),
            ]
        })
        .collect()
}

/// One scheduling step: time passes, perhaps a broker is paused, then any subset of the
/// brokers' actions runs in any order (with a chosen balancer wish and write target).
fn step() -> impl Strategy<Value = Vec<Event>> {
    (
        1u64..300,
        proptest::option::weighted(0.08, (0..BROKERS, 500u64..9_000)),
        proptest::option::weighted(0.02, 0..BROKERS),
        proptest::sample::subsequence(all_actions(), 0..=all_actions().len()).prop_shuffle(),
        any::<u8>(),
        0..PARTITIONS,
    )
        .prop_map(|(tick, pause, release, actions, choice, p)| {
            let mut out = vec![Event::Tick(tick)];
            out.extend(pause.map(|(b, ms)| Event::Pause(b, ms)));
            out.extend(release.map(Event::Release));
            out.extend(actions.into_iter().map(|e| match e {
                Event::Round(b, _) => Event::Round(b, choice),
                Event::BeginWrite(b, _) => Event::BeginWrite(b, p),
                e => e,
            }));
            out
        })
}

/// Cases per property: a quick run in the test command, a long one with KAAS_LONG_TESTS=1.
fn cases() -> u32 {
    match std::env::var("KAAS_LONG_TESTS").as_deref() {
        Ok("") | Ok("0") | Err(_) => 300,
        Ok(_) => 20_000,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    // Any schedule of single events, delays and pauses: nothing acknowledged is lost.
    #[test]
    fn no_acknowledged_write_is_lost(events in proptest::collection::vec(event(), 1..1500)) {
        let mut world = World::new();
        for e in &events {
            world.apply(e);
        }
        let lost = world.lost();
        prop_assert!(lost.is_empty(), "{}", lost.join("\n"));
    }

    // Schedules where every broker keeps working, in random order and subsets, with pauses
    // of up to twice the Lease: nothing acknowledged is lost.
    #[test]
    fn no_acknowledged_write_is_lost_under_pauses(steps in proptest::collection::vec(step(), 1..400)) {
        let mut world = World::new();
        for e in steps.iter().flatten() {
            world.apply(e);
        }
        let lost = world.lost();
        prop_assert!(lost.is_empty(), "{}", lost.join("\n"));
    }
}

/// The start of the directed schedules: broker 0 wins the Lease (epoch 1) and, through its first
/// file, leads partition 0; broker 1 follows, heard and acknowledged.
fn broker_0_controls_and_leads_partition_0() -> World {
    use Event::*;
    let mut w = World::new();
    for e in [Election(0), Election(0), Election(0), Election(1)] {
        w.apply(&e);
    }
    assert_eq!(w.nodes[0].term.as_ref().map(|t| t.epoch), Some(1));
    for e in [
        Status(0),
        Status(1),
        Deliver(0),
        AckDeliver(0),
        AckDeliver(1),
        Round(0, 0),
        FileLand(0),
        Watch(0),
        Watch(1),
    ] {
        w.apply(&e);
    }
    assert!(
        w.nodes[0].serving.contains_key(&0),
        "broker 0 leads partition 0"
    );
    w
}

// The schedule found in a fault run: the controller pauses past its Lease with a write in
// flight; the successor moves its partitions by time; the old controller resumes, dials the
// successor, and is acknowledged while it still serves the old file. Its landed write must not
// be acknowledged.
#[test]
fn a_resumed_controller_is_not_acknowledged_before_it_applied_the_move() {
    use Event::*;
    let run = |w: &mut World, es: &[Event]| es.iter().for_each(|e| w.apply(e));
    let mut w = broker_0_controls_and_leads_partition_0();
    run(
        &mut w,
        &[Status(0), Deliver(0), AckDeliver(0), BeginWrite(0, 0)],
    );
    // Broker 0 pauses with the write submitted; broker 1 takes over the Lease and partitions.
    run(&mut w, &[Pause(0, 11_000)]);
    for _ in 0..30 {
        run(&mut w, &[Tick(300), Election(1), Election(1), Election(1)]);
    }
    assert!(w.nodes[1].term.is_some(), "broker 1 became controller");
    run(&mut w, &[Status(1), Deliver(1), AckDeliver(1)]);
    for _ in 0..8 {
        run(&mut w, &[Tick(300), Election(1), Election(1), Election(1)]);
    }
    run(&mut w, &[Status(1), Deliver(1)]);
    run(&mut w, &[Round(1, 1), FileLand(1), Watch(1)]);
    assert!(
        w.nodes[1].serving.contains_key(&0),
        "broker 1 took partition 0 over"
    );
    assert!(w.now >= 11_000, "broker 0's pause is over");
    // Broker 0 resumes: the write lands, it learns of the new holder and is heard.
    run(
        &mut w,
        &[
            Land(0),
            Election(0),
            Status(0),
            Deliver(1),
            AckDeliver(0),
            AckCheck(0),
        ],
    );
    assert!(w.lost().is_empty(), "{:?}", w.lost());
}

// The schedule of the chart's rolling upgrade: the controller is stopped with SIGTERM, so it
// releases the Lease but keeps serving its partitions, its fence still open from its own last
// acknowledgement. The broker that takes the free Lease over at once must not count an election
// gap for it (there was none: the Lease did not run out), so the draining broker's partition
// waits in a pending move instead of getting a second leader while the first still writes.
#[test]
fn a_released_lease_gives_the_draining_controller_no_election_gap() {
    use Event::*;
    let run = |w: &mut World, es: &[Event]| es.iter().for_each(|e| w.apply(e));
    let mut w = broker_0_controls_and_leads_partition_0();
    run(&mut w, &[Status(0), Deliver(0), AckDeliver(0)]);
    // SIGTERM: broker 0 gives the Lease up; broker 1 takes the free Lease at once.
    run(&mut w, &[Release(0), Election(1), Election(1), Election(1)]);
    let term = w.nodes[1]
        .term
        .as_ref()
        .expect("broker 1 became controller");
    assert_eq!(
        term.prev_holder, None,
        "a released Lease names no expired holder"
    );
    // Its first round wants everything on itself; broker 0 has not reported to it yet.
    run(&mut w, &[Round(1, 0), FileLand(1), Watch(1)]);
    assert!(
        !w.nodes[1].serving.contains_key(&0),
        "broker 1 took partition 0 over while broker 0 still served it: {:?}",
        w.file
    );
    // Broker 1 writes what it leads; broker 0, still serving partition 0, writes and
    // acknowledges within its fence.
    run(
        &mut w,
        &[
            BeginWrite(1, 0),
            Land(1),
            AckCheck(1),
            BeginWrite(0, 0),
            Land(0),
            AckCheck(0),
        ],
    );
    assert!(w.lost().is_empty(), "{:?}", w.lost());
    // Broker 0 reports to the new controller, applies the move and confirms; only then does
    // partition 0 get its new leader (choice 1 keeps wanting it on broker 1).
    run(
        &mut w,
        &[
            Election(0),
            Status(0),
            Deliver(1),
            AckDeliver(0),
            Watch(0),
            Status(0),
            Deliver(1),
        ],
    );
    run(&mut w, &[Round(1, 1), FileLand(1), Watch(1)]);
    assert!(
        w.nodes[1].serving.contains_key(&0),
        "the move completes once broker 0 confirmed: {:?}",
        w.file
    );
    assert!(w.lost().is_empty(), "{:?}", w.lost());
}
