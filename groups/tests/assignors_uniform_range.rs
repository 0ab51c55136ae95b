//! Tests of the KIP-848 server-side assignors `uniform` and `range` as pure functions, and of
//! finding an assignor by name: hand-written scenarios and property tests over random groups.
//! `rack-aware`, and the brute-force check of the planner it shares with `uniform`, are tested
//! in `assignors_rack_aware.rs`.
//!
//! Every check here recomputes what it needs (ownership, moves, balance) from the inputs rather
//! than trusting the assignor module's own helpers (see `common/mod.rs`).
//!
//! The property tests use a small seeded generator rather than proptest (they were written when
//! the assignors lived in a crate without it); each failure names its seed and prints its
//! input, and `ASSIGNOR_SEED` / `ASSIGNOR_CASES` rerun one case or run more.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::{
    assert_topic_balanced, assert_totals_within_one, assert_valid, check, count_in, measure,
    member, no_racks, parts, rack_aware, random_group, topic, topic_map, total_of, uniform,
    with_current, Subscriptions,
};
use kaas_groups::assignor::{
    by_name, MemberSpec, RackAwareWeights, RangeAssignor, ServerAssignor, UniformAssignor,
    ASSIGNOR_NAMES, DEFAULT_ASSIGNOR,
};

// ---------------------------------------------------------------------------------------------
// Lookup

// Proves the three assignors are found by their KIP-848 names and uniform is the default.
#[test]
fn by_name_finds_the_three_assignors() {
    let w = RackAwareWeights::default();
    for name in ASSIGNOR_NAMES {
        assert_eq!(by_name(name, w).unwrap().name(), name);
    }
    assert_eq!(ASSIGNOR_NAMES, ["uniform", "range", "rack-aware"]);
    assert_eq!(DEFAULT_ASSIGNOR, "uniform");
    assert!(by_name("sticky", w).is_none());
    assert!(by_name("Uniform", w).is_none());
}

// Proves an empty group, or one with no existing subscribed topics, gets empty assignments.
#[test]
fn empty_inputs_give_empty_assignments() {
    let topics = topic_map(vec![topic("t", 4, no_racks)]);
    for a in [uniform(), Box::new(RangeAssignor), rack_aware(10, 1)] {
        assert!(a.assign(&[], &topics).is_empty());
        let members = vec![member("m1", Some("a"), &["missing"])];
        let out = a.assign(&members, &topics);
        assert_eq!(out, BTreeMap::from([("m1".to_string(), BTreeMap::new())]));
    }
}

// ---------------------------------------------------------------------------------------------
// Range

// Proves range matches Kafka's documented example: contiguous ranges, first member gets extras.
#[test]
fn range_matches_kafkas_example() {
    let topics = topic_map(vec![topic("t0", 3, no_racks), topic("t1", 3, no_racks)]);
    let members = vec![
        member("c1", None, &["t0", "t1"]),
        member("c0", None, &["t0", "t1"]),
    ];
    let a = RangeAssignor.assign(&members, &topics);
    assert_eq!(a["c0"]["t0"], parts(&[0, 1]));
    assert_eq!(a["c0"]["t1"], parts(&[0, 1]));
    assert_eq!(a["c1"]["t0"], parts(&[2]));
    assert_eq!(a["c1"]["t1"], parts(&[2]));
}

// Proves range splits each topic only among that topic's subscribers, in member-id order.
#[test]
fn range_splits_each_topic_among_its_subscribers() {
    let topics = topic_map(vec![topic("x", 5, no_racks), topic("y", 2, no_racks)]);
    let members = vec![
        member("a", None, &["x"]),
        member("b", None, &["x", "y"]),
        member("c", None, &["y"]),
    ];
    let a = RangeAssignor.assign(&members, &topics);
    assert_eq!(a["a"]["x"], parts(&[0, 1, 2]));
    assert_eq!(a["b"]["x"], parts(&[3, 4]));
    assert_eq!(a["b"]["y"], parts(&[0]));
    assert_eq!(a["c"]["y"], parts(&[1]));
}

// Proves range is Kafka's range: contiguous in id order, extras first, co-partitioned.
#[test]
fn range_is_kafkas_range() {
    check(
        |rng| random_group(rng, 6, 3, 12, Subscriptions::Either),
        |g| {
            let a = RangeAssignor.assign(&g.members, &g.topics);
            assert_valid(&g.members, &g.topics, &a);
            assert_topic_balanced(&g.members, &g.topics, &a);
            for (t, spec) in &g.topics {
                let mut subs: Vec<&str> = g
                    .members
                    .iter()
                    .filter(|m| m.subscribed_topics.contains(t))
                    .map(|m| m.member_id.as_str())
                    .collect();
                subs.sort();
                let mut next = 0;
                for (i, id) in subs.iter().enumerate() {
                    let n = spec.partitions as usize / subs.len()
                        + usize::from(i < spec.partitions as usize % subs.len());
                    let expect: BTreeSet<i32> = (next..next + n as i32).collect();
                    assert_eq!(a[*id].get(t).cloned().unwrap_or_default(), expect);
                    next += n as i32;
                }
            }
            for (t, ts) in &g.topics {
                for (u, us) in &g.topics {
                    let same_subs = g.members.iter().all(|m| {
                        m.subscribed_topics.contains(t) == m.subscribed_topics.contains(u)
                    });
                    if t < u && ts.partitions == us.partitions && same_subs {
                        for owned in a.values() {
                            assert_eq!(owned.get(t), owned.get(u), "{t} and {u} co-partitioned");
                        }
                    }
                }
            }
        },
    );
}

