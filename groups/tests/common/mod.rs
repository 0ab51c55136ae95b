//! Helpers shared by the assignor tests (`assignors_uniform_range.rs`,
//! `assignors_rack_aware.rs`): building groups, reference measurements computed from the inputs
//! alone (never from the assignor module's own helpers), and the seeded generator of random
//! groups the property tests draw from.

// Each test file compiles its own copy of this module and uses only part of it.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::panic::{catch_unwind, AssertUnwindSafe};

use kaas_groups::assignor::{
    GroupAssignment, MemberSpec, RackAwareAssignor, RackAwareWeights, ServerAssignor, TopicSpec,
    UniformAssignor,
};

// ---------------------------------------------------------------------------------------------
// Building groups

pub fn member(id: &str, rack: Option<&str>, topics: &[&str]) -> MemberSpec {
    MemberSpec {
        member_id: id.to_string(),
        rack: rack.map(str::to_string),
        subscribed_topics: topics.iter().map(|t| t.to_string()).collect(),
        current: BTreeMap::new(),
    }
}

/// A topic whose partition `p` is served from the racks `racks(p)` returns.
pub fn topic(name: &str, partitions: i32, racks: impl Fn(i32) -> Vec<&'static str>) -> TopicSpec {
    TopicSpec {
        name: name.to_string(),
        partitions,
        partition_racks: (0..partitions)
            .map(|p| racks(p).into_iter().map(str::to_string).collect())
            .collect(),
    }
}

pub fn no_racks(_: i32) -> Vec<&'static str> {
    Vec::new()
}

pub fn topic_map(list: Vec<TopicSpec>) -> BTreeMap<String, TopicSpec> {
    list.into_iter().map(|t| (t.name.clone(), t)).collect()
}

/// Members as they look on the next heartbeat: each one's current assignment is `assignment`.
pub fn with_current(members: &[MemberSpec], assignment: &GroupAssignment) -> Vec<MemberSpec> {
    members
        .iter()
        .map(|m| MemberSpec {
            current: assignment.get(&m.member_id).cloned().unwrap_or_default(),
            ..m.clone()
        })
        .collect()
}

pub fn parts(list: &[i32]) -> BTreeSet<i32> {
    list.iter().copied().collect()
}

pub fn uniform() -> Box<dyn ServerAssignor> {
    Box::new(UniformAssignor)
}

pub fn rack_aware(traffic: u32, overlap: u32) -> Box<dyn ServerAssignor> {
    Box::new(RackAwareAssignor {
        weights: RackAwareWeights { traffic, overlap },
    })
}

// ---------------------------------------------------------------------------------------------
// Reference measurements, computed from the inputs alone

/// The member that owns a partition now: among members still subscribed to the topic and
/// claiming it, the smallest id.
pub fn owner_of<'a>(members: &'a [MemberSpec], topic: &str, p: i32) -> Option<&'a str> {
    members
        .iter()
        .filter(|m| m.subscribed_topics.contains(topic))
        .filter(|m| m.current.get(topic).is_some_and(|ps| ps.contains(&p)))
        .map(|m| m.member_id.as_str())
        .min()
}

pub fn reads_across_racks(m: &MemberSpec, t: &TopicSpec, p: i32) -> bool {
    let racks = t.partition_racks.get(p as usize);
    match (&m.rack, racks) {
        (Some(r), Some(rs)) => !rs.is_empty() && !rs.contains(r),
        _ => false,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Measure {
    pub cross_rack: usize,
    pub moved: usize,
}

pub fn measure(
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

pub fn total_of(a: &GroupAssignment, id: &str) -> usize {
    a.get(id).map_or(0, |t| t.values().map(BTreeSet::len).sum())
}

pub fn count_in(a: &GroupAssignment, id: &str, topic: &str) -> usize {
    a.get(id)
        .and_then(|t| t.get(topic))
        .map_or(0, BTreeSet::len)
}

/// Every subscribed partition assigned exactly once, to a member subscribed to its topic;
/// nothing else assigned; every member present in the result.
pub fn assert_valid(
    members: &[MemberSpec],
    topics: &BTreeMap<String, TopicSpec>,
    a: &GroupAssignment,
) {
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
pub fn assert_topic_balanced(
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

pub fn assert_totals_within_one(members: &[MemberSpec], a: &GroupAssignment) {
    let totals: Vec<usize> = members.iter().map(|m| total_of(a, &m.member_id)).collect();
    let (lo, hi) = (totals.iter().min().unwrap(), totals.iter().max().unwrap());
    assert!(hi - lo <= 1, "totals {totals:?}");
}

// ---------------------------------------------------------------------------------------------
// Random groups for property tests

/// SplitMix64: tiny, deterministic, good enough to spread test cases.
pub struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }

    pub fn flip(&mut self) -> bool {
        self.next() & 1 == 1
    }
}

/// Cases per property unless `ASSIGNOR_CASES` says otherwise.
const CASES: u64 = 128;

pub fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Checks `property` on inputs drawn by `generate`, one seed per case; a failure reports the
/// seed (rerun it alone with `ASSIGNOR_SEED=<seed> ASSIGNOR_CASES=1`) and the input.
pub fn check<T: Debug>(generate: impl Fn(&mut Rng) -> T, property: impl Fn(&T)) {
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
pub struct Group {
    pub members: Vec<MemberSpec>,
    pub topics: BTreeMap<String, TopicSpec>,
}

pub const RACKS: [&str; 3] = ["a", "b", "c"];

/// Whether every member of a random group subscribes to the same topics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subscriptions {
    Equal,
    /// Equal or differing, chosen at random.
    Either,
}

/// A random group: up to `max_members` members (rack a/b/c or none), up to `max_topics` topics
/// of up to `max_partitions` partitions (each served from a random subset of racks, possibly
/// none), subscriptions as `subscriptions` says, and a random current ownership
/// that includes unowned partitions, partitions claimed twice, claims on topics the member no
/// longer subscribes to, and claims on partitions that no longer exist.
pub fn random_group(
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
