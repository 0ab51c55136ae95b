//! Tests of the KIP-848 server-side assignors (`uniform`, `range`, `rack-aware`) as pure
//! functions: hand-written scenarios, property tests over random groups, and a brute-force check
//! that `rack-aware` finds the cheapest balanced assignment on small groups.
//!
//! Every check here recomputes what it needs (ownership, cross-rack reads, moves, balance) from
//! the inputs rather than trusting the assignor module's own helpers.
//!
//! The property tests use a small seeded generator rather than proptest (they were written when
//! the assignors lived in a crate without it); each failure names its seed and prints its
//! input, and `ASSIGNOR_SEED` / `ASSIGNOR_CASES` rerun one case or run more.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use kaas_groups::assignor::{
    assignment_stats, by_name, GroupAssignment, MemberSpec, RackAwareAssignor, RackAwareWeights,
    RangeAssignor, ServerAssignor, TopicSpec, UniformAssignor, ASSIGNOR_NAMES, DEFAULT_ASSIGNOR,
};

// ---------------------------------------------------------------------------------------------
// Building groups

fn member(id: &str, rack: Option<&str>, topics: &[&str]) -> MemberSpec {
    MemberSpec {
        member_id: id.to_string(),
        rack: rack.map(str::to_string),
        subscribed_topics: topics.iter().map(|t| t.to_string()).collect(),
        current: BTreeMap::new(),
    }
}

/// A topic whose partition `p` is served from the racks `racks(p)` returns.
fn topic(name: &str, partitions: i32, racks: impl Fn(i32) -> Vec<&'static str>) -> TopicSpec {
    TopicSpec {
        name: name.to_string(),
        partitions,
        partition_racks: (0..partitions)
            .map(|p| racks(p).into_iter().map(str::to_string).collect())
            .collect(),
    }
}

fn no_racks(_: i32) -> Vec<&'static str> {
    Vec::new()
}

fn topic_map(list: Vec<TopicSpec>) -> BTreeMap<String, TopicSpec> {
    list.into_iter().map(|t| (t.name.clone(), t)).collect()
}

/// Members as they look on the next heartbeat: each one's current assignment is `assignment`.
fn with_current(members: &[MemberSpec], assignment: &GroupAssignment) -> Vec<MemberSpec> {
    members
        .iter()
        .map(|m| MemberSpec {
            current: assignment.get(&m.member_id).cloned().unwrap_or_default(),
            ..m.clone()
        })
        .collect()
}

fn parts(list: &[i32]) -> BTreeSet<i32> {
    list.iter().copied().collect()
}

fn uniform() -> Box<dyn ServerAssignor> {
    Box::new(UniformAssignor)
}

fn rack_aware(traffic: u32, overlap: u32) -> Box<dyn ServerAssignor> {
    Box::new(RackAwareAssignor {
        weights: RackAwareWeights { traffic, overlap },
    })
}

// ---------------------------------------------------------------------------------------------
// Reference measurements, computed from the inputs alone

/// The member that owns a partition now: among members still subscribed to the topic and
/// claiming it, the smallest id.
fn owner_of<'a>(members: &'a [MemberSpec], topic: &str, p: i32) -> Option<&'a str> {
    members
        .iter()
        .filter(|m| m.subscribed_topics.contains(topic))
        .filter(|m| m.current.get(topic).is_some_and(|ps| ps.contains(&p)))
        .map(|m| m.member_id.as_str())
        .min()
}

