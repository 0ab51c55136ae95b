//! Randomized model test of the KIP-848 group state machine (`kaas_groups::consumer`) with the
//! real server assignors, driven by well-behaved clients through random operations: members
//! joining and changing subscriptions, heartbeats (some slow to finish a revocation, some whose
//! answer is lost), leaving, sessions and rebalance timeouts expiring as time passes, topics
//! created, grown and deleted.
//!
//! A client behaves as Kafka's does: it consumes the last assignment it applied and reports it;
//! told a new assignment, it revokes what is gone and takes what is new before reporting again
//! (`apply`), possibly a few heartbeats later; it sends its owned partitions only after such a
//! reconciliation or in a full request (joining, or after a lost answer), and otherwise leaves
//! the field out ("unchanged") — or, in [`Reporting::Always`] cases, sends them every time, and
//! then no answer is lost. A member the coordinator removes (left, session or rebalance
//! timeout) is taken as gone: its client holds nothing from then on.
//!
//! Before a full request the client finishes reconciling to what it was last told. It must: an
//! explicit list is read as an acknowledgement of every revocation it leaves out (Kafka's
//! `CurrentAssignmentBuilder` reads it the same way), and during a revocation the member epoch
//! does not move, so the coordinator cannot tell a client that never received the answer asking
//! for it. A client told {0, 1}, still taking them, whose two next answers are lost (the first
//! asked it to give 1 back), would report {} and see 1 given to another member before it
//! starts consuming it.
//!
//! Checked after every step:
//! - no partition is held by two clients at once, counting what each client consumes and what
//!   it was told and may take at any moment (and, on the coordinator's side, no partition is in
//!   two members' assigned or pending-revocation sets);
//! - revoke before assign: a partition given to a member was free before that step (its
//!   previous owner acknowledged the revocation or is gone), and what a client is newly told is
//!   held by no other client;
//! - member epochs (per incarnation, as told to the client and as stored), the group epoch and
//!   the assignment epoch never decrease; a client that lost no answer is never fenced.
//!
//! After the operations, fenced clients rejoin and everyone keeps heartbeating: the group must
//! become Stable with every client owning exactly its target, and every partition of every
//! subscribed topic owned by exactly one member subscribed to it.
//!
//! `PROPTEST_CASES` runs more cases (the default here is 512).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kaas_groups::assignor::{self, MemberSpec, RackAwareWeights, TopicSpec, ASSIGNOR_NAMES};
use kaas_groups::consumer::{
    ConsumerGroup, HeartbeatArgs, HeartbeatEnv, HeartbeatResult, Topics, LEAVE_GROUP_MEMBER_EPOCH,
};
use kaas_groups::GroupError;
use proptest::prelude::*;
use uuid::Uuid;

const SESSION_MS: i32 = 45_000;
const REBALANCE_MS: i32 = 30_000;
const TOPICS: [&str; 3] = ["t0", "t1", "t2"];
const CLIENTS: usize = 5;
const MAX_PARTITIONS: i32 = 8;
/// Heartbeat rounds after the operations within which the group must be stable.
const CONVERGENCE_ROUNDS: usize = 20;

/// A topic-partition, by topic id.
type Tp = (Uuid, i32);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reporting {
    /// Owned partitions only when changed or in a full request (Kafka's Java client).
    Changes,
    /// Owned partitions in every heartbeat; no answer is ever lost.
    Always,
}

