//! Tests of the KIP-848 server-side assignor `rack-aware` as a pure function, and of the
//! balanced planner it shares with `uniform`: hand-written scenarios, property tests over random
//! groups, a brute-force check that both find the cheapest balanced assignment on small groups,
//! and a timing test. `uniform`'s and `range`'s own scenarios are in `assignors_uniform_range.rs`.
//!
//! Every check here recomputes what it needs (ownership, cross-rack reads, moves, balance) from
//! the inputs rather than trusting the assignor module's own helpers (see `common/mod.rs`).
//!
//! The property tests use a small seeded generator rather than proptest (they were written when
//! the assignors lived in a crate without it); each failure names its seed and prints its
//! input, and `ASSIGNOR_SEED` / `ASSIGNOR_CASES` rerun one case or run more.
//!
//! The timing test is ignored by default; run it with
//! `cargo test --release -p kaas-groups --test assignors_rack_aware -- --ignored --nocapture`.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{
    assert_topic_balanced, assert_totals_within_one, assert_valid, check, count_in, measure,
    member, no_racks, parts, rack_aware, random_group, topic, topic_map, total_of, uniform,
    with_current, Group, Measure, Rng, Subscriptions, RACKS,
};
use kaas_groups::assignor::{
    assignment_stats, GroupAssignment, MemberSpec, RackAwareWeights, RangeAssignor, ServerAssignor,
    TopicSpec, UniformAssignor,
};

// ---------------------------------------------------------------------------------------------
// Reference measurements, computed from the inputs alone

fn weighted_cost(w: RackAwareWeights, m: Measure) -> u64 {
    u64::from(w.traffic) * m.cross_rack as u64 + u64::from(w.overlap) * m.moved as u64
}

fn sum_of_squares(members: &[MemberSpec], a: &GroupAssignment) -> usize {
    members
        .iter()
        .map(|m| total_of(a, &m.member_id).pow(2))
        .sum()
}

// ---------------------------------------------------------------------------------------------
// Brute force

