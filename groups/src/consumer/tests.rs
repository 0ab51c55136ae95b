//! Unit tests of `consumer.rs`, kept beside it so the state machine reads on its own.

use super::*;

fn table(topics: &[(&str, i32)]) -> Arc<dyn Topics> {
    let t: BTreeMap<String, (Uuid, i32)> = topics
        .iter()
        .enumerate()
        .map(|(i, (name, parts))| (name.to_string(), (Uuid::from_u128(i as u128 + 1), *parts)))
        .collect();
    Arc::new(t)
}

/// A round-robin stand-in for the server assignors (the real ones are tested in their
/// own module): sticky enough for these tests, balanced, deterministic.
pub(super) fn round_robin(
    _name: &str,
    members: &[MemberSpec],
    topics: &BTreeMap<String, TopicSpec>,
) -> Option<GroupAssignment> {
    let mut out: GroupAssignment = members
        .iter()
        .map(|m| (m.member_id.clone(), BTreeMap::new()))
        .collect();
    let mut i = 0usize;
    for (name, t) in topics {
        let subs: Vec<&MemberSpec> = members
            .iter()
            .filter(|m| m.subscribed_topics.contains(name))
            .collect();
        if subs.is_empty() {
            continue;
        }
        for p in 0..t.partitions {
            let m = subs[i % subs.len()];
            i += 1;
            out.get_mut(&m.member_id)
                .unwrap()
                .entry(name.clone())
                .or_default()
                .insert(p);
        }
    }
    Some(out)
}

pub(super) fn env<'a>(now: Instant, topics: &'a Arc<dyn Topics>) -> HeartbeatEnv<'a> {
    HeartbeatEnv {
        now,
        topics,
        new_member_id: &|| Uuid::from_u128(99),
        session_timeout_ms: 45_000,
        default_assignor: "uniform",
        assign: &round_robin,
        leader_rack: &|_, _| None,
    }
}

fn join(id: &str, topics: &[&str]) -> HeartbeatArgs {
    HeartbeatArgs {
        member_id: id.into(),
        member_epoch: 0,
        rebalance_timeout_ms: 30_000,
        subscribed_topic_names: Some(topics.iter().map(|s| s.to_string()).collect()),
        owned: Some(vec![]),
        ..Default::default()
    }
}

fn hb(id: &str, epoch: i32, owned: &[(Uuid, Vec<i32>)]) -> HeartbeatArgs {
    HeartbeatArgs {
        member_id: id.into(),
        member_epoch: epoch,
        rebalance_timeout_ms: -1,
        owned: Some(owned.to_vec()),
        ..Default::default()
    }
}

fn owned_of(r: &HeartbeatResult) -> Vec<(Uuid, Vec<i32>)> {
    r.assignment.clone().unwrap_or_default()
}

fn count(a: &[(Uuid, Vec<i32>)]) -> usize {
    a.iter().map(|(_, p)| p.len()).sum()
}

