//! Unit tests of `classic.rs`, kept beside it so the state machine reads on its own.

use super::*;

const MIN: i32 = 6000;
const MAX: i32 = 300_000;

/// New member ids, distinct and deterministic (the caller's part; the shard draws v4 UUIDs).
fn fresh_id() -> Uuid {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    Uuid::from_u128(
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .into(),
    )
}

fn args(member_id: &str, protocols: &[&str]) -> JoinArgs {
    JoinArgs {
        member_id: member_id.into(),
        instance_id: None,
        client_id: "c".into(),
        client_host: "/h".into(),
        session_timeout_ms: 10_000,
        rebalance_timeout_ms: 30_000,
        protocol_type: "consumer".into(),
        protocols: protocols
            .iter()
            .map(|p| (p.to_string(), Bytes::from_static(b"meta")))
            .collect(),
        require_known_member_id: true,
        supports_skip_assignment: true,
    }
}

fn now_result(r: Reply<JoinResult>) -> JoinResult {
    match r {
        Reply::Now(r) => r,
        Reply::Later(_) => panic!("expected an immediate answer"),
    }
}

fn later<T>(r: Reply<T>) -> oneshot::Receiver<T> {
    match r {
        Reply::Later(rx) => rx,
        Reply::Now(_) => panic!("expected to wait"),
    }
}

fn ready<T>(rx: &mut oneshot::Receiver<T>) -> Option<T> {
    rx.try_recv().expect("sender alive or answered")
}

/// Joins a new dynamic member through KIP-394 and returns its id and pending answer.
fn join_new(
    g: &mut ClassicGroup,
    now: Instant,
    protocols: &[&str],
) -> (String, oneshot::Receiver<JoinResult>) {
    let first = now_result(g.join(args("", protocols), now, MIN, MAX, &fresh_id));
    assert_eq!(first.error, Some(GroupError::MemberIdRequired));
    let id = first.member_id.clone();
    let rx = later(g.join(args(&id, protocols), now, MIN, MAX, &fresh_id));
    (id, rx)
}

// KIP-394, the initial delay, leader election, and sync distribute the leader's assignment.
#[test]
fn first_generation() {
    let t0 = Instant::now();
    let mut g = ClassicGroup::new("g", 100);
    let (a, mut ra) = join_new(&mut g, t0, &["range"]);
    let (b, mut rb) = join_new(&mut g, t0 + Duration::from_millis(50), &["range"]);
    assert_eq!(g.state, ClassicState::PreparingRebalance);
    g.tick(t0 + Duration::from_millis(100));
    assert!(ready(&mut ra).is_none(), "the delay was extended by b");
    g.tick(t0 + Duration::from_millis(151));
    let ja = ready(&mut ra).unwrap();
    let jb = ready(&mut rb).unwrap();
    assert_eq!(ja.generation, 1);
    assert_eq!(ja.leader, a);
    assert_eq!(ja.members.len(), 2);
    assert!(jb.members.is_empty());
    assert_eq!(ja.protocol_name.as_deref(), Some("range"));
    assert_eq!(g.state, ClassicState::CompletingRebalance);

    let t1 = t0 + Duration::from_millis(200);
    let mut sb = later(g.sync(
        MemberRef {
            member_id: &b,
            instance_id: None,
            generation: 1,
        },
        None,
        None,
        vec![],
        t1,
    ));
    assert!(ready(&mut sb).is_none());
    let mut sa = later(g.sync(
        MemberRef {
            member_id: &a,
            instance_id: None,
            generation: 1,
        },
        Some("consumer"),
        Some("range"),
        vec![
            (a.clone(), Bytes::from_static(b"A")),
            (b.clone(), Bytes::from_static(b"B")),
        ],
        t1,
    ));
    assert_eq!(ready(&mut sa).unwrap().assignment, Bytes::from_static(b"A"));
    assert_eq!(ready(&mut sb).unwrap().assignment, Bytes::from_static(b"B"));
    assert_eq!(g.state, ClassicState::Stable);
    assert!(g
        .heartbeat(
            MemberRef {
                member_id: &a,
                instance_id: None,
                generation: 1
            },
            t1
        )
        .is_ok());
    assert!(matches!(
        g.heartbeat(
            MemberRef {
                member_id: &a,
                instance_id: None,
                generation: 0
            },
            t1
        ),
        Err(GroupError::IllegalGeneration(_))
    ));
    assert!(matches!(
        g.heartbeat(
            MemberRef {
                member_id: "nobody",
                instance_id: None,
                generation: 1
            },
            t1
        ),
        Err(GroupError::UnknownMemberId(_))
    ));
}

