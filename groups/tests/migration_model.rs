//! Randomized model test of a KIP-848 group holding classic members: Kafka's online upgrade
//! (`ConsumerGroup::from_classic`) of a stable classic group, then random operations by
//! clients of three kinds — classic eager (they give up everything before rejoining), classic
//! cooperative (they report what they own and give up what their SyncGroup leaves out) and
//! consumer-protocol clients — joining, heartbeating (some slow to apply what they were told),
//! leaving, and time passing so sessions and deadlines expire. The run ends early if the last
//! consumer-protocol member leaves and the group is due to downgrade; then the classic
//! generation it hands over must be whole.
//!
//! Checked after every step: no partition is held by two clients at once (a classic client
//! holds its last SyncGroup answer; a consumer client what it applied plus what it was told and
//! may take at any moment), and a client the coordinator removed holds nothing.
//!
//! After the operations everyone still in the group keeps heartbeating: the group must become
//! Stable with every client holding exactly its target and every partition held by one client.
//!
//! `PROPTEST_CASES` runs more cases (the default here is 512).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use kaas_groups::assignor::{self, MemberSpec, RackAwareWeights, TopicSpec};
use kaas_groups::classic::{ClassicGroup, JoinArgs, MemberRef, StoredGroup, StoredMember};
use kaas_groups::consumer::{
    ConsumerGroup, HeartbeatArgs, HeartbeatEnv, Topics, LEAVE_GROUP_MEMBER_EPOCH,
};
use kaas_groups::consumer_protocol as cp;
use kaas_groups::GroupError;
use proptest::prelude::*;
use uuid::Uuid;

const P: i32 = 6;
const CLIENTS: usize = 5;
const CLASSIC_SESSION_MS: i32 = 10_000;
const REBALANCE_MS: i32 = 30_000;
const TOPIC: u128 = 7;
const CONVERGENCE_ROUNDS: usize = 20;
/// The broker's session timeout bounds (Kafka's defaults).
const SESSION_BOUNDS: (i32, i32) = (6_000, 1_800_000);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Eager,
    Cooperative,
    Consumer,
}

#[derive(Debug, Clone)]
enum Op {
    Join { client: usize },
    Beat { client: usize, apply: bool },
    Leave { client: usize },
    Advance { ms: u64 },
}

#[derive(Debug, Clone)]
struct Client {
    id: String,
    kind: Kind,
    in_group: bool,
    epoch: i32,
    owned: BTreeSet<i32>,
    /// A consumer client's last assignment, not applied yet.
    told: Option<BTreeSet<i32>>,
}

impl Client {
    fn entitled(&self) -> BTreeSet<i32> {
        let mut e = self.owned.clone();
        e.extend(self.told.iter().flatten().copied());
        e
    }
    fn drop_everything(&mut self) {
        self.in_group = false;
        self.owned.clear();
        self.told = None;
        self.epoch = 0;
    }
}

fn subscription(owned: &BTreeSet<i32>) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(1);
    b.put_i32(1);
    b.put_i16(1);
    b.put_slice(b"t");
    b.put_i32(-1);
    b.put_i32(1);
    b.put_i16(1);
    b.put_slice(b"t");
    b.put_i32(owned.len() as i32);
    for p in owned {
        b.put_i32(*p);
    }
    b.freeze()
}

fn run_assignor(
    name: &str,
    members: &[MemberSpec],
    topics: &BTreeMap<String, TopicSpec>,
) -> Option<assignor::GroupAssignment> {
    assignor::by_name(name, RackAwareWeights::default()).map(|a| a.assign(members, topics))
}

fn name(id: Uuid) -> Option<String> {
    (id == Uuid::from_u128(TOPIC)).then(|| "t".to_string())
}

struct World {
    group: ConsumerGroup,
    clients: Vec<Client>,
    table: Arc<dyn Topics>,
    now: Instant,
    downgraded: bool,
}

impl World {
    /// A stable classic group at generation 3 of the first `classic` clients (round robin),
    /// upgraded; the other clients are outside.
    fn new(kinds: [Kind; CLIENTS], classic: usize) -> World {
        let now = Instant::now();
        let mut clients: Vec<Client> = kinds
            .iter()
            .enumerate()
            .map(|(i, k)| Client {
                id: format!("m{i}"),
                kind: *k,
                in_group: false,
                epoch: 0,
                owned: BTreeSet::new(),
                told: None,
            })
            .collect();
        let mut members = Vec::new();
        for (i, c) in clients.iter_mut().take(classic).enumerate() {
            c.kind = if c.kind == Kind::Consumer {
                Kind::Cooperative
            } else {
                c.kind
            };
            c.owned = (0..P).filter(|p| *p as usize % classic == i).collect();
            c.in_group = true;
            c.epoch = 3;
            members.push(StoredMember {
                member_id: c.id.clone(),
                instance_id: None,
                client_id: "c".into(),
                client_host: "/127.0.0.1".into(),
                session_timeout_ms: CLASSIC_SESSION_MS,
                rebalance_timeout_ms: REBALANCE_MS,
                protocol_type: "consumer".into(),
                protocols: vec![("p".into(), subscription(&c.owned))],
                assignment: cp::encode_assignment(1, [("t", c.owned.iter().copied().collect())]),
            });
        }
        let leader = members.first().map(|m| m.member_id.clone());
        let stored = StoredGroup {
            generation: 3,
            protocol_type: Some("consumer".into()),
            protocol_name: Some("p".into()),
            leader,
            members,
        };
        let table: Arc<dyn Topics> = Arc::new(BTreeMap::from([(
            "t".to_string(),
            (Uuid::from_u128(TOPIC), P),
        )]));
        let classic_group = ClassicGroup::restore("g", 0, stored, now);
        let group = ConsumerGroup::from_classic(&classic_group, &*table, now).unwrap();
        World {
            group,
            clients,
            table,
            now,
            downgraded: false,
        }
    }

