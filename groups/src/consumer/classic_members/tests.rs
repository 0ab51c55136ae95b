//! Unit tests of classic members in a KIP-848 group and of the online upgrade and downgrade.
//! The safety property checked throughout is the clients' own view: no partition is ever held
//! by two members at once, whatever protocol each speaks.

use std::collections::BTreeMap;

use super::*;
use crate::classic::ClassicState;
use crate::consumer::tests::env;

const T: u128 = 1;
/// The broker's session timeout bounds (Kafka's defaults).
const SESSION_BOUNDS: (i32, i32) = (6_000, 1_800_000);

fn topics() -> Arc<dyn Topics> {
    let t: BTreeMap<String, (Uuid, i32)> =
        BTreeMap::from([("t".to_string(), (Uuid::from_u128(T), 4))]);
    Arc::new(t)
}

fn name(id: Uuid) -> Option<String> {
    (id == Uuid::from_u128(T)).then(|| "t".to_string())
}

/// A v1 Subscription to `t` that reports `owned` partitions of it.
fn subscription(owned: &[i32]) -> Bytes {
    cp::encode_subscription(1, &["t"], &[("t", owned)], None)
}

/// A dynamic classic member at `generation`, as SyncGroup and Heartbeat name it.
fn dynamic(member_id: &str, generation: i32) -> MemberRef<'_> {
    MemberRef {
        member_id,
        instance_id: None,
        generation,
    }
}

fn classic_args(member_id: &str, owned: &[i32]) -> JoinArgs {
    JoinArgs {
        member_id: member_id.into(),
        instance_id: None,
        client_id: "c".into(),
        client_host: "/127.0.0.1".into(),
        session_timeout_ms: 10_000,
        rebalance_timeout_ms: 30_000,
        protocol_type: "consumer".into(),
        protocols: vec![("cooperative-sticky".into(), subscription(owned))],
        require_known_member_id: true,
        supports_skip_assignment: true,
    }
}

/// A stable classic group at generation 3: `a` holds t-0 and t-1, `b` t-2 and t-3.
fn stable_classic(now: Instant) -> ClassicGroup {
    let member = |id: &str, ps: Vec<i32>| StoredMember {
        member_id: id.into(),
        instance_id: None,
        client_id: "c".into(),
        client_host: "/127.0.0.1".into(),
        session_timeout_ms: 10_000,
        rebalance_timeout_ms: 30_000,
        protocol_type: "consumer".into(),
        protocols: vec![("cooperative-sticky".into(), subscription(&ps))],
        assignment: cp::encode_assignment(1, [("t", ps)]),
    };
    ClassicGroup::restore(
        "g",
        0,
        StoredGroup {
            generation: 3,
            protocol_type: Some("consumer".into()),
            protocol_name: Some("cooperative-sticky".into()),
            leader: Some("a".into()),
            members: vec![member("a", vec![0, 1]), member("b", vec![2, 3])],
        },
        now,
    )
}

/// What each client believes it owns, as a cooperative client keeps it.
#[derive(Default)]
struct Clients {
    owned: BTreeMap<String, BTreeSet<i32>>,
    epoch: BTreeMap<String, i32>,
}

impl Clients {
    fn assert_disjoint(&self) {
        let mut seen = BTreeMap::new();
        for (m, ps) in &self.owned {
            for p in ps {
                if let Some(other) = seen.insert(*p, m.clone()) {
                    panic!("t-{p} held by {other} and {m} at once");
                }
            }
        }
    }
    fn all(&self) -> BTreeSet<i32> {
        self.owned.values().flatten().copied().collect()
    }
}

fn ids(a: &[(Uuid, Vec<i32>)]) -> BTreeSet<i32> {
    a.iter().flat_map(|(_, ps)| ps.iter().copied()).collect()
}