#[derive(Debug, Clone)]
enum Op {
    /// Joins with the topics of `mask` (bits over [`TOPICS`]), or changes its subscription.
    Subscribe {
        client: usize,
        mask: u8,
    },
    /// A heartbeat; `apply`: first finish reconciling to the last assignment told; `lose`: the
    /// coordinator handles it but the answer never arrives.
    Heartbeat {
        client: usize,
        apply: bool,
        lose: bool,
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
}

#[derive(Debug, Clone, Default)]
struct Client {
    member_id: String,
    rack: Option<String>,
    in_group: bool,
    /// Should be in the group: joined and neither left nor timed out (a fenced client rejoins).
    wants_in: bool,
    subscription: BTreeSet<String>,
    epoch: i32,
    /// What it consumes: the last assignment it applied.
    owned: BTreeSet<Tp>,
    /// The last assignment it was told and has not applied yet.
    told: Option<BTreeSet<Tp>>,
    /// It finished a reconciliation since it last sent its owned partitions (Kafka's Java
    /// client compares its local assignment epoch, so even an unchanged set is sent again).
    unsent: bool,
    /// Its last answer was lost: the next heartbeat is a full request.
    lost_answer: bool,
}

impl Client {
    /// What the client consumes or may start consuming before its next heartbeat.
    fn entitled(&self) -> BTreeSet<Tp> {
        let mut e = self.owned.clone();
        e.extend(self.told.iter().flatten().copied());
        e
    }
    fn drop_everything(&mut self) {
        self.in_group = false;
        self.owned.clear();
        self.told = None;
        self.unsent = false;
        self.lost_answer = false;
        self.epoch = 0;
    }
}

struct World {
    group: ConsumerGroup,
    clients: Vec<Client>,
    topics: BTreeMap<String, (Uuid, i32)>,
    table: Arc<dyn Topics>,
    next_topic_id: u128,
    now: Instant,
    assignor: &'static str,
    reporting: Reporting,
    /// The coordinator's epochs as last seen, to check they never decrease.
    group_epoch: i32,
    assignment_epoch: i32,
    member_epochs: BTreeMap<String, i32>,
}

fn to_set(a: &[(Uuid, Vec<i32>)]) -> BTreeSet<Tp> {
    a.iter()
        .flat_map(|(t, ps)| ps.iter().map(move |p| (*t, *p)))
        .collect()
}

fn to_wire(s: &BTreeSet<Tp>) -> Vec<(Uuid, Vec<i32>)> {
    let mut by_topic: BTreeMap<Uuid, Vec<i32>> = BTreeMap::new();
    for (t, p) in s {
        by_topic.entry(*t).or_default().push(*p);
    }
    by_topic.into_iter().collect()
}

fn run_assignor(
    name: &str,
    members: &[MemberSpec],
    topics: &BTreeMap<String, TopicSpec>,
) -> Option<assignor::GroupAssignment> {
    assignor::by_name(name, RackAwareWeights::default()).map(|a| a.assign(members, topics))
}

impl World {
    fn new(
        initial: [i32; 3],
        racks: [u8; CLIENTS],
        assignor: &'static str,
        reporting: Reporting,
    ) -> World {
        let mut w = World {
            group: ConsumerGroup::new("g"),
            clients: (0..CLIENTS)
                .map(|i| Client {
                    member_id: format!("m{i}"),
                    rack: (racks[i] > 0).then(|| format!("r{}", racks[i] - 1)),
                    ..Client::default()
                })
                .collect(),
            topics: BTreeMap::new(),
            table: Arc::new(BTreeMap::<String, (Uuid, i32)>::new()),
            next_topic_id: 1,
            now: Instant::now(),
            assignor,
            reporting,
            group_epoch: 0,
            assignment_epoch: 0,
            member_epochs: BTreeMap::new(),
        };
        for (t, n) in initial.iter().enumerate() {
            if *n > 0 {
                w.grow(t, *n);
            }
        }
        w
    }

    fn grow(&mut self, topic: usize, by: i32) {
        let name = TOPICS[topic].to_string();
        let next_id = &mut self.next_topic_id;
        let entry = self.topics.entry(name).or_insert_with(|| {
            *next_id += 1;
            (Uuid::from_u128(*next_id), 0)
        });
        entry.1 = (entry.1 + by).min(MAX_PARTITIONS);
        self.table = Arc::new(self.topics.clone());
    }

    fn delete(&mut self, topic: usize) {
        if self.topics.remove(TOPICS[topic]).is_some() {
            self.table = Arc::new(self.topics.clone());
        }
    }

    fn send(&mut self, args: HeartbeatArgs) -> Result<HeartbeatResult, GroupError> {
        let assignor = self.assignor;
        let env = HeartbeatEnv {
            now: self.now,
            topics: &self.table,
            new_member_id: &|| panic!("every member brings its own id (v1+)"),
            // Partition p of every topic is led from rack r{p % 2}.
            leader_rack: &|_, p| Some(format!("r{}", p % 2)),
            session_timeout_ms: SESSION_MS,
            default_assignor: assignor,
            assign: &run_assignor,
        };
        self.group.heartbeat(args, &env)
    }