fn stable_pair(t0: Instant) -> (ClassicGroup, String, String) {
    let mut g = ClassicGroup::new("g", 0);
    let (a, mut ra) = join_new(&mut g, t0, &["range"]);
    assert!(ready(&mut ra).is_some(), "no delay: a completes alone");
    // b joins a group that already has a generation: everyone rejoins.
    let (b, mut rb) = join_new(&mut g, t0, &["range"]);
    assert_eq!(g.state, ClassicState::PreparingRebalance);
    let mut ra = later(g.join(args(&a, &["range"]), t0, MIN, MAX, &fresh_id));
    let ja = ready(&mut ra).unwrap();
    let _ = ready(&mut rb).unwrap();
    assert_eq!(ja.generation, 2);
    let _ = g.sync(
        MemberRef {
            member_id: &a,
            instance_id: None,
            generation: 2,
        },
        None,
        None,
        vec![],
        t0,
    );
    let _ = g.sync(
        MemberRef {
            member_id: &b,
            instance_id: None,
            generation: 2,
        },
        None,
        None,
        vec![],
        t0,
    );
    assert_eq!(g.state, ClassicState::Stable);
    (g, a, b)
}

// A leaving member triggers a rebalance that completes as soon as the rest rejoin.
#[test]
fn leave_rebalances() {
    let t0 = Instant::now();
    let (mut g, a, b) = stable_pair(t0);
    assert_eq!(g.leave(&a, None, t0).unwrap(), a);
    assert_eq!(g.state, ClassicState::PreparingRebalance);
    assert_eq!(
        g.heartbeat(
            MemberRef {
                member_id: &b,
                instance_id: None,
                generation: 2
            },
            t0
        ),
        Err(GroupError::RebalanceInProgress)
    );
    let mut rb = later(g.join(args(&b, &["range"]), t0, MIN, MAX, &fresh_id));
    let jb = ready(&mut rb).unwrap();
    assert_eq!(jb.generation, 3);
    assert_eq!(jb.leader, b);
    assert_eq!(jb.members.len(), 1);
    assert!(matches!(
        g.leave("zzz", None, t0),
        Err(GroupError::UnknownMemberId(_))
    ));
}

// A member that stops heartbeating is removed after its session timeout; the last one
// leaving empties the group, and an empty group accepts simple commits only.
#[test]
fn session_expiry() {
    let t0 = Instant::now();
    let (mut g, a, b) = stable_pair(t0);
    let t1 = t0 + Duration::from_millis(9_000);
    g.heartbeat(
        MemberRef {
            member_id: &b,
            instance_id: None,
            generation: 2,
        },
        t1,
    )
    .unwrap();
    let why = Removal::SessionExpired {
        session_timeout_ms: 10_000,
    };
    assert_eq!(
        g.tick(t0 + Duration::from_millis(10_000)),
        vec![(a.clone(), why)]
    );
    assert!(!g.members.contains_key(&a));
    assert_eq!(g.state, ClassicState::PreparingRebalance);
    // b rejoins; then b stops too.
    let mut rb = later(g.join(args(&b, &["range"]), t1, MIN, MAX, &fresh_id));
    assert_eq!(ready(&mut rb).unwrap().generation, 3);
    assert!(g
        .validate_commit(MemberRef {
            member_id: "",
            instance_id: None,
            generation: -1
        })
        .is_err());
    g.tick(t1 + Duration::from_secs(60));
    assert_eq!(g.state, ClassicState::Empty);
    assert!(g
        .validate_commit(MemberRef {
            member_id: "",
            instance_id: None,
            generation: -1
        })
        .is_ok());
}