/// One round of every client doing what its protocol says, checking the clients' view after
/// each answer.
fn round(g: &mut ConsumerGroup, c: &mut Clients, classic: &[&str], modern: &[&str], now: Instant) {
    let tp = topics();
    let e = env(now, &tp);
    for m in classic {
        let gen = c.epoch[*m];
        let r = dynamic(m, gen);
        match g.classic_heartbeat(&r, now) {
            Ok(()) => continue,
            Err(GroupError::RebalanceInProgress) => {}
            Err(err) => panic!("{m}: {err}"),
        }
        let owned: Vec<i32> = c.owned[*m].iter().copied().collect();
        let j = g
            .classic_join(
                classic_args(m, &owned),
                &e,
                SESSION_BOUNDS.0,
                SESSION_BOUNDS.1,
            )
            .unwrap();
        assert_eq!(
            j.leader, "",
            "a classic member of a consumer group is a follower"
        );
        assert!(j.members.is_empty());
        let r = dynamic(m, j.generation);
        let bytes = g
            .classic_sync(&r, Some("consumer"), Some("cooperative-sticky"), &name, now)
            .unwrap();
        assert_eq!(cp::version(&bytes), 1, "answered in the member's version");
        let got: BTreeSet<i32> = cp::decode_assignment(&bytes)
            .unwrap()
            .remove("t")
            .unwrap_or_default()
            .into_iter()
            .collect();
        // A cooperative client gives up what it lost, and takes what it got.
        c.owned.insert(m.to_string(), got);
        c.epoch.insert(m.to_string(), j.generation);
        c.assert_disjoint();
    }
    for m in modern {
        let owned: Vec<(Uuid, Vec<i32>)> =
            vec![(Uuid::from_u128(T), c.owned[*m].iter().copied().collect())];
        let r = g.heartbeat(hb(m, c.epoch[*m], owned), &e).unwrap();
        if let Some(a) = &r.assignment {
            c.owned.insert(m.to_string(), ids(a));
        }
        c.epoch.insert(m.to_string(), r.member_epoch);
        c.assert_disjoint();
    }
}

fn hb(id: &str, epoch: i32, owned: Vec<(Uuid, Vec<i32>)>) -> HeartbeatArgs {
    HeartbeatArgs {
        member_id: id.into(),
        member_epoch: epoch,
        rebalance_timeout_ms: if epoch == 0 { 30_000 } else { -1 },
        subscribed_topic_names: (epoch == 0).then(|| vec!["t".to_string()]),
        owned: Some(owned),
        ..Default::default()
    }
}

/// Upgraded: the classic members keep their partitions at the classic generation.
fn upgraded(now: Instant) -> (ConsumerGroup, Clients) {
    let classic = stable_classic(now);
    let g = ConsumerGroup::from_classic(&classic, &*topics(), now).unwrap();
    assert_eq!((g.group_epoch, g.assignment_epoch), (3, 3));
    let mut c = Clients::default();
    for (m, ps) in [("a", [0, 1]), ("b", [2, 3])] {
        assert_eq!(
            g.members[m].assigned[&Uuid::from_u128(T)],
            BTreeSet::from(ps)
        );
        assert_eq!(g.members[m].member_epoch, 3);
        c.owned.insert(m.into(), BTreeSet::from(ps));
        c.epoch.insert(m.into(), 3);
    }
    (g, c)
}

#[test]
fn a_rolling_upgrade_moves_partitions_without_two_owners() {
    let now = Instant::now();
    let (mut g, mut c) = upgraded(now);
    // The first consumer-protocol member joins: a new epoch, and it waits for what the classic
    // members still hold.
    let tp = topics();
    let r = g.heartbeat(hb("x", 0, vec![]), &env(now, &tp)).unwrap();
    assert_eq!(g.group_epoch, 4);
    c.owned
        .insert("x".into(), ids(&r.assignment.unwrap_or_default()));
    c.epoch.insert("x".into(), r.member_epoch);
    c.assert_disjoint();
    for _ in 0..4 {
        round(&mut g, &mut c, &["a", "b"], &["x"], now);
    }
    assert_eq!(g.state_name(), "Stable");
    assert_eq!(
        c.all(),
        BTreeSet::from([0, 1, 2, 3]),
        "every partition has an owner"
    );
    assert!(!c.owned["x"].is_empty(), "the new member got its share");
    for m in ["a", "b", "x"] {
        assert_eq!(g.members[m].member_epoch, 4, "{m} caught up");
    }
    // Stable now: classic heartbeats are answered without a rebalance.
    for m in ["a", "b"] {
        let r = dynamic(m, 4);
        assert_eq!(g.classic_heartbeat(&r, now), Ok(()));
    }
}