    fn join(&mut self, i: usize, subscription: BTreeSet<String>) {
        let c = &self.clients[i];
        assert!(
            c.owned.is_empty() && c.told.is_none(),
            "rejoins holding nothing"
        );
        let args = HeartbeatArgs {
            member_id: c.member_id.clone(),
            member_epoch: 0,
            rack_id: c.rack.clone(),
            rebalance_timeout_ms: REBALANCE_MS,
            subscribed_topic_names: Some(subscription.iter().cloned().collect()),
            server_assignor: Some(self.assignor.to_string()),
            owned: Some(vec![]),
            ..HeartbeatArgs::default()
        };
        let r = self
            .send(args)
            .expect("a join with a fresh epoch is accepted");
        self.member_epochs.remove(&self.clients[i].member_id);
        let c = &mut self.clients[i];
        c.in_group = true;
        c.wants_in = true;
        c.subscription = subscription;
        c.epoch = 0;
        c.unsent = false;
        self.receive(i, r);
    }

    /// A heartbeat from client `i`, which is in the group.
    fn heartbeat(
        &mut self,
        i: usize,
        apply: bool,
        lose: bool,
        subscribe: Option<BTreeSet<String>>,
    ) {
        let lose = lose && self.reporting == Reporting::Changes;
        let c = &mut self.clients[i];
        // A full request reports a finished reconciliation (see the module doc).
        if apply || c.lost_answer {
            if let Some(t) = c.told.take() {
                c.owned = t;
                c.unsent = true;
            }
        }
        if let Some(s) = &subscribe {
            c.subscription = s.clone();
        }
        let full = c.lost_answer;
        let send_owned = full || c.unsent || self.reporting == Reporting::Always;
        let args = HeartbeatArgs {
            member_id: c.member_id.clone(),
            member_epoch: c.epoch,
            rebalance_timeout_ms: if full { REBALANCE_MS } else { -1 },
            subscribed_topic_names: (full || subscribe.is_some())
                .then(|| c.subscription.iter().cloned().collect()),
            owned: send_owned.then(|| to_wire(&c.owned)),
            ..HeartbeatArgs::default()
        };
        c.unsent &= !send_owned;
        let had_lost = c.lost_answer;
        let result = self.send(args);
        if lose {
            self.clients[i].lost_answer = true;
            return;
        }
        match result {
            Ok(r) => {
                self.clients[i].lost_answer = false;
                self.receive(i, r);
            }
            Err(GroupError::FencedMemberEpoch(_) | GroupError::UnknownMemberId(_)) if had_lost => {
                // It missed answers: it gives up its partitions and will rejoin (Kafka's rule).
                self.clients[i].drop_everything();
            }
            Err(e) => panic!("client {i} was refused: {e:?}"),
        }
    }

    /// Client `i` reads an answer: its epoch, and maybe a new assignment to reconcile to.
    fn receive(&mut self, i: usize, r: HeartbeatResult) {
        let c = &self.clients[i];
        assert_eq!(r.member_id, c.member_id);
        assert!(
            r.member_epoch >= c.epoch,
            "client {i}'s epoch went from {} to {}",
            c.epoch,
            r.member_epoch
        );
        if let Some(a) = &r.assignment {
            let told = to_set(a);
            let mine = c.entitled();
            for (j, other) in self.clients.iter().enumerate() {
                if j == i || !other.in_group {
                    continue;
                }
                let taken: Vec<&Tp> = told
                    .difference(&mine)
                    .filter(|tp| other.entitled().contains(tp))
                    .collect();
                assert!(
                    taken.is_empty(),
                    "client {i} was given {taken:?}, which client {j} still holds or may take"
                );
            }
        }
        let c = &mut self.clients[i];
        c.epoch = r.member_epoch;
        if let Some(a) = r.assignment {
            c.told = Some(to_set(&a));
        }
    }

    fn leave(&mut self, i: usize) {
        let args = HeartbeatArgs {
            member_id: self.clients[i].member_id.clone(),
            member_epoch: LEAVE_GROUP_MEMBER_EPOCH,
            ..HeartbeatArgs::default()
        };
        let r = self.send(args);
        assert!(r.is_ok(), "a member in the group may leave: {r:?}");
        self.clients[i].drop_everything();
        self.clients[i].wants_in = false;
    }