/// Every assignment of the subscribed partitions to subscribers, filtered to the balanced ones:
/// each topic within one over its subscribers, and member totals as even as possible (minimal
/// sum of squares, which is "within one" when subscriptions are equal).
fn balanced_assignments(
    members: &[MemberSpec],
    topics: &BTreeMap<String, TopicSpec>,
) -> Vec<GroupAssignment> {
    let slots: Vec<(&str, i32, Vec<&str>)> = topics
        .iter()
        .flat_map(|(t, spec)| {
            let subs: Vec<&str> = members
                .iter()
                .filter(|m| m.subscribed_topics.contains(t))
                .map(|m| m.member_id.as_str())
                .collect();
            (0..spec.partitions).map(move |p| (t.as_str(), p, subs.clone()))
        })
        .filter(|(_, _, subs)| !subs.is_empty())
        .collect();
    let mut choice = vec![0usize; slots.len()];
    let mut per_topic_ok = Vec::new();
    loop {
        let mut a: GroupAssignment = members
            .iter()
            .map(|m| (m.member_id.clone(), BTreeMap::new()))
            .collect();
        for ((t, p, subs), &c) in slots.iter().zip(&choice) {
            a.get_mut(subs[c])
                .unwrap()
                .entry(t.to_string())
                .or_default()
                .insert(*p);
        }
        let balanced = topics.keys().all(|t| {
            let counts: Vec<usize> = members
                .iter()
                .filter(|m| m.subscribed_topics.contains(t))
                .map(|m| count_in(&a, &m.member_id, t))
                .collect();
            counts.is_empty() || counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1
        });
        if balanced {
            per_topic_ok.push(a);
        }
        // Odometer over the subscriber choices.
        let mut i = 0;
        loop {
            if i == slots.len() {
                let best = per_topic_ok
                    .iter()
                    .map(|a| sum_of_squares(members, a))
                    .min()
                    .unwrap();
                per_topic_ok.retain(|a| sum_of_squares(members, a) == best);
                return per_topic_ok;
            }
            choice[i] += 1;
            if choice[i] < slots[i].2.len() {
                break;
            }
            choice[i] = 0;
            i += 1;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Random groups for property tests

fn random_weights(rng: &mut Rng) -> RackAwareWeights {
    RackAwareWeights {
        traffic: rng.range(0, 29) as u32,
        overlap: rng.range(0, 5) as u32,
    }
}

// ---------------------------------------------------------------------------------------------
// Rack-aware

/// The topic: partitions alternate between racks a and b.
fn alternating(p: i32) -> Vec<&'static str> {
    vec![if p % 2 == 0 { "a" } else { "b" }]
}

// Proves the scenario: consumers in racks a and b get their own rack's partitions.
#[test]
fn rack_aware_gives_consumers_same_rack_partitions() {
    let topics = topic_map(vec![topic("orders", 6, alternating)]);
    let members = vec![
        member("consumer-a", Some("a"), &["orders"]),
        member("consumer-b", Some("b"), &["orders"]),
    ];
    let a = rack_aware(10, 1).assign(&members, &topics);
    assert_eq!(a["consumer-a"]["orders"], parts(&[0, 2, 4]));
    assert_eq!(a["consumer-b"]["orders"], parts(&[1, 3, 5]));
    // Uniform, ignoring racks, does worse on the same group.
    let u = UniformAssignor.assign(&members, &topics);
    assert!(measure(&members, &topics, &u).cross_rack > 0);
}

// Proves same-rack placement holds with several consumers per rack and uneven counts.
#[test]
fn rack_aware_same_rack_with_several_consumers_per_rack() {
    let members = vec![
        member("a1", Some("a"), &["orders"]),
        member("a2", Some("a"), &["orders"]),
        member("b1", Some("b"), &["orders"]),
        member("b2", Some("b"), &["orders"]),
        member("b3", Some("b"), &["orders"]),
    ];
    // 12 partitions (6 per rack) over 5 members is 3,3,2,2,2: the two rack-a members take 3
    // each and all three rack-b members 2 each, so nobody reads across racks.
    let topics = topic_map(vec![topic("orders", 12, alternating)]);
    let a = rack_aware(10, 1).assign(&members, &topics);
    assert_valid(&members, &topics, &a);
    assert_totals_within_one(&members, &a);
    assert_eq!(measure(&members, &topics, &a).cross_rack, 0);
    // 10 partitions (5 per rack) is 2 each: rack b's three members need 6 but rack b serves 5,
    // so exactly one read crosses racks.
    let topics = topic_map(vec![topic("orders", 10, alternating)]);
    let a = rack_aware(10, 1).assign(&members, &topics);
    assert_totals_within_one(&members, &a);
    assert_eq!(measure(&members, &topics, &a).cross_rack, 1);
}

// Proves balance wins over racks: a 4/2 split over one member per rack costs one cross read.
#[test]
fn rack_aware_respects_balance_before_racks() {
    let topics = topic_map(vec![topic("t", 6, |p| vec![if p < 4 { "a" } else { "b" }])]);
    let members = vec![
        member("ma", Some("a"), &["t"]),
        member("mb", Some("b"), &["t"]),
    ];
    let a = rack_aware(10, 1).assign(&members, &topics);
    assert_eq!(total_of(&a, "ma"), 3);
    assert_eq!(total_of(&a, "mb"), 3);
    assert_eq!(measure(&members, &topics, &a).cross_rack, 1);
}

// Proves the weights trade traffic against moves: dear moves keep, dear traffic swaps.
#[test]
fn rack_aware_weights_trade_traffic_against_moves() {
    let topics = topic_map(vec![topic("t", 2, alternating)]);
    let mut members = vec![
        member("ma", Some("a"), &["t"]),
        member("mb", Some("b"), &["t"]),
    ];
    members[0].current = BTreeMap::from([("t".to_string(), parts(&[1]))]);
    members[1].current = BTreeMap::from([("t".to_string(), parts(&[0]))]);
    let keep = rack_aware(1, 10).assign(&members, &topics);
    assert_eq!(
        keep["ma"]["t"],
        parts(&[1]),
        "two moves cost 20 > 2 of traffic"
    );
    let swap = rack_aware(10, 1).assign(&members, &topics);
    assert_eq!(
        swap["ma"]["t"],
        parts(&[0]),
        "two moves cost 2 < 20 of traffic"
    );
    assert_eq!(measure(&members, &topics, &swap).cross_rack, 0);
}

// Proves a member without a rack, and partitions without rack information, cost no traffic.
#[test]
fn rack_aware_unknown_racks_cost_nothing() {
    let topics = topic_map(vec![
        topic("known", 4, |_| vec!["a"]),
        topic("unknown", 4, no_racks),
    ]);
    let members = vec![
        member("anywhere", None, &["known", "unknown"]),
        member("in-a", Some("a"), &["known", "unknown"]),
        member("in-b", Some("b"), &["unknown"]),
    ];
    let a = rack_aware(10, 1).assign(&members, &topics);
    assert_valid(&members, &topics, &a);
    assert_topic_balanced(&members, &topics, &a);
    assert_eq!(measure(&members, &topics, &a).cross_rack, 0);
}

// Proves one rack or no racks means no cross-rack reads and exactly uniform's stickiness.
#[test]
fn rack_aware_degenerates_to_sticky_balanced() {
    type RacksOf = fn(i32) -> Vec<&'static str>;
    let cases: [(Option<&str>, RacksOf); 2] = [(Some("a"), |_| vec!["a"]), (None, no_racks)];
    for (rack, racks) in cases {
        let topics = topic_map(vec![topic("t", 9, racks), topic("u", 4, racks)]);
        let three: Vec<MemberSpec> = (1..=3)
            .map(|i| member(&format!("m{i}"), rack, &["t", "u"]))
            .collect();
        let before = rack_aware(10, 1).assign(&three, &topics);
        assert_eq!(measure(&three, &topics, &before).cross_rack, 0);
        let current = with_current(&three, &before);
        assert_eq!(
            before,
            rack_aware(10, 1).assign(&current, &topics),
            "unchanged"
        );
        let mut four = current.clone();
        four.push(member("m4", rack, &["t", "u"]));
        let after = rack_aware(10, 1).assign(&four, &topics);
        let uniform_after = UniformAssignor.assign(&four, &topics);
        assert_eq!(measure(&four, &topics, &after).cross_rack, 0);
        assert_eq!(
            measure(&four, &topics, &after).moved,
            measure(&four, &topics, &uniform_after).moved
        );
        assert_totals_within_one(&four, &after);
    }
}

// Proves u32::MAX weights (costs beyond i64 here) still give a valid, balanced, better result.
#[test]
fn rack_aware_handles_extreme_weights() {
    let topics = topic_map(vec![
        topic("x", 300, |p| vec![RACKS[p as usize % 3]]),
        topic("y", 180, |p| vec![RACKS[p as usize % 2]]),
        topic("z", 120, no_racks),
    ]);
    let members: Vec<MemberSpec> = (0..60)
        .map(|i| {
            let subs: &[&str] = match i % 4 {
                0 => &["x"],
                1 => &["x", "y"],
                2 => &["x", "y", "z"],
                _ => &["y", "z"],
            };
            member(&format!("m{i:02}"), Some(RACKS[i % 3]), subs)
        })
        .collect();
    let a = rack_aware(u32::MAX, u32::MAX).assign(&members, &topics);
    assert_valid(&members, &topics, &a);
    assert_topic_balanced(&members, &topics, &a);
    let u = UniformAssignor.assign(&members, &topics);
    assert_eq!(sum_of_squares(&members, &a), sum_of_squares(&members, &u));
    assert!(measure(&members, &topics, &a).cross_rack <= measure(&members, &topics, &u).cross_rack);
}

// Proves the exported stats agree with this file's independent measurement.
#[test]
fn assignment_stats_match_reference() {
    let topics = topic_map(vec![topic("t", 6, alternating)]);
    let mut members = vec![
        member("ma", Some("a"), &["t"]),
        member("mb", Some("b"), &["t"]),
    ];
    members[0].current = BTreeMap::from([("t".to_string(), parts(&[1, 3, 5]))]);
    let a = UniformAssignor.assign(&members, &topics);
    let stats = assignment_stats(&members, &topics, &a);
    let reference = measure(&members, &topics, &a);
    assert_eq!(stats.assigned, 6);
    assert_eq!(stats.cross_rack, reference.cross_rack);
    assert_eq!(stats.moved, reference.moved);
}

// Proves uniform and rack-aware are valid, balanced, order-independent and sticky.
#[test]
fn balanced_assignors_are_valid_balanced_deterministic_and_sticky() {
    check(
        |rng| {
            (
                random_group(rng, 7, 3, 14, Subscriptions::Either),
                random_weights(rng),
            )
        },
        |(g, w)| {
            let equal = g
                .members
                .iter()
                .all(|m| m.subscribed_topics == g.members[0].subscribed_topics);
            for assignor in [uniform(), rack_aware(w.traffic, w.overlap)] {
                let a = assignor.assign(&g.members, &g.topics);
                assert_valid(&g.members, &g.topics, &a);
                assert_topic_balanced(&g.members, &g.topics, &a);
                if equal {
                    assert_totals_within_one(&g.members, &a);
                }
                let mut reversed = g.members.clone();
                reversed.reverse();
                assert_eq!(
                    a,
                    assignor.assign(&reversed, &g.topics),
                    "order independent"
                );
                let again = with_current(&g.members, &a);
                assert_eq!(
                    a,
                    assignor.assign(&again, &g.topics),
                    "{} sticky",
                    assignor.name()
                );
            }
        },
    );
}

// Proves rack-aware never reads more across racks, nor costs more, than uniform.
#[test]
fn rack_aware_never_worse_than_uniform() {
    check(
        |rng| {
            (
                random_group(rng, 7, 3, 14, Subscriptions::Either),
                random_weights(rng),
            )
        },
        |(g, w)| {
            let u = UniformAssignor.assign(&g.members, &g.topics);
            let r = rack_aware(w.traffic, w.overlap).assign(&g.members, &g.topics);
            let (mu, mr) = (
                measure(&g.members, &g.topics, &u),
                measure(&g.members, &g.topics, &r),
            );
            if w.traffic > 0 {
                assert!(mr.cross_rack <= mu.cross_rack, "{mr:?} vs uniform {mu:?}");
            }
            assert!(weighted_cost(*w, mr) <= weighted_cost(*w, mu));
        },
    );
}

// Proves a join moves only what balance needs: the brute-force fewest moves, totals within one.
#[test]
fn join_moves_only_what_balance_needs() {
    // Equal subscriptions. Old members may still trade a partition among themselves when that
    // ties with handing it to the newcomer, so the check is against the brute-force minimum.
    check(
        |rng| {
            let rack = rng.range(0, 3);
            (
                random_group(rng, 3, 2, 3, Subscriptions::Equal),
                rack,
                random_weights(rng),
            )
        },
        |(g, rack, w)| {
            for assignor in [uniform(), rack_aware(w.traffic, w.overlap)] {
                let before = assignor.assign(&g.members, &g.topics);
                let mut joined = with_current(&g.members, &before);
                let topics: Vec<&str> = g.topics.keys().map(String::as_str).collect();
                let rack = rack.checked_sub(1).map(|r| RACKS[r]);
                joined.push(member("new", rack, &topics));
                let after = assignor.assign(&joined, &g.topics);
                assert_valid(&joined, &g.topics, &after);
                assert_totals_within_one(&joined, &after);
                if assignor.name() == "uniform" {
                    let fewest = balanced_assignments(&joined, &g.topics)
                        .iter()
                        .map(|a| measure(&joined, &g.topics, a).moved)
                        .min();
                    assert_eq!(Some(measure(&joined, &g.topics, &after).moved), fewest);
                }
            }
        },
    );
}

// Proves rack-aware (and uniform) optimal on small groups against brute-force enumeration.
#[test]
fn rack_aware_matches_brute_force() {
    // Equal and differing subscriptions: balance, then (weighted cost, moves), must equal the
    // best over every balanced assignment; for uniform, the move count must.
    check(
        |rng| {
            (
                random_group(rng, 3, 2, 3, Subscriptions::Either),
                random_weights(rng),
            )
        },
        |(g, w)| {
            let all = balanced_assignments(&g.members, &g.topics);
            let best_balance = sum_of_squares(&g.members, &all[0]);

            let r = rack_aware(w.traffic, w.overlap).assign(&g.members, &g.topics);
            assert_topic_balanced(&g.members, &g.topics, &r);
            assert_eq!(sum_of_squares(&g.members, &r), best_balance);
            let key = |a: &GroupAssignment| {
                let m = measure(&g.members, &g.topics, a);
                (weighted_cost(*w, m), m.moved)
            };
            let best = all.iter().map(key).min().unwrap();
            assert_eq!(key(&r), best, "rack-aware (cost, moves) vs brute force");

            let u = UniformAssignor.assign(&g.members, &g.topics);
            assert_eq!(sum_of_squares(&g.members, &u), best_balance);
            let fewest_moves = all
                .iter()
                .map(|a| measure(&g.members, &g.topics, a).moved)
                .min();
            let uniform_moves = measure(&g.members, &g.topics, &u).moved;
            assert_eq!(
                Some(uniform_moves),
                fewest_moves,
                "uniform moves vs brute force"
            );
        },
    );
}

// ---------------------------------------------------------------------------------------------
// Performance

/// A group of `members` consumers in racks a/b/c reading `topics` topics of `partitions`
/// partitions each, served round-robin from the three racks. With `mixed` subscriptions,
/// member `i` skips every topic `t` with `(i + t) % 3 == 0`.
fn big_group(members: usize, topics: usize, partitions: i32, mixed: bool) -> Group {
    let topic_specs = topic_map(
        (0..topics)
            .map(|t| {
                topic(&format!("t{t}"), partitions, |p| {
                    vec![RACKS[p as usize % 3]]
                })
            })
            .collect(),
    );
    let names: Vec<String> = topic_specs.keys().cloned().collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    Group {
        members: (0..members)
            .map(|i| {
                let subs: Vec<&str> = (0..names.len())
                    .filter(|t| !mixed || (i + t) % 3 != 0)
                    .map(|t| names[t])
                    .collect();
                member(&format!("member-{i:04}"), Some(RACKS[i % 3]), &subs)
            })
            .collect(),
        topics: topic_specs,
    }
}

/// The best of five runs: the machine is shared, and the minimum is the least disturbed.
fn timed(assignor: &dyn ServerAssignor, g: &Group) -> (GroupAssignment, Duration) {
    let mut best = Duration::MAX;
    let mut result = None;
    for _ in 0..5 {
        let start = Instant::now();
        let a = assignor.assign(&g.members, &g.topics);
        best = best.min(start.elapsed());
        result = Some(a);
    }
    (result.unwrap(), best)
}

// Proves (in release builds) 1,000 partitions × 100 members assign well under 100 ms.
#[test]
#[ignore = "timing; run in release"]
fn thousand_partitions_hundred_members_is_fast() {
    // Fresh, unchanged, after a join and after a leave, for several topic shapes. Run with
    // `cargo test --release -p kaas-groups --test assignors_rack_aware -- --ignored --nocapture`.
    let shapes = [
        (100, 1, 1000, false),
        (100, 10, 100, false),
        (100, 100, 10, false),
        (100, 10, 100, true),
        (100, 100, 10, true),
    ];
    let mut worst = Duration::ZERO;
    for (members, topics, partitions, mixed) in shapes {
        let g = big_group(members, topics, partitions, mixed);
        for assignor in [uniform(), rack_aware(10, 1), Box::new(RangeAssignor)] {
            let (fresh, t_fresh) = timed(assignor.as_ref(), &g);
            let steady = Group {
                members: with_current(&g.members, &fresh),
                topics: g.topics.clone(),
            };
            let (_, t_steady) = timed(assignor.as_ref(), &steady);
            let mut joined = steady.clone();
            let names: Vec<&str> = g.topics.keys().map(String::as_str).collect();
            joined.members.push(member("member-new", Some("a"), &names));
            let (_, t_join) = timed(assignor.as_ref(), &joined);
            let mut left = steady.clone();
            left.members.remove(17);
            let (_, t_leave) = timed(assignor.as_ref(), &left);
            assert_valid(&g.members, &g.topics, &fresh);
            assert_topic_balanced(&g.members, &g.topics, &fresh);
            let m = measure(&g.members, &g.topics, &fresh);
            println!(
                "{:>10} {members} members × {topics} topics × {partitions} partitions{}: \
                 fresh {t_fresh:?}, unchanged {t_steady:?}, join {t_join:?}, leave {t_leave:?} \
                 (fresh cross-rack {})",
                assignor.name(),
                if mixed { " (mixed subscriptions)" } else { "" },
                m.cross_rack
            );
            worst = worst.max(t_fresh).max(t_steady).max(t_join).max(t_leave);
        }
    }
    if !cfg!(debug_assertions) {
        assert!(worst < Duration::from_millis(100), "worst {worst:?}");
    }
}