// ---------------------------------------------------------------------------------------------
// Uniform

// Proves a fresh group gets every partition once with counts within one.
#[test]
fn uniform_spreads_a_fresh_group_evenly() {
    let topics = topic_map(vec![topic("t", 10, no_racks)]);
    let members = vec![
        member("m1", None, &["t"]),
        member("m2", None, &["t"]),
        member("m3", None, &["t"]),
    ];
    let a = UniformAssignor.assign(&members, &topics);
    assert_valid(&members, &topics, &a);
    let mut counts: Vec<usize> = members.iter().map(|m| total_of(&a, &m.member_id)).collect();
    counts.sort();
    assert_eq!(counts, vec![3, 3, 4]);
}

// Proves a member joining takes only its fair share, and only from members above theirs.
#[test]
fn uniform_join_moves_only_what_balance_needs() {
    let topics = topic_map(vec![topic("t", 10, no_racks)]);
    let two = vec![member("m1", None, &["t"]), member("m2", None, &["t"])];
    let before = UniformAssignor.assign(&two, &topics);
    let mut three = with_current(&two, &before);
    three.push(member("m3", None, &["t"]));
    let after = UniformAssignor.assign(&three, &topics);
    assert_valid(&three, &topics, &after);
    assert_totals_within_one(&three, &after);
    assert_eq!(measure(&three, &topics, &after).moved, 3);
    for id in ["m1", "m2"] {
        assert!(
            after[id]["t"].is_subset(&before[id]["t"]),
            "{id} only loses"
        );
    }
}

// Proves a member leaving hands out only its own partitions; the others keep all of theirs.
#[test]
fn uniform_leave_moves_only_the_leavers_partitions() {
    let topics = topic_map(vec![topic("t", 12, no_racks)]);
    let four: Vec<MemberSpec> = (1..=4)
        .map(|i| member(&format!("m{i}"), None, &["t"]))
        .collect();
    let before = UniformAssignor.assign(&four, &topics);
    let three = with_current(&four[..3], &before);
    let after = UniformAssignor.assign(&three, &topics);
    assert_valid(&three, &topics, &after);
    assert_totals_within_one(&three, &after);
    for m in &three {
        assert!(before[&m.member_id]["t"].is_subset(&after[&m.member_id]["t"]));
    }
}

// Proves the same group gives the same answer, whatever the order of its members.
#[test]
fn uniform_is_deterministic_and_order_independent() {
    let topics = topic_map(vec![topic("x", 7, no_racks), topic("y", 5, no_racks)]);
    let members: Vec<MemberSpec> = (0..4)
        .map(|i| member(&format!("m{i}"), None, &["x", "y"]))
        .collect();
    let a = UniformAssignor.assign(&members, &topics);
    let mut reversed = members.clone();
    reversed.reverse();
    assert_eq!(a, UniformAssignor.assign(&reversed, &topics));
    let again = with_current(&members, &a);
    assert_eq!(a, UniformAssignor.assign(&again, &topics));
    assert_topic_balanced(&members, &topics, &a);
    assert_totals_within_one(&members, &a);
}

// Proves differing subscriptions balance each topic over its own subscribers.
#[test]
fn uniform_balances_each_topic_among_its_subscribers() {
    let topics = topic_map(vec![topic("x", 4, no_racks), topic("y", 4, no_racks)]);
    let members = vec![member("a", None, &["x"]), member("b", None, &["x", "y"])];
    let a = UniformAssignor.assign(&members, &topics);
    assert_valid(&members, &topics, &a);
    assert_eq!(count_in(&a, "a", "x"), 2);
    assert_eq!(count_in(&a, "b", "x"), 2);
    assert_eq!(count_in(&a, "b", "y"), 4);
}

// Proves differing subscriptions hand topics' leftovers to the least-loaded members.
#[test]
fn uniform_hands_leftovers_to_the_least_loaded() {
    // x: 3 over {a, b} (one leftover); y: 1 over {b, c}; z: 1 over {a, c}.
    let topics = topic_map(vec![
        topic("x", 3, no_racks),
        topic("y", 1, no_racks),
        topic("z", 1, no_racks),
    ]);
    let members = vec![
        member("a", None, &["x", "z"]),
        member("b", None, &["x", "y"]),
        member("c", None, &["y", "z"]),
    ];
    let a = UniformAssignor.assign(&members, &topics);
    assert_valid(&members, &topics, &a);
    assert_topic_balanced(&members, &topics, &a);
    // Totals 2/2/1 are the best possible: c can only take y and z.
    let mut totals: Vec<usize> = ["a", "b", "c"].iter().map(|m| total_of(&a, m)).collect();
    totals.sort();
    assert_eq!(totals, vec![1, 2, 2]);
}

// Proves a join on one topic moves exactly the newcomer's floor(P / (M + 1)) partitions.
#[test]
fn join_moves_exactly_the_newcomers_floor_share() {
    check(
        |rng| (rng.range(0, 59) as i32, rng.range(1, 7)),
        |&(partitions, m)| {
            let topics = topic_map(vec![topic("t", partitions, no_racks)]);
            let members: Vec<MemberSpec> = (0..m)
                .map(|i| member(&format!("m{i}"), None, &["t"]))
                .collect();
            let before = UniformAssignor.assign(&members, &topics);
            let mut joined = with_current(&members, &before);
            joined.push(member("new", None, &["t"]));
            let after = UniformAssignor.assign(&joined, &topics);
            let share = partitions as usize / (m + 1);
            assert_eq!(total_of(&after, "new"), share);
            assert_eq!(measure(&joined, &topics, &after).moved, share);
        },
    );
}