#[test]
fn a_classic_member_is_told_to_rejoin_and_fenced_on_a_stale_generation() {
    let now = Instant::now();
    let (mut g, _) = upgraded(now);
    let tp = topics();
    g.heartbeat(hb("x", 0, vec![]), &env(now, &tp)).unwrap();
    let at = |generation| dynamic("a", generation);
    assert_eq!(
        g.classic_heartbeat(&at(3), now),
        Err(GroupError::RebalanceInProgress)
    );
    assert!(matches!(
        g.classic_heartbeat(&at(2), now),
        Err(GroupError::IllegalGeneration(_))
    ));
    // A member using the consumer protocol is not a classic member.
    let x = dynamic("x", 4);
    assert!(matches!(
        g.classic_heartbeat(&x, now),
        Err(GroupError::UnknownMemberId(_))
    ));
    // Commits: the generation must be the member epoch; no OffsetCommit v9 needed.
    assert_eq!(g.validate_commit("a", 3, 2, &[]), Ok(()));
    assert!(matches!(
        g.validate_commit("a", 4, 8, &[]),
        Err(GroupError::IllegalGeneration(_))
    ));
}

#[test]
fn a_classic_member_that_does_not_sync_or_rejoin_is_removed_at_its_rebalance_timeout() {
    let now = Instant::now();
    let (mut g, _) = upgraded(now);
    let tp = topics();
    g.heartbeat(hb("x", 0, vec![]), &env(now, &tp)).unwrap();
    // `a` is told to rejoin and never does; `b` rejoins and never syncs.
    let a = dynamic("a", 3);
    assert_eq!(
        g.classic_heartbeat(&a, now),
        Err(GroupError::RebalanceInProgress)
    );
    g.classic_join(
        classic_args("b", &[2, 3]),
        &env(now, &tp),
        SESSION_BOUNDS.0,
        SESSION_BOUNDS.1,
    )
    .unwrap();
    // Both keep heartbeating (sessions alive); the deadlines are the rebalance timeout.
    let later = now + Duration::from_millis(9_000);
    assert!(g.tick(later).is_empty());
    let x_alive = hb("x", g.members["x"].member_epoch, vec![]);
    g.heartbeat(x_alive, &env(later, &tp)).unwrap();
    let gone = g.tick(now + Duration::from_millis(30_000));
    assert_eq!(gone, vec!["a".to_string(), "b".to_string()]);
    assert!(!g.downgrade_due(), "no classic member left to downgrade to");
}

#[test]
fn the_last_consumer_member_leaving_downgrades_the_group() {
    let now = Instant::now();
    let (mut g, mut c) = upgraded(now);
    let tp = topics();
    let r = g.heartbeat(hb("x", 0, vec![]), &env(now, &tp)).unwrap();
    c.owned
        .insert("x".into(), ids(&r.assignment.unwrap_or_default()));
    c.epoch.insert("x".into(), r.member_epoch);
    for _ in 0..4 {
        round(&mut g, &mut c, &["a", "b"], &["x"], now);
    }
    assert!(!g.downgrade_due());
    let leave = HeartbeatArgs {
        member_id: "x".into(),
        member_epoch: LEAVE_GROUP_MEMBER_EPOCH,
        ..Default::default()
    };
    g.heartbeat(leave, &env(now, &tp)).unwrap();
    assert!(g.downgrade_due());
    let epoch = g.group_epoch;
    let stored = g.downgrade(&name);
    assert_eq!(stored.generation, epoch);
    let ids: Vec<&str> = stored
        .members
        .iter()
        .map(|m| m.member_id.as_str())
        .collect();
    assert_eq!(ids, ["a", "b"]);
    // Each keeps its target (what it was being given), in its own metadata's version.
    for m in &stored.members {
        let want: Vec<i32> = g.target[&m.member_id][&Uuid::from_u128(T)]
            .iter()
            .copied()
            .collect();
        let got = cp::decode_assignment(&m.assignment).unwrap();
        assert_eq!(got.get("t").cloned().unwrap_or_default(), want);
    }
    let classic = ClassicGroup::downgraded("g", 0, stored, now);
    assert_eq!(classic.generation, epoch);
    assert_eq!(
        classic.state,
        ClassicState::PreparingRebalance,
        "members rejoin for a leader"
    );
    assert_eq!(classic.protocol_type.as_deref(), Some("consumer"));
    assert_eq!(classic.members.len(), 2);
}