fn reads_across_racks(m: &MemberSpec, t: &TopicSpec, p: i32) -> bool {
    let racks = t.partition_racks.get(p as usize);
    match (&m.rack, racks) {
        (Some(r), Some(rs)) => !rs.is_empty() && !rs.contains(r),
        _ => false,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Measure {
    cross_rack: usize,
    moved: usize,
}

fn measure(
    members: &[MemberSpec],
    topics: &BTreeMap<String, TopicSpec>,
    a: &GroupAssignment,
) -> Measure {
    let mut out = Measure {
        cross_rack: 0,
        moved: 0,
    };
    for (id, owned) in a {
        let m = members.iter().find(|m| &m.member_id == id).unwrap();
        for (t, ps) in owned {
            for &p in ps {
                out.cross_rack += usize::from(reads_across_racks(m, &topics[t], p));
                out.moved += usize::from(owner_of(members, t, p).is_some_and(|o| o != id));
            }
        }
    }
    out
}

fn weighted_cost(w: RackAwareWeights, m: Measure) -> u64 {
    u64::from(w.traffic) * m.cross_rack as u64 + u64::from(w.overlap) * m.moved as u64
}

fn total_of(a: &GroupAssignment, id: &str) -> usize {
    a.get(id).map_or(0, |t| t.values().map(BTreeSet::len).sum())
}

fn count_in(a: &GroupAssignment, id: &str, topic: &str) -> usize {
    a.get(id)
        .and_then(|t| t.get(topic))
        .map_or(0, BTreeSet::len)
}

fn sum_of_squares(members: &[MemberSpec], a: &GroupAssignment) -> usize {
    members
        .iter()
        .map(|m| total_of(a, &m.member_id).pow(2))
        .sum()
}

/// Every subscribed partition assigned exactly once, to a member subscribed to its topic;
/// nothing else assigned; every member present in the result.
fn assert_valid(members: &[MemberSpec], topics: &BTreeMap<String, TopicSpec>, a: &GroupAssignment) {
    let ids: BTreeSet<&str> = members.iter().map(|m| m.member_id.as_str()).collect();
    let keys: BTreeSet<&str> = a.keys().map(String::as_str).collect();
    assert_eq!(ids, keys, "every member, and only members, in the result");
    let mut seen: BTreeMap<(&str, i32), &str> = BTreeMap::new();
    for (id, owned) in a {
        let m = members.iter().find(|m| &m.member_id == id).unwrap();
        for (t, ps) in owned {
            assert!(m.subscribed_topics.contains(t), "{id} got unsubscribed {t}");
            assert!(!ps.is_empty(), "no empty topic entries");
            for &p in ps {
                assert!(
                    (0..topics[t].partitions).contains(&p),
                    "{t}-{p} does not exist"
                );
                if let Some(other) = seen.insert((t.as_str(), p), id) {
                    panic!("{t}-{p} assigned to both {other} and {id}");
                }
            }
        }
    }
    for (t, spec) in topics {
        if members.iter().any(|m| m.subscribed_topics.contains(t)) {
            for p in 0..spec.partitions {
                assert!(seen.contains_key(&(t.as_str(), p)), "{t}-{p} unassigned");
            }
        }
    }
}

/// Each topic's partitions are spread within one over the members subscribed to it.
fn assert_topic_balanced(
    members: &[MemberSpec],
    topics: &BTreeMap<String, TopicSpec>,
    a: &GroupAssignment,
) {
    for t in topics.keys() {
        let counts: Vec<usize> = members
            .iter()
            .filter(|m| m.subscribed_topics.contains(t))
            .map(|m| count_in(a, &m.member_id, t))
            .collect();
        if let (Some(lo), Some(hi)) = (counts.iter().min(), counts.iter().max()) {
            assert!(hi - lo <= 1, "{t} spread {counts:?}");
        }
    }
}

fn assert_totals_within_one(members: &[MemberSpec], a: &GroupAssignment) {
    let totals: Vec<usize> = members.iter().map(|m| total_of(a, &m.member_id)).collect();
    let (lo, hi) = (totals.iter().min().unwrap(), totals.iter().max().unwrap());
    assert!(hi - lo <= 1, "totals {totals:?}");
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

/// SplitMix64: tiny, deterministic, good enough to spread test cases.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }

    fn flip(&mut self) -> bool {
        self.next() & 1 == 1
    }
}

/// Cases per property unless `ASSIGNOR_CASES` says otherwise.
const CASES: u64 = 128;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Checks `property` on inputs drawn by `generate`, one seed per case; a failure reports the
/// seed (rerun it alone with `ASSIGNOR_SEED=<seed> ASSIGNOR_CASES=1`) and the input.
fn check<T: Debug>(generate: impl Fn(&mut Rng) -> T, property: impl Fn(&T)) {
    let first = env_u64("ASSIGNOR_SEED").unwrap_or(0);
    for seed in first..first + env_u64("ASSIGNOR_CASES").unwrap_or(CASES) {
        // Mix the seed so neighbouring seeds give unrelated cases.
        let input = generate(&mut Rng(seed.wrapping_mul(0xD6E8_FEB8_6659_FD93)));
        if catch_unwind(AssertUnwindSafe(|| property(&input))).is_err() {
            panic!("property failed for ASSIGNOR_SEED={seed} on input {input:#?}");
        }
    }
}

#[derive(Debug, Clone)]
struct Group {
    members: Vec<MemberSpec>,
    topics: BTreeMap<String, TopicSpec>,
}

const RACKS: [&str; 3] = ["a", "b", "c"];

/// Whether every member of a random group subscribes to the same topics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Subscriptions {
    Equal,
    /// Equal or differing, chosen at random.
    Either,
}

/// A random group: up to `max_members` members (rack a/b/c or none), up to `max_topics` topics
/// of up to `max_partitions` partitions (each served from a random subset of racks, possibly
/// none), subscriptions as `subscriptions` says, and a random current ownership
/// that includes unowned partitions, partitions claimed twice, claims on topics the member no
/// longer subscribes to, and claims on partitions that no longer exist.
fn random_group(
    rng: &mut Rng,
    max_members: usize,
    max_topics: usize,
    max_partitions: usize,
    subscriptions: Subscriptions,
) -> Group {
    let equal = match subscriptions {
        Subscriptions::Equal => true,
        Subscriptions::Either => rng.flip(),
    };
    let nm = rng.range(1, max_members);
    let nt = rng.range(1, max_topics);
    // Ids deliberately not in creation order, so sorting by id matters.
    let mut members: Vec<MemberSpec> = (0..nm)
        .map(|i| {
            let rack = rng.range(0, 3);
            let mask = if equal {
                (1 << nt) - 1
            } else {
                rng.range(1, (1 << nt) - 1)
            };
            MemberSpec {
                member_id: format!("m{}", (i * 7 + 3) % 11),
                rack: (rack > 0).then(|| RACKS[rack - 1].to_string()),
                subscribed_topics: (0..nt)
                    .filter(|t| mask & (1 << t) != 0)
                    .map(|t| format!("t{t}"))
                    .collect(),
                current: BTreeMap::new(),
            }
        })
        .collect();
    let mut topics = BTreeMap::new();
    for t in 0..nt {
        let name = format!("t{t}");
        let count = rng.range(0, max_partitions);
        for p in 0..count {
            let claimants = match rng.range(0, nm + 1) {
                o if o < nm => vec![o],
                o if o == nm => vec![],
                _ => vec![0, nm - 1],
            };
            for c in claimants {
                let owned = members[c].current.entry(name.clone()).or_default();
                owned.insert(p as i32);
            }
        }
        for m in members.iter_mut() {
            if rng.range(0, 3) == 0 {
                let stale = m.current.entry(name.clone()).or_default();
                stale.insert(count as i32 + 3);
            }
        }
        let partition_racks = (0..count)
            .map(|_| {
                let mask = rng.range(0, 7);
                (0..3)
                    .filter(|r| mask & (1 << r) != 0)
                    .map(|r| RACKS[r].to_string())
                    .collect()
            })
            .collect();
        let spec = TopicSpec {
            name: name.clone(),
            partitions: count as i32,
            partition_racks,
        };
        topics.insert(name, spec);
    }
    Group { members, topics }
}

fn random_weights(rng: &mut Rng) -> RackAwareWeights {
    RackAwareWeights {
        traffic: rng.range(0, 29) as u32,
        overlap: rng.range(0, 5) as u32,
    }
}

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
    // `cargo test --release -p kaas-shard --test assignors -- --ignored --nocapture`.
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
