//! Randomized model test of the classic group state machine (`kaas_groups::classic`), driven by
//! well-behaved eager consumers through random operations: members joining (with and without
//! KIP-394's member-id round trip) and changing subscriptions, heartbeats, JoinGroup and
//! SyncGroup answers read late, members leaving, sessions, join and sync deadlines expiring as
//! time passes, topics created, grown and deleted, and the coordinator restarting from what it
//! stored of the group (its last settled generation).
//!
//! A client behaves as Kafka's eager consumer does: it consumes the assignment of its last
//! SyncGroup answer; told a rebalance is in progress (by a heartbeat) or wanting one (a new
//! subscription; the leader seeing the topics change), it revokes everything and rejoins; the
//! leader computes the assignment from the members' subscriptions in its JoinGroup answer (a
//! per-topic round robin over the topics as they are now). A member the coordinator removes is
//! taken as gone: its client holds nothing from then on, and rejoins afresh.
//!
//! Checked after every step:
//! - no partition is held by two clients at once;
//! - revoke before assign: what a SyncGroup answer gives is held by no other client, and a
//!   client holds partitions only of the group's current generation (everyone in an older one
//!   rejoined, so revoked, or was removed, before a new generation was formed);
//! - the group's generation and the generation each client is told never decrease;
//! - a member is removed for an expired session only once its session timeout has passed since
//!   the coordinator last took a request from it as a live member's (a heartbeat it accepted, a
//!   JoinGroup or SyncGroup it kept or answered at once) or answered one it had kept waiting —
//!   as Kafka restarts a member's session when it answers a parked JoinGroup or SyncGroup.
//!
//! After the operations, everyone who wants to be in the group keeps acting and heartbeating as
//! time passes in small steps: the group must become Stable with every such client in the
//! current generation, and every partition of every subscribed topic held by exactly one client
//! subscribed to it.
//!
//! `PROPTEST_CASES` runs more cases (the default here is 512).

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_channel::oneshot;
use kaas_groups::classic::{
    parse_subscription_topics, ClassicGroup, ClassicState, JoinArgs, JoinResult, JoinedMember,
    MemberRef, Removal, Reply, SettledKey, StoredGroup, SyncResult,
};
use kaas_groups::GroupError;
use proptest::prelude::*;
use uuid::Uuid;

const MIN_SESSION_MS: i32 = 6_000;
const MAX_SESSION_MS: i32 = 300_000;
const SESSION_MS: i32 = 10_000;
const REBALANCE_MS: i32 = 30_000;
const TOPICS: [&str; 3] = ["t0", "t1", "t2"];
const CLIENTS: usize = 5;
const MAX_PARTITIONS: i32 = 8;
/// Rounds of 200 ms after the operations within which the group must be stable.
const CONVERGENCE_ROUNDS: usize = 60;

/// A topic-partition, by name (the classic protocol's assignments name topics).
type Tp = (String, i32);

#[derive(Debug, Clone)]
enum Op {
    /// Starts (or restarts with) a subscription to the topics of `mask` (bits over [`TOPICS`]).
    Subscribe {
        client: usize,
        mask: u8,
    },
    /// The client's next move: join, read an answer and sync, or heartbeat.
    Act {
        client: usize,
    },
    /// Revokes everything and leaves the group.
    Leave {
        client: usize,
    },
    /// Time passes and the coordinator's timer fires.
    Advance {
        ms: u64,
    },
    /// More partitions (a topic that does not exist is created with `by`).
    Grow {
        topic: usize,
        by: i32,
    },
    Delete {
        topic: usize,
    },
    /// The coordinator restarts (or the group moves to another broker): the group comes back
    /// from what was stored, every JoinGroup and SyncGroup waiting is dropped.
    Restart,
}

/// An answer given at once, or one the coordinator gives later.
enum Answer<T> {
    Ready(Option<T>),
    Waiting(oneshot::Receiver<T>),
}

impl<T> Answer<T> {
    fn from(r: Reply<T>) -> Answer<T> {
        match r {
            Reply::Now(v) => Answer::Ready(Some(v)),
            Reply::Later(rx) => Answer::Waiting(rx),
        }
    }
    /// The answer if it came; `dropped` stands for one whose sender went away (the shard's
    /// handler answers REBALANCE_IN_PROGRESS then).
    fn poll(&mut self, dropped: impl FnOnce() -> T) -> Option<T> {
        match self {
            Answer::Ready(v) => v.take(),
            Answer::Waiting(rx) => match rx.try_recv() {
                Ok(v) => v,
                Err(_) => Some(dropped()),
            },
        }
    }
    /// Turns a waiting answer that has come (or whose sender went away) into a ready one;
    /// true if it did so now.
    fn settle(&mut self, dropped: impl FnOnce() -> T) -> bool {
        let Answer::Waiting(rx) = self else {
            return false;
        };
        let v = match rx.try_recv() {
            Ok(None) => return false,
            Ok(Some(v)) => v,
            Err(_) => dropped(),
        };
        *self = Answer::Ready(Some(v));
        true
    }
}