// One member gets everything at once; a second member joining makes the first revoke half
// before the second gets them: no partition is ever owned twice.
#[test]
fn revoke_before_assign() {
    let t = table(&[("orders", 4)]);
    let now = Instant::now();
    let mut g = ConsumerGroup::new("g");
    let a1 = g.heartbeat(join("a", &["orders"]), &env(now, &t)).unwrap();
    assert_eq!(a1.member_epoch, 1);
    assert_eq!(count(&owned_of(&a1)), 4);
    assert_eq!(g.state_name(), "Stable");

    let b1 = g.heartbeat(join("b", &["orders"]), &env(now, &t)).unwrap();
    assert_eq!(b1.member_epoch, 2);
    assert_eq!(count(&owned_of(&b1)), 0, "a still owns them");
    assert_eq!(g.state_name(), "Reconciling");

    // a hears about the new target: it must revoke two, keeping epoch 1.
    let a2 = g
        .heartbeat(hb("a", 1, &owned_of(&a1)), &env(now, &t))
        .unwrap();
    assert_eq!(a2.member_epoch, 1);
    assert_eq!(count(&owned_of(&a2)), 2);
    // b still gets nothing while a reports the revoked ones as owned.
    let b2 = g.heartbeat(hb("b", 2, &[]), &env(now, &t)).unwrap();
    assert_eq!(b2.assignment, None);
    // a confirms; it moves to epoch 2.
    let a3 = g
        .heartbeat(hb("a", 1, &owned_of(&a2)), &env(now, &t))
        .unwrap();
    assert_eq!(a3.member_epoch, 2);
    // Now b gets the released partitions.
    let b3 = g.heartbeat(hb("b", 2, &[]), &env(now, &t)).unwrap();
    assert_eq!(count(&owned_of(&b3)), 2);
    let mut all: Vec<i32> = owned_of(&a2)
        .into_iter()
        .chain(owned_of(&b3))
        .flat_map(|(_, p)| p)
        .collect();
    all.sort();
    assert_eq!(all, vec![0, 1, 2, 3]);
    assert_eq!(g.state_name(), "Stable");

    // A commit sent at a's previous epoch (crossing the answer that moved it to epoch 2)
    // is accepted for the partitions a has owned since epoch 1, not for revoked ones.
    let topic = Uuid::from_u128(1);
    let kept: Vec<(Option<Uuid>, i32)> = owned_of(&a2)
        .into_iter()
        .flat_map(|(t, ps)| ps.into_iter().map(move |p| (Some(t), p)))
        .collect();
    let revoked: Vec<(Option<Uuid>, i32)> = (0..4)
        .filter(|p| !kept.contains(&(Some(topic), *p)))
        .map(|p| (Some(topic), p))
        .collect();
    assert!(g.validate_commit("a", 1, 9, &kept).is_ok());
    assert!(matches!(
        g.validate_commit("a", 1, 9, &revoked),
        Err(GroupError::StaleMemberEpoch(_))
    ));
    assert!(g.validate_commit("a", 1, 9, &[(None, 0)]).is_err());
    assert!(
        g.validate_commit("b", 1, 9, &revoked).is_err(),
        "b got them at epoch 2"
    );
    assert!(g.validate_commit("b", 2, 9, &revoked).is_ok());
}

// A leaving member's partitions go to the others on their next heartbeat; a session that
// expires does the same.
#[test]
fn leave_and_expiry() {
    let t = table(&[("orders", 4)]);
    let now = Instant::now();
    let mut g = ConsumerGroup::new("g");
    g.heartbeat(join("a", &["orders"]), &env(now, &t)).unwrap();
    g.heartbeat(join("b", &["orders"]), &env(now, &t)).unwrap();
    // Converge.
    for _ in 0..4 {
        for id in ["a", "b"] {
            let m = &g.members[id];
            let owned: Vec<(Uuid, Vec<i32>)> = m
                .assigned
                .iter()
                .map(|(t, p)| (*t, p.iter().copied().collect()))
                .collect();
            g.heartbeat(hb(id, m.member_epoch, &owned), &env(now, &t))
                .unwrap();
        }
    }
    assert_eq!(g.state_name(), "Stable");
    let epoch = g.group_epoch;
    let left = g
        .heartbeat(
            HeartbeatArgs {
                member_id: "b".into(),
                member_epoch: LEAVE_GROUP_MEMBER_EPOCH,
                ..Default::default()
            },
            &env(now, &t),
        )
        .unwrap();
    assert_eq!(left.member_epoch, -1);
    assert_eq!(g.group_epoch, epoch + 1);
    let m = &g.members["a"];
    let owned: Vec<(Uuid, Vec<i32>)> = m
        .assigned
        .iter()
        .map(|(t, p)| (*t, p.iter().copied().collect()))
        .collect();
    let a = g
        .heartbeat(hb("a", m.member_epoch, &owned), &env(now, &t))
        .unwrap();
    assert_eq!(count(&owned_of(&a)), 4);

    g.heartbeat(join("c", &["orders"]), &env(now, &t)).unwrap();
    assert_eq!(g.tick(now + Duration::from_secs(46)), vec!["a", "c"]);
    assert!(g.members.is_empty());
    assert_eq!(g.state_name(), "Empty");
}