    fn classic_args(&self, c: usize, owned: &BTreeSet<i32>) -> JoinArgs {
        JoinArgs {
            member_id: self.clients[c].id.clone(),
            instance_id: None,
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout_ms: CLASSIC_SESSION_MS,
            rebalance_timeout_ms: REBALANCE_MS,
            protocol_type: "consumer".into(),
            protocols: vec![("p".into(), subscription(owned))],
            require_known_member_id: false,
            supports_skip_assignment: true,
        }
    }

    /// A classic client (re)joins and syncs, as its protocol says.
    fn classic_rejoin(&mut self, c: usize) {
        let table = self.table.clone();
        let env = env(self.now, &table);
        if self.clients[c].kind == Kind::Eager {
            self.clients[c].owned.clear();
        }
        let owned = self.clients[c].owned.clone();
        let j = match self.group.classic_join(
            self.classic_args(c, &owned),
            &env,
            SESSION_BOUNDS.0,
            SESSION_BOUNDS.1,
        ) {
            Ok(j) => j,
            Err(e) => panic!("{}: join refused: {e}", self.clients[c].id),
        };
        assert_eq!(j.error, None);
        let r = MemberRef {
            member_id: &self.clients[c].id.clone(),
            instance_id: None,
            generation: j.generation,
        };
        let bytes = self
            .group
            .classic_sync(&r, Some("consumer"), Some("p"), &name, self.now)
            .unwrap_or_else(|e| panic!("sync right after join refused: {e}"));
        let got: BTreeSet<i32> = cp::decode_assignment(&bytes)
            .unwrap()
            .remove("t")
            .unwrap_or_default()
            .into_iter()
            .collect();
        let cl = &mut self.clients[c];
        cl.in_group = true;
        cl.epoch = j.generation;
        cl.owned = got;
    }