enum Phase {
    Out,
    /// Was given a member id (KIP-394) and joins with it next.
    HasId,
    Joining(Answer<JoinResult>),
    Syncing {
        generation: i32,
        /// The leader's topic table version when it computed the assignment.
        table_version: Option<u64>,
        answer: Answer<SyncResult>,
    },
    Stable {
        generation: i32,
        /// The leader's: the topic table version its assignment was computed from.
        table_version: Option<u64>,
        held: BTreeSet<Tp>,
    },
}

struct Client {
    client_id: String,
    member_id: Option<String>,
    subscription: BTreeSet<String>,
    /// The subscription of its last JoinGroup (a change mid-rebalance waits for the next).
    joined_with: BTreeSet<String>,
    wants_in: bool,
    phase: Phase,
    /// The last generation this incarnation was told.
    generation: i32,
    /// When the coordinator last heard from this member as a live one, or answered a request
    /// it had kept waiting (see the module docs).
    alive_at: Instant,
}

impl Client {
    fn held(&self) -> Option<&BTreeSet<Tp>> {
        match &self.phase {
            Phase::Stable { held, .. } => Some(held),
            _ => None,
        }
    }
    /// Notes, at `now`, an answer the coordinator gave to a request it had kept waiting: the
    /// answer stays for the client to read when it next acts.
    fn note_answer(&mut self, now: Instant) {
        let answered = match &mut self.phase {
            Phase::Joining(a) => {
                a.settle(|| JoinResult::error(GroupError::RebalanceInProgress, ""))
            }
            Phase::Syncing { answer, .. } => answer.settle(|| SyncResult {
                error: Some(GroupError::RebalanceInProgress),
                ..SyncResult::default()
            }),
            _ => false,
        };
        if answered {
            self.alive_at = now;
        }
    }
    fn forget(&mut self) {
        self.phase = Phase::Out;
        self.member_id = None;
        self.generation = 0;
    }
}

/// The consumer protocol's Subscription: version 0, the topics, no user data.
fn subscription_bytes(topics: &BTreeSet<String>) -> Bytes {
    let mut b = vec![0u8, 0];
    b.extend_from_slice(&(topics.len() as i32).to_be_bytes());
    for t in topics {
        b.extend_from_slice(&(t.len() as i16).to_be_bytes());
        b.extend_from_slice(t.as_bytes());
    }
    b.extend_from_slice(&(-1i32).to_be_bytes());
    Bytes::from(b)
}

/// The model's assignment encoding: `topic:partition` pairs separated by commas.
fn encode(held: &BTreeSet<Tp>) -> Bytes {
    let parts: Vec<String> = held.iter().map(|(t, p)| format!("{t}:{p}")).collect();
    Bytes::from(parts.join(","))
}

fn decode(b: &Bytes) -> BTreeSet<Tp> {
    let s = std::str::from_utf8(b).expect("the model's own encoding");
    s.split(',')
        .filter(|x| !x.is_empty())
        .map(|x| {
            let (t, p) = x.split_once(':').expect("topic:partition");
            (t.to_string(), p.parse().expect("a partition"))
        })
        .collect()
}

struct World {
    group: ClassicGroup,
    clients: Vec<Client>,
    topics: BTreeMap<String, i32>,
    table_version: u64,
    now: Instant,
    kip394: bool,
    next_id: Cell<u128>,
    generation: i32,
    initial_delay_ms: u64,
    /// What the coordinator stored of the group: its last settled state, written whenever it
    /// settles and before any member is answered with it (the shard stores a new generation
    /// before it answers a SyncGroup, and an emptied group before it answers the LeaveGroup
    /// or within its next tick).
    stored: Option<StoredGroup>,
    /// The settled state's fingerprint when it was stored.
    stored_key: Option<SettledKey>,
}