// Epoch checks: ahead is fenced, behind is fenced unless it is the previous epoch with a
// subset of the assignment; unknown members are refused.
#[test]
fn epoch_fencing() {
    let t = table(&[("orders", 2)]);
    let now = Instant::now();
    let mut g = ConsumerGroup::new("g");
    let a = g.heartbeat(join("a", &["orders"]), &env(now, &t)).unwrap();
    assert!(matches!(
        g.heartbeat(hb("a", 5, &[]), &env(now, &t)),
        Err(GroupError::FencedMemberEpoch(_))
    ));
    assert!(matches!(
        g.heartbeat(hb("zz", 1, &[]), &env(now, &t)),
        Err(GroupError::UnknownMemberId(_))
    ));
    // Lost answer: the member still at epoch 0 owning nothing is accepted.
    assert!(g.heartbeat(hb("a", 0, &[]), &env(now, &t)).is_ok());
    assert!(g
        .heartbeat(hb("a", a.member_epoch, &owned_of(&a)), &env(now, &t))
        .is_ok());
    assert!(g.validate_commit("a", a.member_epoch, 9, &[]).is_ok());
    assert!(matches!(
        g.validate_commit("a", a.member_epoch - 1, 9, &[]),
        Err(GroupError::StaleMemberEpoch(_))
    ));
    assert!(
        g.validate_commit("", -1, 9, &[]).is_err(),
        "group not empty"
    );
}

// Regex subscriptions resolve against the topic table and follow topic creation.
#[test]
fn regex_subscription() {
    let t1 = table(&[("orders-eu", 2), ("orders-us", 2), ("payments", 2)]);
    let now = Instant::now();
    let mut g = ConsumerGroup::new("g");
    let mut args = join("a", &[]);
    args.subscribed_topic_names = None;
    args.subscribed_topic_regex = Some("orders-.*".into());
    let a = g.heartbeat(args, &env(now, &t1)).unwrap();
    assert_eq!(count(&owned_of(&a)), 4);
    let t2 = table(&[
        ("orders-eu", 2),
        ("orders-us", 2),
        ("payments", 2),
        ("orders-ap", 3),
    ]);
    let a2 = g
        .heartbeat(hb("a", a.member_epoch, &owned_of(&a)), &env(now, &t2))
        .unwrap();
    assert_eq!(count(&owned_of(&a2)), 7);
    assert!(a2.member_epoch > a.member_epoch);
}

// Request validation follows Kafka's rules.
#[test]
fn validation() {
    let ok = |a: &HeartbeatArgs, v| validate(a, v, |n| n == "uniform");
    assert!(ok(&join("a", &["t"]), 1).is_ok());
    assert!(ok(&join("", &["t"]), 1).is_err());
    assert!(ok(&join("", &["t"]), 0).is_ok());
    let mut bad = join("a", &["t"]);
    bad.subscribed_topic_names = None;
    assert!(ok(&bad, 1).is_err());
    bad = join("a", &["t"]);
    bad.server_assignor = Some("nope".into());
    assert!(matches!(
        ok(&bad, 1),
        Err(GroupError::UnsupportedAssignor(_))
    ));
    bad = join("a", &["t"]);
    bad.subscribed_topic_regex = Some("(".into());
    assert!(matches!(
        ok(&bad, 1),
        Err(GroupError::InvalidRegularExpression(_))
    ));
    bad = hb("a", -3, &[]);
    assert!(ok(&bad, 1).is_err());
}

// A static member that leaves temporarily keeps its partitions, and its next instance
// inherits them; a second live instance with the same id is refused.
#[test]
fn static_membership() {
    let t = table(&[("orders", 2)]);
    let now = Instant::now();
    let mut g = ConsumerGroup::new("g");
    let mut a = join("a1", &["orders"]);
    a.instance_id = Some("i".into());
    let r = g.heartbeat(a.clone(), &env(now, &t)).unwrap();
    assert_eq!(count(&owned_of(&r)), 2);
    let mut dup = a.clone();
    dup.member_id = "a2".into();
    assert!(matches!(
        g.heartbeat(dup.clone(), &env(now, &t)),
        Err(GroupError::UnreleasedInstanceId(_))
    ));
    let mut leave = hb("a1", LEAVE_GROUP_STATIC_MEMBER_EPOCH, &[]);
    leave.instance_id = Some("i".into());
    g.heartbeat(leave, &env(now, &t)).unwrap();
    let r2 = g.heartbeat(dup, &env(now, &t)).unwrap();
    assert_eq!(count(&owned_of(&r2)), 2);
    assert!(!g.members.contains_key("a1"));
}