    fn consumer_beat(&mut self, c: usize, joining: bool) {
        let table = self.table.clone();
        let env = env(self.now, &table);
        let cl = &self.clients[c];
        let args = HeartbeatArgs {
            member_id: cl.id.clone(),
            member_epoch: if joining { 0 } else { cl.epoch },
            rebalance_timeout_ms: if joining { REBALANCE_MS } else { -1 },
            subscribed_topic_names: joining.then(|| vec!["t".to_string()]),
            owned: Some(vec![(
                Uuid::from_u128(TOPIC),
                cl.owned.iter().copied().collect(),
            )]),
            ..Default::default()
        };
        match self.group.heartbeat(args, &env) {
            Ok(r) => {
                let cl = &mut self.clients[c];
                cl.in_group = true;
                cl.epoch = r.member_epoch;
                if let Some(a) = r.assignment {
                    cl.told = Some(a.iter().flat_map(|(_, ps)| ps.iter().copied()).collect());
                }
            }
            Err(GroupError::UnknownMemberId(_) | GroupError::FencedMemberEpoch(_)) => {
                self.clients[c].drop_everything();
            }
            Err(e) => panic!("heartbeat refused: {e}"),
        }
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::Join { client } if !self.clients[client].in_group => {
                match self.clients[client].kind {
                    Kind::Consumer => self.consumer_beat(client, true),
                    _ => self.classic_rejoin(client),
                }
            }
            Op::Beat { client, apply } if self.clients[client].in_group => {
                self.beat(client, apply);
            }
            Op::Leave { client } if self.clients[client].in_group => {
                let id = self.clients[client].id.clone();
                if self.clients[client].kind == Kind::Consumer {
                    let table = self.table.clone();
                    let leave = HeartbeatArgs {
                        member_id: id,
                        member_epoch: LEAVE_GROUP_MEMBER_EPOCH,
                        ..Default::default()
                    };
                    self.group.heartbeat(leave, &env(self.now, &table)).unwrap();
                } else {
                    self.group.classic_leave(&id, None).unwrap();
                }
                self.clients[client].drop_everything();
            }
            Op::Advance { ms } => {
                self.now += Duration::from_millis(ms);
                for gone in self.group.tick(self.now) {
                    let c = self.clients.iter_mut().find(|c| c.id == gone).unwrap();
                    c.drop_everything();
                }
            }
            _ => {}
        }
    }

    fn beat(&mut self, client: usize, apply: bool) {
        if self.clients[client].kind == Kind::Consumer {
            if apply {
                if let Some(t) = self.clients[client].told.take() {
                    self.clients[client].owned = t;
                }
            }
            self.consumer_beat(client, false);
            return;
        }
        let r = MemberRef {
            member_id: &self.clients[client].id.clone(),
            instance_id: None,
            generation: self.clients[client].epoch,
        };
        match self.group.classic_heartbeat(&r, self.now) {
            Ok(()) => {}
            Err(GroupError::RebalanceInProgress) => self.classic_rejoin(client),
            Err(GroupError::UnknownMemberId(_)) => self.clients[client].drop_everything(),
            Err(e) => panic!("classic heartbeat refused: {e}"),
        }
    }

    fn check(&self) {
        let mut holder: BTreeMap<i32, &str> = BTreeMap::new();
        for c in &self.clients {
            if !c.in_group {
                assert!(
                    c.entitled().is_empty(),
                    "{} is out and holds {:?}",
                    c.id,
                    c.owned
                );
                continue;
            }
            for p in c.entitled() {
                if let Some(other) = holder.insert(p, &c.id) {
                    panic!("t-{p} held by {other} and {} at once", c.id);
                }
            }
        }
    }

    /// The last consumer-protocol member left: the generation handed to the classic side.
    fn check_downgrade(&mut self) {
        let epoch = self.group.group_epoch;
        let stored = self.group.downgrade(&name);
        assert_eq!(stored.generation, epoch);
        let mut seen = BTreeSet::new();
        for m in &stored.members {
            let c = self.clients.iter().find(|c| c.id == m.member_id).unwrap();
            assert!(
                c.in_group && c.kind != Kind::Consumer,
                "{} handed over",
                c.id
            );
            for p in cp::decode_assignment(&m.assignment)
                .unwrap()
                .remove("t")
                .unwrap_or_default()
            {
                assert!(seen.insert(p), "t-{p} handed to two classic members");
            }
        }
        let in_group = self.clients.iter().filter(|c| c.in_group).count();
        assert_eq!(stored.members.len(), in_group, "every member handed over");
        let g = ClassicGroup::downgraded("g", 0, stored, self.now);
        assert_eq!(g.generation, epoch);
        self.downgraded = true;
    }
}

fn env<'a>(now: Instant, table: &'a Arc<dyn Topics>) -> HeartbeatEnv<'a> {
    HeartbeatEnv {
        now,
        topics: table,
        new_member_id: &|| Uuid::from_u128(99),
        session_timeout_ms: 45_000,
        default_assignor: "uniform",
        assign: &run_assignor,
        leader_rack: &|_, _| None,
    }
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Eager),
        Just(Kind::Cooperative),
        Just(Kind::Consumer)
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let client = 0..CLIENTS;
    prop_oneof![
        2 => client.clone().prop_map(|client| Op::Join { client }),
        6 => (client.clone(), any::<bool>()).prop_map(|(client, apply)| Op::Beat { client, apply }),
        1 => client.prop_map(|client| Op::Leave { client }),
        1 => prop_oneof![Just(1_000u64), Just(11_000), Just(31_000)].prop_map(|ms| Op::Advance { ms }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(512),
        ..ProptestConfig::default()
    })]

    #[test]
    fn mixed_protocol_groups_never_give_a_partition_to_two_clients(
        kinds in proptest::array::uniform5(kind()),
        classic in 1usize..=3,
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        let mut w = World::new(kinds, classic);
        // The upgrade is asked for by a consumer-protocol client joining.
        let joiner = classic; // the first client outside the classic group
        w.clients[joiner].kind = Kind::Consumer;
        w.step(&Op::Join { client: joiner });
        w.check();
        for op in &ops {
            w.step(op);
            w.check();
            if w.group.downgrade_due() {
                w.check_downgrade();
                return Ok(());
            }
        }
        // Everyone in the group keeps heartbeating, applying what it is told.
        for _ in 0..CONVERGENCE_ROUNDS {
            for c in 0..CLIENTS {
                if w.clients[c].in_group {
                    w.beat(c, true);
                    w.check();
                }
            }
        }
        if w.downgraded || w.group.members.is_empty() {
            return Ok(());
        }
        for c in w.clients.iter_mut() {
            if let Some(t) = c.told.take() {
                c.owned = t;
            }
        }
        prop_assert_eq!(w.group.state_name(), "Stable");
        let mut all = BTreeSet::new();
        for c in w.clients.iter().filter(|c| c.in_group) {
            let target: BTreeSet<i32> = w.group.target.get(&c.id)
                .and_then(|t| t.get(&Uuid::from_u128(TOPIC)))
                .cloned()
                .unwrap_or_default();
            prop_assert_eq!(&c.owned, &target, "{} holds its target", c.id);
            all.extend(c.owned.iter().copied());
        }
        prop_assert_eq!(all, (0..P).collect::<BTreeSet<i32>>());
    }
}