    fn advance(&mut self, ms: u64) {
        self.now += Duration::from_millis(ms);
        for id in self.group.tick(self.now) {
            let c = self
                .clients
                .iter_mut()
                .find(|c| c.member_id == id)
                .expect("removed members are clients");
            // A member the coordinator dropped is gone: its client holds nothing from now on. (A
            // fenced client that is out already stays keen to rejoin.)
            if c.in_group {
                c.drop_everything();
                c.wants_in = false;
            }
        }
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Subscribe { client, mask } => {
                let subscription: BTreeSet<String> = (0..TOPICS.len())
                    .filter(|t| mask & (1 << t) != 0)
                    .map(|t| TOPICS[t].to_string())
                    .collect();
                if self.clients[client].in_group {
                    self.heartbeat(client, false, false, Some(subscription));
                } else {
                    self.join(client, subscription);
                }
            }
            Op::Heartbeat {
                client,
                apply,
                lose,
            } => {
                if self.clients[client].in_group {
                    self.heartbeat(client, apply, lose, None);
                }
            }
            Op::Leave { client } => {
                if self.clients[client].in_group {
                    self.leave(client);
                }
            }
            Op::Advance { ms } => self.advance(ms),
            Op::Grow { topic, by } => self.grow(topic, by),
            Op::Delete { topic } => self.delete(topic),
        }
    }

    /// Every member's assigned and pending-revocation partitions, by member.
    fn server_owned(&self) -> BTreeMap<String, BTreeSet<Tp>> {
        self.group
            .members
            .values()
            .map(|m| {
                let mut s = BTreeSet::new();
                for (t, ps) in m.assigned.iter().chain(m.pending_revocation.iter()) {
                    s.extend(ps.iter().map(|p| (*t, *p)));
                }
                (m.member_id.clone(), s)
            })
            .collect()
    }

    /// The invariants that hold after every step; `before` is [`World::server_owned`] before it.
    fn check(&mut self, before: &BTreeMap<String, BTreeSet<Tp>>) {
        let mut held: BTreeMap<Tp, usize> = BTreeMap::new();
        for (i, c) in self.clients.iter().enumerate() {
            if !c.in_group {
                assert!(
                    c.entitled().is_empty(),
                    "client {i} is out but holds partitions"
                );
                continue;
            }
            for tp in c.entitled() {
                if let Some(j) = held.insert(tp, i) {
                    panic!("{tp:?} is held by clients {j} and {i}");
                }
            }
        }
        let after = self.server_owned();
        let mut owner: BTreeMap<Tp, &str> = BTreeMap::new();
        for (m, s) in &after {
            for tp in s {
                if let Some(o) = owner.insert(*tp, m) {
                    panic!("{tp:?} is owned by members {o} and {m} on the coordinator");
                }
            }
        }
        for (m, s) in &after {
            let new = s
                .difference(before.get(m).unwrap_or(&BTreeSet::new()))
                .copied()
                .collect::<Vec<_>>();
            for (n, old) in before
                .iter()
                .filter(|(n, _)| *n != m && after.contains_key(*n))
            {
                let stolen: Vec<&Tp> = new.iter().filter(|tp| old.contains(tp)).collect();
                assert!(
                    stolen.is_empty(),
                    "{m} was given {stolen:?} before {n} released them"
                );
            }
        }
        self.check_epochs();
    }

    fn check_epochs(&mut self) {
        let g = &self.group;
        assert!(
            g.group_epoch >= self.group_epoch,
            "the group epoch went back"
        );
        assert!(
            g.assignment_epoch >= self.assignment_epoch,
            "the assignment epoch went back"
        );
        assert!(g.assignment_epoch <= g.group_epoch);
        self.group_epoch = g.group_epoch;
        self.assignment_epoch = g.assignment_epoch;
        self.member_epochs
            .retain(|id, _| g.members.contains_key(id));
        for m in g.members.values() {
            let last = self
                .member_epochs
                .entry(m.member_id.clone())
                .or_insert(m.member_epoch);
            assert!(m.member_epoch >= *last, "{}'s epoch went back", m.member_id);
            *last = m.member_epoch;
        }
        for (i, c) in self.clients.iter().enumerate() {
            if c.in_group && !c.lost_answer {
                let m = g
                    .members
                    .get(&c.member_id)
                    .expect("a client in the group is a member");
                assert_eq!(
                    m.member_epoch, c.epoch,
                    "client {i} and its member disagree on the epoch"
                );
            }
        }
    }