#[test]
fn an_upgrade_refuses_a_group_of_another_protocol_type_or_malformed_metadata() {
    let now = Instant::now();
    let mut classic = stable_classic(now);
    classic.protocol_type = Some("connect".into());
    assert!(matches!(
        ConsumerGroup::from_classic(&classic, &*topics(), now),
        Err(GroupError::GroupIdNotFound(_))
    ));
    let mut classic = stable_classic(now);
    classic.members.get_mut("a").unwrap().protocols[0].1 = Bytes::from_static(&[0, 1, 0x7f]);
    assert!(matches!(
        ConsumerGroup::from_classic(&classic, &*topics(), now),
        Err(GroupError::GroupIdNotFound(_))
    ));
}

#[test]
fn a_classic_join_with_foreign_protocols_is_inconsistent() {
    let now = Instant::now();
    let (mut g, _) = upgraded(now);
    let tp = topics();
    let mut args = classic_args("", &[]);
    args.protocols = vec![("range".into(), subscription(&[]))];
    assert!(matches!(
        g.classic_join(args, &env(now, &tp), SESSION_BOUNDS.0, SESSION_BOUNDS.1),
        Err(GroupError::InconsistentGroupProtocol(_))
    ));
    let mut args = classic_args("", &[]);
    args.protocol_type = "connect".into();
    assert!(matches!(
        g.classic_join(args, &env(now, &tp), SESSION_BOUNDS.0, SESSION_BOUNDS.1),
        Err(GroupError::InconsistentGroupProtocol(_))
    ));
    // A dynamic member without an id is given one first (KIP-394), as in a classic group.
    let j = g
        .classic_join(
            classic_args("", &[]),
            &env(now, &tp),
            SESSION_BOUNDS.0,
            SESSION_BOUNDS.1,
        )
        .unwrap();
    assert_eq!(j.error, Some(GroupError::MemberIdRequired));
    assert!(!g.members.contains_key(&j.member_id));
}

#[test]
fn a_static_classic_member_is_replaced_by_its_consumer_protocol_instance_at_once() {
    let now = Instant::now();
    let mut classic = stable_classic(now);
    // Make `a` static: a restart of it under the consumer protocol brings the same instance.
    classic.members.get_mut("a").unwrap().instance_id = Some("i-a".into());
    let mut g = ConsumerGroup::from_classic(&classic, &*topics(), now).unwrap();
    assert_eq!(g.static_members.get("i-a").map(String::as_str), Some("a"));
    let tp = topics();
    let mut join = hb("x", 0, vec![]);
    join.instance_id = Some("i-a".into());
    let r = g.heartbeat(join, &env(now, &tp)).unwrap();
    assert!(
        !g.members.contains_key("a"),
        "the classic instance was replaced"
    );
    let x = &g.members["x"];
    assert!(x.classic.is_none(), "it speaks the consumer protocol now");
    // It starts from a's partitions (what it keeps of them depends on the new target).
    let got = ids(&r.assignment.unwrap_or_default());
    assert!(
        !got.is_empty() && got.is_subset(&BTreeSet::from([0, 1])),
        "{got:?}"
    );
}