// Protocols: a member with no protocol in common is refused; the majority choice wins.
#[test]
fn protocol_selection() {
    let t0 = Instant::now();
    let mut g = ClassicGroup::new("g", 0);
    let (_, mut r1) = join_new(&mut g, t0, &["cooperative-sticky", "range"]);
    ready(&mut r1).unwrap();
    let refused = now_result(g.join(args("", &["roundrobin"]), t0, MIN, MAX, &fresh_id));
    assert!(matches!(
        refused.error,
        Some(GroupError::InconsistentGroupProtocol(_))
    ));
    let short = JoinArgs {
        session_timeout_ms: 10,
        ..args("", &["range"])
    };
    assert!(matches!(
        now_result(g.join(short, t0, MIN, MAX, &fresh_id)).error,
        Some(GroupError::InvalidSessionTimeout { .. })
    ));
    g.members.values_mut().for_each(|m| {
        m.join_waiter = None;
    });
    let (_, _r2) = join_new(&mut g, t0, &["range", "cooperative-sticky"]);
    let (_, _r3) = join_new(&mut g, t0, &["range"]);
    g.tick(t0 + Duration::from_secs(31));
    assert_eq!(g.protocol_name.as_deref(), Some("range"));
}

/// A stable group of one static member (instance `i-1`, the leader) that synced its
/// assignment: the group, the member's join arguments and its member id.
fn stable_static_group(t0: Instant) -> (ClassicGroup, JoinArgs, String) {
    let mut g = ClassicGroup::new("g", 0);
    let mut a = args("", &["range"]);
    a.instance_id = Some("i-1".into());
    let mut r = later(g.join(a.clone(), t0, MIN, MAX, &fresh_id));
    let id = ready(&mut r).unwrap().member_id;
    let _ = g.sync(
        MemberRef {
            member_id: &id,
            instance_id: Some("i-1"),
            generation: 1,
        },
        None,
        None,
        vec![(id.clone(), Bytes::from_static(b"X"))],
        t0,
    );
    assert_eq!(g.state, ClassicState::Stable);
    (g, a, id)
}

// A static leader that rejoins unchanged below JoinGroup v9 is not named leader: the answer
// names its previous id and lists no members (Kafka's staticMemberRejoinWithLeaderIdAndUnknown
// MemberId). kaas named it leader with the member list, so its client ran the assignor again
// for a stable group that would not hand the result to anyone.
#[test]
fn static_leader_rejoin_below_v9_is_answered_as_a_follower() {
    let t0 = Instant::now();
    let (mut g, mut a, old) = stable_static_group(t0);
    a.supports_skip_assignment = false;
    let j = now_result(g.join(a.clone(), t0, MIN, MAX, &fresh_id));
    assert_eq!(j.error, None);
    assert_eq!(j.generation, 1, "no rebalance");
    assert_eq!(j.leader, old, "the leader's id from before the rejoin");
    assert_ne!(j.member_id, j.leader);
    assert!(j.members.is_empty());
    assert!(!j.skip_assignment);
    // The group's leader is the new id all the same, and its sync gets the assignment.
    assert_eq!(g.leader.as_deref(), Some(j.member_id.as_str()));
    // A v9 rejoin of the leader is named leader, gets the members and skips assigning.
    a.supports_skip_assignment = true;
    let j9 = now_result(g.join(a, t0, MIN, MAX, &fresh_id));
    assert_eq!(j9.leader, j9.member_id);
    assert_eq!(j9.members.len(), 1);
    assert!(j9.skip_assignment);
}