impl World {
    fn new(initial: [i32; 3], initial_delay_ms: u64, kip394: bool) -> World {
        let topics = (0..TOPICS.len())
            .filter(|t| initial[*t] > 0)
            .map(|t| (TOPICS[t].to_string(), initial[t]))
            .collect();
        let now = Instant::now();
        World {
            group: ClassicGroup::new("g", initial_delay_ms),
            clients: (0..CLIENTS)
                .map(|i| Client {
                    client_id: format!("c{i}"),
                    member_id: None,
                    subscription: BTreeSet::new(),
                    joined_with: BTreeSet::new(),
                    wants_in: false,
                    phase: Phase::Out,
                    generation: 0,
                    alive_at: now,
                })
                .collect(),
            topics,
            table_version: 0,
            now,
            kip394,
            next_id: Cell::new(1),
            generation: 0,
            initial_delay_ms,
            stored: None,
            stored_key: None,
        }
    }

    fn join_args(&self, i: usize) -> JoinArgs {
        let c = &self.clients[i];
        JoinArgs {
            member_id: c.member_id.clone().unwrap_or_default(),
            instance_id: None,
            client_id: c.client_id.clone(),
            client_host: "/model".into(),
            session_timeout_ms: SESSION_MS,
            rebalance_timeout_ms: REBALANCE_MS,
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), subscription_bytes(&c.subscription))],
            require_known_member_id: self.kip394,
            supports_skip_assignment: true,
        }
    }

    /// A JoinGroup from client `i` (holding nothing: an eager consumer revoked first).
    fn join(&mut self, i: usize) {
        let args = self.join_args(i);
        let fresh = args.member_id.is_empty();
        self.clients[i].joined_with = self.clients[i].subscription.clone();
        let next = &self.next_id;
        let new_id = || {
            let n = next.get();
            next.set(n + 1);
            Uuid::from_u128(n)
        };
        let reply = self
            .group
            .join(args, self.now, MIN_SESSION_MS, MAX_SESSION_MS, &new_id);
        let c = &mut self.clients[i];
        if fresh {
            // The id the coordinator made from the caller's generator.
            c.member_id = Some(format!(
                "{}-{}",
                c.client_id,
                Uuid::from_u128(next.get() - 1)
            ));
        }
        match reply {
            Reply::Now(r) if r.error == Some(GroupError::MemberIdRequired) => {
                assert_eq!(Some(&r.member_id), c.member_id.as_ref());
                c.phase = Phase::HasId;
            }
            r => {
                if matches!(r, Reply::Later(_)) {
                    c.alive_at = self.now;
                }
                c.phase = Phase::Joining(Answer::from(r))
            }
        }
    }

    /// The leader's assignment: each topic's partitions dealt round robin over its subscribers.
    fn assign(&self, members: &[JoinedMember]) -> Vec<(String, Bytes)> {
        let mut out: BTreeMap<&str, BTreeSet<Tp>> = BTreeMap::new();
        let mut subs: Vec<(&str, Vec<String>)> = Vec::new();
        for m in members {
            let topics = parse_subscription_topics(&m.metadata).expect("a consumer subscription");
            out.insert(&m.member_id, BTreeSet::new());
            subs.push((&m.member_id, topics));
        }
        subs.sort();
        for (t, n) in &self.topics {
            let takers: Vec<&str> = subs
                .iter()
                .filter(|(_, ts)| ts.contains(t))
                .map(|(m, _)| *m)
                .collect();
            for p in 0..*n {
                if let Some(m) = takers.get(p as usize % takers.len().max(1)) {
                    out.get_mut(m).expect("listed").insert((t.clone(), p));
                }
            }
        }
        out.into_iter()
            .map(|(m, held)| (m.to_string(), encode(&held)))
            .collect()
    }

    fn member_ref(&self, i: usize, generation: i32) -> (String, i32) {
        (
            self.clients[i].member_id.clone().expect("in the group"),
            generation,
        )
    }

    /// Client `i` read its JoinGroup answer: it syncs (the leader with the assignment).
    fn joined(&mut self, i: usize, r: JoinResult) {
        match r.error {
            None => {}
            Some(GroupError::RebalanceInProgress) => return self.join(i),
            Some(GroupError::UnknownMemberId(_)) => return self.clients[i].forget(),
            Some(e) => panic!("client {i}'s JoinGroup was refused: {e:?}"),
        }
        let c = &mut self.clients[i];
        assert_eq!(Some(&r.member_id), c.member_id.as_ref());
        assert!(
            r.generation >= c.generation,
            "client {i} went back a generation"
        );
        c.generation = r.generation;
        let leader = r.leader == r.member_id;
        let assignments = if leader {
            self.assign(&r.members)
        } else {
            Vec::new()
        };
        let (id, generation) = self.member_ref(i, r.generation);
        let reply = self.group.sync(
            MemberRef {
                member_id: &id,
                instance_id: None,
                generation,
            },
            r.protocol_type.as_deref(),
            r.protocol_name.as_deref(),
            assignments,
            self.now,
        );
        if matches!(
            &reply,
            Reply::Later(_) | Reply::Now(SyncResult { error: None, .. })
        ) {
            self.clients[i].alive_at = self.now;
        }
        self.clients[i].phase = Phase::Syncing {
            generation,
            table_version: leader.then_some(self.table_version),
            answer: Answer::from(reply),
        };
    }

    /// Client `i` read its SyncGroup answer: it consumes what it was given.
    fn synced(&mut self, i: usize, generation: i32, table_version: Option<u64>, r: SyncResult) {
        match r.error {
            None => {}
            Some(GroupError::RebalanceInProgress | GroupError::IllegalGeneration(_)) => {
                return self.join(i)
            }
            Some(GroupError::UnknownMemberId(_)) => return self.clients[i].forget(),
            Some(e) => panic!("client {i}'s SyncGroup was refused: {e:?}"),
        }
        let held = decode(&r.assignment);
        for (j, other) in self.clients.iter().enumerate() {
            let taken: Vec<&Tp> = other
                .held()
                .into_iter()
                .flatten()
                .filter(|tp| held.contains(tp))
                .collect();
            assert!(
                j == i || taken.is_empty(),
                "client {i} was given {taken:?}, which client {j} still holds"
            );
        }
        self.clients[i].phase = Phase::Stable {
            generation,
            table_version,
            held,
        };
    }

    /// Client `i`'s next move.
    fn act(&mut self, i: usize) {
        let c = &mut self.clients[i];
        match &mut c.phase {
            Phase::Out if c.wants_in => self.join(i),
            Phase::Out => {}
            Phase::HasId => self.join(i),
            Phase::Joining(answer) => {
                let dropped = || JoinResult::error(GroupError::RebalanceInProgress, "");
                if let Some(r) = answer.poll(dropped) {
                    self.joined(i, r);
                }
            }
            Phase::Syncing {
                generation,
                table_version,
                answer,
            } => {
                let (generation, table_version) = (*generation, *table_version);
                let dropped = || SyncResult {
                    error: Some(GroupError::RebalanceInProgress),
                    ..SyncResult::default()
                };
                if let Some(r) = answer.poll(dropped) {
                    self.synced(i, generation, table_version, r);
                }
            }
            Phase::Stable {
                generation,
                table_version,
                ..
            } => {
                let generation = *generation;
                if table_version.is_some_and(|v| v != self.table_version)
                    || c.subscription != c.joined_with
                {
                    // The leader saw the topics change, or the subscription changed since the
                    // last join: a new generation, everyone revokes.
                    return self.join(i);
                }
                self.heartbeat(i, generation);
            }
        }
    }

    fn heartbeat(&mut self, i: usize, generation: i32) {
        let (id, generation) = self.member_ref(i, generation);
        let r = self.group.heartbeat(
            MemberRef {
                member_id: &id,
                instance_id: None,
                generation,
            },
            self.now,
        );
        if matches!(r, Ok(()) | Err(GroupError::RebalanceInProgress)) {
            self.clients[i].alive_at = self.now;
        }
        match r {
            Ok(()) => {}
            // Eager: revoke everything, then rejoin.
            Err(GroupError::RebalanceInProgress | GroupError::IllegalGeneration(_)) => self.join(i),
            Err(GroupError::UnknownMemberId(_)) => self.clients[i].forget(),
            Err(e) => panic!("client {i}'s heartbeat was refused: {e:?}"),
        }
    }

    fn subscribe(&mut self, i: usize, mask: u8) {
        let subscription: BTreeSet<String> = (0..TOPICS.len())
            .filter(|t| mask & (1 << t) != 0)
            .map(|t| TOPICS[t].to_string())
            .collect();
        let c = &mut self.clients[i];
        match c.phase {
            Phase::Out => {
                c.subscription = subscription;
                c.wants_in = true;
                self.join(i);
            }
            Phase::Stable { .. } => {
                c.subscription = subscription;
                self.join(i);
            }
            // Mid-rebalance: the new subscription waits for the next join.
            _ => c.subscription = subscription,
        }
    }

    fn leave(&mut self, i: usize) {
        let c = &mut self.clients[i];
        c.wants_in = false;
        if let Some(id) = c.member_id.clone() {
            match self.group.leave(&id, None, self.now) {
                Ok(left) => assert_eq!(left, id),
                // A KIP-394 id that expired, or a member the coordinator already removed.
                Err(GroupError::UnknownMemberId(_)) => {}
                Err(e) => panic!("client {i}'s LeaveGroup was refused: {e:?}"),
            }
        }
        self.clients[i].forget();
    }

    fn set_partitions(&mut self, topic: usize, partitions: Option<i32>) {
        let name = TOPICS[topic].to_string();
        match partitions {
            Some(n) => self.topics.insert(name, n.min(MAX_PARTITIONS)),
            None => self.topics.remove(&name),
        };
        self.table_version += 1;
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Subscribe { client, mask } => self.subscribe(client, mask),
            Op::Act { client } => self.act(client),
            Op::Leave { client } => self.leave(client),
            Op::Advance { ms } => {
                self.now += Duration::from_millis(ms);
                let expired = self.group.tick(self.now);
                // Answers the tick gave (a deadline passed) count from now.
                self.note_answers();
                for (id, why) in expired {
                    if !matches!(why, Removal::SessionExpired { .. }) {
                        continue;
                    }
                    let Some((i, c)) = self
                        .clients
                        .iter()
                        .enumerate()
                        .find(|(_, c)| c.member_id.as_deref() == Some(id.as_str()))
                    else {
                        continue;
                    };
                    let quiet = self.now.saturating_duration_since(c.alive_at);
                    assert!(
                        quiet >= Duration::from_millis(SESSION_MS as u64),
                        "client {i}'s session expired {} ms after the coordinator last heard \
                         from it or answered it (session timeout {SESSION_MS} ms)",
                        quiet.as_millis()
                    );
                }
            }
            Op::Grow { topic, by } => {
                let n = self.topics.get(TOPICS[topic]).copied().unwrap_or(0);
                self.set_partitions(topic, Some(n + by));
            }
            Op::Delete { topic } => self.set_partitions(topic, None),
            Op::Restart => {
                let group = match self.stored.clone() {
                    Some(g) => ClassicGroup::restore("g", self.initial_delay_ms, g, self.now),
                    None => ClassicGroup::new("g", self.initial_delay_ms),
                };
                // Dropping the old group drops every answer it still owed.
                self.group = group;
                // The generation may go back to the stored one, from a rebalance whose
                // SyncGroup nobody was answered (Kafka's coordinator reuses those numbers
                // too): every client still holding partitions holds the stored generation,
                // and numbers only JoinGroup answers carried may be handed out again.
                let restored = self.group.generation;
                for (i, c) in self.clients.iter_mut().enumerate() {
                    if let Phase::Stable { generation, .. } = &c.phase {
                        assert_eq!(
                            *generation, restored,
                            "client {i} holds a generation that was not stored"
                        );
                    }
                    c.generation = c.generation.min(restored);
                    // Answers the old coordinator made but the client had not read went down
                    // with its connections: the client sees its request fail, and retries.
                    match &mut c.phase {
                        Phase::Joining(answer) => {
                            *answer = Answer::Ready(Some(JoinResult::error(
                                GroupError::RebalanceInProgress,
                                "",
                            )))
                        }
                        Phase::Syncing { answer, .. } => {
                            *answer = Answer::Ready(Some(SyncResult {
                                error: Some(GroupError::RebalanceInProgress),
                                ..SyncResult::default()
                            }))
                        }
                        _ => {}
                    }
                }
                self.generation = restored;
            }
        }
    }

    /// The coordinator stores the group whenever it settles in a new state.
    fn store(&mut self) {
        let key = self.group.settled_key();
        if key.is_some() && key != self.stored_key {
            self.stored = self.group.stored();
            self.stored_key = key;
        }
    }

    /// A member the coordinator removed (session, join or sync deadline, expired KIP-394 id)
    /// is gone: its client holds nothing and starts afresh.
    fn forget_removed(&mut self) {
        for c in &mut self.clients {
            let removed = c.member_id.as_ref().is_some_and(|id| {
                !matches!(c.phase, Phase::HasId | Phase::Out)
                    && !self.group.members.contains_key(id)
            });
            if removed {
                c.forget();
            }
        }
    }

    fn check(&mut self) {
        let g = &self.group;
        assert!(g.generation >= self.generation, "the generation went back");
        self.generation = g.generation;
        let mut holder: BTreeMap<&Tp, usize> = BTreeMap::new();
        for (i, c) in self.clients.iter().enumerate() {
            let Phase::Stable {
                generation, held, ..
            } = &c.phase
            else {
                continue;
            };
            assert_eq!(
                *generation, g.generation,
                "client {i} holds partitions of generation {generation}, the group is at {}",
                g.generation
            );
            for tp in held {
                if let Some(j) = holder.insert(tp, i) {
                    panic!("{tp:?} is held by clients {j} and {i}");
                }
            }
        }
    }

    /// Records the answers the coordinator gave since the last look (see `Client::alive_at`).
    fn note_answers(&mut self) {
        let now = self.now;
        for c in &mut self.clients {
            c.note_answer(now);
        }
    }

    fn step(&mut self, op: &Op) {
        self.apply(op);
        self.note_answers();
        self.store();
        self.forget_removed();
        self.check();
    }

    /// No more operations: everyone acts as time passes in small steps until the group is stable.
    fn converge(&mut self) {
        for _ in 0..CONVERGENCE_ROUNDS {
            self.step(&Op::Advance { ms: 200 });
            for i in 0..CLIENTS {
                self.step(&Op::Act { client: i });
            }
            if self.settled() {
                return self.check_final();
            }
        }
        panic!(
            "not stable after {CONVERGENCE_ROUNDS} rounds: {:?} at generation {}",
            self.group.state, self.group.generation
        );
    }

    /// Stable, everyone who wants in is consuming its assignment, computed from today's topics.
    fn settled(&self) -> bool {
        let wanted = self.clients.iter().filter(|c| c.wants_in).count();
        let stable = match wanted {
            0 => self.group.state == ClassicState::Empty,
            _ => self.group.state == ClassicState::Stable,
        };
        stable
            && self.group.members.len() == wanted
            && self
                .clients
                .iter()
                .filter(|c| c.wants_in)
                .all(|c| match &c.phase {
                    Phase::Stable { table_version, .. } => {
                        table_version.is_none_or(|v| v == self.table_version)
                            && c.subscription == c.joined_with
                    }
                    _ => false,
                })
    }

    /// Every partition of every subscribed topic is held by exactly one client subscribed to it.
    fn check_final(&self) {
        let mut holder: BTreeMap<&Tp, usize> = BTreeMap::new();
        for (i, c) in self.clients.iter().enumerate() {
            for tp in c.held().into_iter().flatten() {
                assert!(
                    c.subscription.contains(&tp.0),
                    "client {i} holds {tp:?}, not subscribed"
                );
                assert!(
                    tp.1 < self.topics.get(&tp.0).copied().unwrap_or(0),
                    "{tp:?} does not exist"
                );
                assert!(holder.insert(tp, i).is_none(), "{tp:?} is held twice");
            }
        }
        for c in self.clients.iter().filter(|c| c.wants_in) {
            for t in &c.subscription {
                for p in 0..self.topics.get(t).copied().unwrap_or(0) {
                    assert!(
                        holder.contains_key(&(t.clone(), p)),
                        "{t}-{p} is held by nobody"
                    );
                }
            }
        }
    }
}

fn op() -> impl Strategy<Value = Op> {
    let client = 0..CLIENTS;
    prop_oneof![
        2 => (client.clone(), 0u8..8).prop_map(|(client, mask)| Op::Subscribe { client, mask }),
        12 => client.clone().prop_map(|client| Op::Act { client }),
        1 => client.prop_map(|client| Op::Leave { client }),
        3 => prop_oneof![0u64..3_000, 9_000u64..35_000].prop_map(|ms| Op::Advance { ms }),
        1 => (0..TOPICS.len(), 1i32..4).prop_map(|(topic, by)| Op::Grow { topic, by }),
        1 => (0..TOPICS.len()).prop_map(|topic| Op::Delete { topic }),
        1 => Just(Op::Restart),
    ]
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    // No partition held twice, nothing held from an older generation, generations never go
    // back, and the group converges to an assignment covering every subscribed partition once.
    #[test]
    fn classic_group_model(
        initial in [0i32..5, 0i32..5, 0i32..5],
        initial_delay_ms in prop::sample::select(vec![0u64, 100]),
        kip394 in any::<bool>(),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let mut w = World::new(initial, initial_delay_ms, kip394);
        for op in &ops {
            w.step(op);
        }
        w.converge();
    }
}