    fn step(&mut self, op: &Op) {
        let before = self.server_owned();
        self.apply(op);
        self.check(&before);
    }

    /// No more operations: fenced clients rejoin, everyone heartbeats until the group is stable.
    fn converge(&mut self) {
        for round in 0..CONVERGENCE_ROUNDS {
            for i in 0..CLIENTS {
                let before = self.server_owned();
                let c = &self.clients[i];
                if c.in_group {
                    self.heartbeat(i, true, false, None);
                } else if c.wants_in {
                    let s = c.subscription.clone();
                    self.join(i, s);
                }
                self.check(&before);
            }
            if round > 0 && self.settled() {
                self.check_final();
                return;
            }
        }
        panic!(
            "not stable after {CONVERGENCE_ROUNDS} rounds: {:#?}",
            self.group
        );
    }

    /// Stable, and every client owns what it was last told, which is its target.
    fn settled(&self) -> bool {
        let stable = matches!(self.group.state_name(), "Stable" | "Empty");
        stable
            && self.clients.iter().filter(|c| c.in_group).all(|c| {
                let m = &self.group.members[&c.member_id];
                let target = self
                    .group
                    .target
                    .get(&c.member_id)
                    .cloned()
                    .unwrap_or_default();
                let as_set = |a: &BTreeMap<Uuid, BTreeSet<i32>>| {
                    a.iter()
                        .flat_map(|(t, ps)| ps.iter().map(move |p| (*t, *p)))
                        .collect::<BTreeSet<_>>()
                };
                c.told.is_none() && c.owned == as_set(&m.assigned) && c.owned == as_set(&target)
            })
    }

    /// Every partition of every subscribed topic is owned by exactly one member subscribed to it.
    fn check_final(&self) {
        let mut owner: BTreeMap<Tp, usize> = BTreeMap::new();
        for (i, c) in self.clients.iter().enumerate().filter(|(_, c)| c.in_group) {
            for tp in &c.owned {
                let name = self
                    .topics
                    .iter()
                    .find(|(_, (id, _))| *id == tp.0)
                    .map(|(n, _)| n);
                let name =
                    name.unwrap_or_else(|| panic!("client {i} owns {tp:?} of a deleted topic"));
                assert!(
                    c.subscription.contains(name),
                    "client {i} owns {tp:?} of {name}, not subscribed"
                );
                assert!(tp.1 < self.topics[name].1);
                assert!(owner.insert(*tp, i).is_none(), "{tp:?} is owned twice");
            }
        }
        let subscribed: BTreeSet<&String> = self
            .clients
            .iter()
            .filter(|c| c.in_group)
            .flat_map(|c| &c.subscription)
            .collect();
        for name in subscribed {
            if let Some((id, n)) = self.topics.get(name) {
                for p in 0..*n {
                    assert!(
                        owner.contains_key(&(*id, p)),
                        "{name}-{p} is owned by nobody"
                    );
                }
            }
        }
    }
}

fn op() -> impl Strategy<Value = Op> {
    let client = 0..CLIENTS;
    prop_oneof![
        3 => (client.clone(), 0u8..8).prop_map(|(client, mask)| Op::Subscribe { client, mask }),
        10 => (client.clone(), any::<bool>(), prop::bool::weighted(0.1)).prop_map(
            |(client, apply, lose)| Op::Heartbeat { client, apply, lose }
        ),
        1 => client.prop_map(|client| Op::Leave { client }),
        2 => prop_oneof![0u64..5_000, 25_000u64..50_000].prop_map(|ms| Op::Advance { ms }),
        1 => (0..TOPICS.len(), 1i32..4).prop_map(|(topic, by)| Op::Grow { topic, by }),
        1 => (0..TOPICS.len()).prop_map(|topic| Op::Delete { topic }),
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

    // No partition held twice, revoke before assign, epochs never go back, and the group
    // converges to a stable assignment covering every subscribed partition once.
    #[test]
    fn consumer_group_model(
        initial in [0i32..5, 0i32..5, 0i32..5],
        racks in prop::array::uniform5(0u8..3),
        assignor in prop::sample::select(ASSIGNOR_NAMES.to_vec()),
        always in any::<bool>(),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let reporting = if always { Reporting::Always } else { Reporting::Changes };
        let mut w = World::new(initial, racks, assignor, reporting);
        for op in &ops {
            w.step(op);
        }
        w.converge();
    }
}