// Static membership: a restarted instance takes over without a rebalance; the old id is
// fenced.
#[test]
fn static_member_rejoin() {
    let t0 = Instant::now();
    let (mut g, a, old) = stable_static_group(t0);
    let before = g.settled_key();
    let j2 = now_result(g.join(a, t0, MIN, MAX, &fresh_id));
    assert_eq!(j2.error, None);
    assert_ne!(j2.member_id, old);
    assert_eq!(j2.generation, 1, "no rebalance");
    assert!(j2.skip_assignment);
    // The replacement is a new settled state (same generation and count): it is stored
    // again, and a coordinator that loads it knows the new id, not the fenced one.
    assert_ne!(g.settled_key(), before);
    let loaded = ClassicGroup::restore("g", 0, g.stored().unwrap(), t0);
    assert!(loaded.members.contains_key(&j2.member_id));
    assert!(!loaded.members.contains_key(&old));
    assert!(matches!(
        g.heartbeat(
            MemberRef {
                member_id: &old,
                instance_id: Some("i-1"),
                generation: 1
            },
            t0
        ),
        Err(GroupError::FencedInstanceId(_))
    ));
    let s = match g.sync(
        MemberRef {
            member_id: &j2.member_id,
            instance_id: Some("i-1"),
            generation: 1,
        },
        None,
        None,
        vec![],
        t0,
    ) {
        Reply::Now(s) => s,
        Reply::Later(_) => panic!("stable group answers at once"),
    };
    assert_eq!(s.assignment, Bytes::from_static(b"X"));
}

// The consumer protocol's subscription header parses; garbage does not panic.
#[test]
fn subscription_parse() {
    let mut b = vec![0u8, 1, 0, 0, 0, 2];
    for t in ["ab", "c"] {
        b.extend_from_slice(&(t.len() as i16).to_be_bytes());
        b.extend_from_slice(t.as_bytes());
    }
    b.extend_from_slice(&[0xff, 0xff, 0xff, 0xff]);
    assert_eq!(parse_subscription_topics(&b).unwrap(), vec!["ab", "c"]);
    for cut in 0..b.len() {
        let _ = parse_subscription_topics(&b[..cut]);
    }
}

// A coordinator that gives its group up answers every JoinGroup and SyncGroup still waiting
// with NOT_COORDINATOR, so the members rejoin at the new coordinator at once; unanswered, they
// waited out their rebalance timeout with the group consuming nothing.
#[test]
fn unload_answers_parked_requests() {
    let t0 = Instant::now();
    let moved = GroupError::NotCoordinator("moved".into());

    // A JoinGroup waiting for a member that has not rejoined yet.
    let mut g = ClassicGroup::new("g", 0);
    let (_a, mut ra) = join_new(&mut g, t0, &["range"]);
    assert!(ready(&mut ra).is_some());
    let (b, mut rb) = join_new(&mut g, t0, &["range"]);
    assert!(ready(&mut rb).is_none(), "b waits for a to rejoin");
    g.unload(&moved);
    let jb = ready(&mut rb).expect("answered on unload");
    assert_eq!((jb.error, jb.member_id), (Some(moved.clone()), b));
    assert_eq!(g.state, ClassicState::Dead);

    // A follower's SyncGroup waiting for the leader's assignment.
    let mut g = ClassicGroup::new("g", 0);
    let (a, mut ra) = join_new(&mut g, t0, &["range"]);
    assert!(ready(&mut ra).is_some());
    let (b, mut rb) = join_new(&mut g, t0, &["range"]);
    let mut ra = later(g.join(args(&a, &["range"]), t0, MIN, MAX, &fresh_id));
    let (ja, jb) = (ready(&mut ra).unwrap(), ready(&mut rb).unwrap());
    let follower = if ja.leader == a { &b } else { &a };
    let mut rs = later(g.sync(
        MemberRef {
            member_id: follower,
            instance_id: None,
            generation: jb.generation,
        },
        None,
        None,
        vec![],
        t0,
    ));
    assert!(
        ready(&mut rs).is_none(),
        "the follower waits for the leader"
    );
    g.unload(&moved);
    assert_eq!(
        ready(&mut rs).expect("answered on unload").error,
        Some(moved)
    );
}

// A stored Stable generation comes back Stable: the same members heartbeat and commit with
// the generation they hold, no rebalance; a member that never comes back is expired after its
// session timeout counted from the load, and the group rebalances without it.
#[test]
fn stored_generation_restores_stable() {
    let t0 = Instant::now();
    let (g, a, b) = stable_pair(t0);
    let key = g.settled_key().expect("stable is settled");
    let stored = g.stored().expect("stable is stored");
    assert_eq!(stored.members.len(), 2);
    assert_eq!(stored.members[0].member_id, a, "kept in order of arrival");

    let t1 = t0 + Duration::from_secs(3600);
    let mut r = ClassicGroup::restore("g", 0, stored.clone(), t1);
    assert_eq!(r.state, ClassicState::Stable);
    assert_eq!(r.settled_key(), Some(key));
    assert_eq!(r.stored(), Some(stored));
    fn of(m: &str) -> MemberRef<'_> {
        MemberRef {
            member_id: m,
            instance_id: None,
            generation: 2,
        }
    }
    r.heartbeat(of(&a), t1).unwrap();
    r.validate_commit(of(&b)).unwrap();
    // b's SyncGroup again (a retried answer) returns its stored assignment.
    match r.sync(of(&b), None, None, vec![], t1) {
        Reply::Now(s) => assert_eq!(s.error, None),
        Reply::Later(_) => panic!("a stable group answers at once"),
    }
    // Only a keeps heartbeating: b is expired 10 s after the load, not after t0.
    r.tick(t1 + Duration::from_millis(9_000));
    assert!(r.members.contains_key(&b));
    r.heartbeat(of(&a), t1 + Duration::from_millis(9_000))
        .unwrap();
    r.tick(t1 + Duration::from_millis(10_000));
    assert!(!r.members.contains_key(&b));
    assert_eq!(r.state, ClassicState::PreparingRebalance);
    assert_eq!(
        r.settled_key(),
        None,
        "nothing settled to store mid-rebalance"
    );
}

// An emptied group stores its generation; a stored group that does not hold together comes
// back Empty (its members rejoin) instead of answering from a broken state.
#[test]
fn stored_empty_and_broken_groups_restore_empty() {
    let t0 = Instant::now();
    let (mut g, a, b) = stable_pair(t0);
    g.leave(&a, None, t0).unwrap();
    g.leave(&b, None, t0).unwrap();
    assert_eq!(g.state, ClassicState::Empty);
    let empty = g.stored().unwrap();
    assert!(empty.members.is_empty());
    let r = ClassicGroup::restore("g", 0, empty.clone(), t0);
    assert_eq!(r.state, ClassicState::Empty);
    assert_eq!(r.generation, g.generation);

    let (g, _, _) = stable_pair(t0);
    let mut broken = g.stored().unwrap();
    broken.leader = Some("nobody".into());
    let r = ClassicGroup::restore("g", 0, broken, t0);
    assert_eq!(r.state, ClassicState::Empty);
    assert!(r.members.is_empty());
    let mut broken = g.stored().unwrap();
    broken.protocol_name = Some("sticky".into());
    assert_eq!(
        ClassicGroup::restore("g", 0, broken, t0).state,
        ClassicState::Empty
    );
}

/// Generation 2 formed at `t0` with `a` the leader and `b` a follower, neither synced yet;
/// every member's session and rebalance timeouts are `session_ms` and `rebalance_ms`.
fn completing_pair(
    t0: Instant,
    session_ms: i32,
    rebalance_ms: i32,
) -> (ClassicGroup, String, String) {
    let with = |id: &str| JoinArgs {
        session_timeout_ms: session_ms,
        rebalance_timeout_ms: rebalance_ms,
        ..args(id, &["range"])
    };
    let mut g = ClassicGroup::new("g", 0);
    let a = now_result(g.join(with(""), t0, MIN, MAX, &fresh_id)).member_id;
    let _ = ready(&mut later(g.join(with(&a), t0, MIN, MAX, &fresh_id))).unwrap();
    let b = now_result(g.join(with(""), t0, MIN, MAX, &fresh_id)).member_id;
    let mut rb = later(g.join(with(&b), t0, MIN, MAX, &fresh_id));
    let ja = ready(&mut later(g.join(with(&a), t0, MIN, MAX, &fresh_id))).unwrap();
    assert_eq!((ja.generation, ja.leader.as_str()), (2, a.as_str()));
    let _ = ready(&mut rb).unwrap();
    assert_eq!(g.state, ClassicState::CompletingRebalance);
    (g, a, b)
}

fn member(id: &str, generation: i32) -> MemberRef<'_> {
    MemberRef {
        member_id: id,
        instance_id: None,
        generation,
    }
}

// A follower that waited on a slow leader for most of its session gets a whole session from
// the answer on (Kafka restarts the session of every member it answers a parked SyncGroup):
// a client that does not heartbeat while its SyncGroup is parked (sarama, librdkafka) would
// otherwise be expired right after it got its assignment.
#[test]
fn a_follower_answered_by_a_slow_leader_starts_a_new_session() {
    let t0 = Instant::now();
    let (mut g, a, b) = completing_pair(t0, 10_000, 30_000);
    let mut sb = later(g.sync(member(&b, 2), None, None, vec![], t0));
    let t1 = t0 + Duration::from_millis(9_500);
    let assignment = vec![
        (a.clone(), Bytes::from_static(b"A")),
        (b.clone(), Bytes::from_static(b"B")),
    ];
    let _ = g.sync(member(&a, 2), None, None, assignment, t1);
    assert_eq!(ready(&mut sb).unwrap().assignment, Bytes::from_static(b"B"));
    assert!(g.tick(t1 + Duration::from_millis(1_000)).is_empty());
    assert_eq!(g.state, ClassicState::Stable);
    assert!(g
        .heartbeat(member(&b, 2), t1 + Duration::from_millis(2_000))
        .is_ok());
}

// The leader never syncs: at the rebalance timeout it is removed, and the follower parked on
// its SyncGroup is told to rejoin. It keeps its membership for a session from that answer, so
// it rejoins as itself (sarama's cooperative test scaling a group of 6 s timeouts lost its
// member id this way, and came back as a new member while the old one lingered).
#[test]
fn a_follower_whose_leader_never_syncs_rejoins_as_itself() {
    let t0 = Instant::now();
    let (mut g, a, b) = completing_pair(t0, 6_000, 6_000);
    let mut sb = later(g.sync(member(&b, 2), None, None, vec![], t0));
    let t1 = t0 + Duration::from_millis(6_000);
    let why = Removal::NotSynced {
        generation: 2,
        rebalance_timeout_ms: 6_000,
        leader: true,
    };
    assert_eq!(
        g.tick(t1),
        vec![(a.clone(), why)],
        "only the leader, which never synced"
    );
    assert!(!g.members.contains_key(&a));
    assert_eq!(
        ready(&mut sb).unwrap().error,
        Some(GroupError::RebalanceInProgress)
    );
    assert_eq!(g.state, ClassicState::PreparingRebalance);
    let t2 = t1 + Duration::from_millis(2_000);
    g.tick(t2);
    let jb = ready(&mut later(g.join(
        args(&b, &["range"]),
        t2,
        MIN,
        MAX,
        &fresh_id,
    )))
    .unwrap();
    assert_eq!((jb.generation, jb.leader.as_str()), (3, b.as_str()));
}

// A member that keeps heartbeating through a rebalance but never rejoins is dropped when the
// rebalance times out, and the tick says so (the reason an operator reads in the log).
#[test]
fn a_member_that_never_rejoins_is_reported() {
    let t0 = Instant::now();
    let (mut g, a, b) = stable_pair(t0);
    let mut rb = later(g.join(args(&b, &["range", "sticky"]), t0, MIN, MAX, &fresh_id));
    assert_eq!(g.state, ClassicState::PreparingRebalance);
    for s in [5, 10, 15, 20, 25] {
        let at = t0 + Duration::from_secs(s);
        assert_eq!(
            g.heartbeat(member(&a, 2), at),
            Err(GroupError::RebalanceInProgress)
        );
        assert!(g.tick(at).is_empty());
    }
    let why = Removal::NotRejoined {
        rebalance_timeout_ms: 30_000,
    };
    assert_eq!(g.tick(t0 + Duration::from_secs(30)), vec![(a.clone(), why)]);
    assert_eq!(ready(&mut rb).unwrap().generation, 3);
}
