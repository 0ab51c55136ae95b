//! The balanced planner behind `uniform` and `rack-aware`: one min-cost flow over all topics.
//!
//! # What "balanced" means here
//! 1. **Per topic (hard):** a topic's partitions are spread over the members subscribed to it
//!    with counts within one (`floor(P/M)` or `ceil(P/M)`). This is the rule that still makes
//!    sense when subscriptions differ, and it keeps every topic's consumption parallel.
//! 2. **Per member (next):** among those, the members' total counts are as even as possible
//!    (the sum of squared totals is minimal). When every member subscribes to the same topics
//!    this means totals within one of each other; with different subscriptions it decides which
//!    members take each topic's leftover partitions so that nobody piles them up.
//! 3. **Cost:** among those, minimise `traffic × (partitions read across racks) + overlap ×
//!    (partitions moved away from their current owner)` (seed 004's cost, see `docs/DESIGN.md`,
//!    with the `rack-aware` weights; `uniform` uses traffic 0, overlap 1, i.e. fewest moves).
//! 4. **Stickiness tie-break:** among equal costs, fewest moves, so feeding an assignment back in
//!    as the current one returns it unchanged.
//!
//! The levels are combined into one cost with multipliers large enough that a lower level never
//! outweighs a higher one, so a single min-cost flow solves all four exactly (the brute-force
//! test in `groups/tests/assignors_rack_aware.rs` checks this on small groups).
//!
//! Balancing per topic rather than only per member total costs some rack affinity when a whole
//! topic lives in one rack; we take that trade because partitions of a topic are normally spread
//! over brokers (and so racks), and a member holding all of one topic is a worse failure mode.
//! Solving all topics jointly (rather than one flow per topic) is what lets level 2 decide who
//! takes each topic's leftovers.
//!
//! # The network
//! ```text
//! source ─▶ class ──────────(owner: cost of keeping)─────────────▶ (member, topic)
//!             └─▶ pool(topic, rack | cross | no-rack) ─(free)─▶ (member, topic)
//! (member, topic) ─(cap floor)──────────────────────────────────▶ sink
//! (member, topic) ─(cap 1)─▶ extras(member) ─(balance)─▶ leftovers ─(cap Σ P mod M)─▶ sink
//! ```
//! A *class* is a set of partitions that cost the same everywhere: same topic, same racks, same
//! current owner; grouping them keeps the graph small (a few hundred nodes for 1,000
//! partitions). Pools stand for "any member of this rack": a class reaches members of its own
//! racks without traffic cost, any racked member through the cross pool at traffic cost, and
//! members without a rack (no preference) for free. The sink's capacities add up to exactly the
//! number of partitions, so a maximum flow fills every `floor` edge and the leftover edge, which
//! is what enforces level 1.
//!
//! Level 2 sits on the `extras → leftovers` edges. With equal subscriptions it is plain
//! capacity (every member takes `R / M` leftovers, and `R mod M` of them one more); otherwise the
//! k-th leftover a member takes costs `balance × (its total so far + k)`, a convex cost whose
//! minimum is the minimal sum of squared totals. The capacity form is not just a shortcut: flat
//! costs keep the number of solver phases to a handful.

use std::collections::BTreeMap;

use super::flow::{Cost, Network};
use super::{GroupAssignment, MemberSpec, RackAwareWeights, TopicSpec};

/// Whether the planner looks at racks (`rack-aware`) or ignores them (`uniform`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RackMode {
    Ignore,
    Respect,
}

/// The group as the planner sees it: members in id order, racks interned, topics with their
/// subscribers and each partition's current owner resolved.
pub(crate) struct Model<'a> {
    /// Members sorted by id, duplicates dropped (first occurrence wins).
    pub(crate) members: Vec<&'a MemberSpec>,
    pub(crate) member_rack: Vec<Option<u32>>,
    pub(crate) topics: Vec<TopicModel<'a>>,
}

pub(crate) struct TopicModel<'a> {
    pub(crate) name: &'a str,
    /// Indices into `Model::members`, ascending.
    pub(crate) subscribers: Vec<usize>,
    /// Per partition: racks it can be read from in-rack (sorted, interned); empty = unknown.
    pub(crate) racks: Vec<Vec<u32>>,
    /// Per partition: the member that owns it now, if that member is still subscribed.
    pub(crate) owner: Vec<Option<usize>>,
}

impl<'a> Model<'a> {
    /// Resolves the inputs. Topics nobody subscribes to, subscriptions to unknown topics and
    /// current ownership of partitions that no longer exist or of topics the member left are all
    /// ignored. When two members claim the same partition, the one with the smaller id is its
    /// owner, so the result does not depend on input order.
    pub(crate) fn new(
        members: &'a [MemberSpec],
        topics: &'a BTreeMap<String, TopicSpec>,
        mode: RackMode,
    ) -> Self {
        let mut sorted: Vec<&MemberSpec> = members.iter().collect();
        sorted.sort_by(|a, b| a.member_id.cmp(&b.member_id));
        sorted.dedup_by(|b, a| a.member_id == b.member_id);

        let mut rack_ids: BTreeMap<&str, u32> = BTreeMap::new();
        let mut intern = |rack: &'a str| {
            let next = rack_ids.len() as u32;
            *rack_ids.entry(rack).or_insert(next)
        };
        let member_rack = sorted
            .iter()
            .map(|m| match mode {
                RackMode::Respect => m.rack.as_deref().map(&mut intern),
                RackMode::Ignore => None,
            })
            .collect();

        let mut topic_models = Vec::new();
        for (name, spec) in topics {
            let count = spec.partitions.max(0) as usize;
            let subscribers: Vec<usize> = (0..sorted.len())
                .filter(|&i| sorted[i].subscribed_topics.contains(name))
                .collect();
            if count == 0 || subscribers.is_empty() {
                continue;
            }
            let racks = (0..count)
                .map(|p| match (mode, spec.partition_racks.get(p)) {
                    (RackMode::Respect, Some(set)) => {
                        let mut ids: Vec<u32> = set.iter().map(|r| intern(r)).collect();
                        ids.sort_unstable();
                        ids
                    }
                    _ => Vec::new(),
                })
                .collect();
            let mut owner = vec![None; count];
            for &i in &subscribers {
                for &p in sorted[i].current.get(name).into_iter().flatten() {
                    if let Some(slot) = usize::try_from(p).ok().and_then(|p| owner.get_mut(p)) {
                        slot.get_or_insert(i);
                    }
                }
            }
            topic_models.push(TopicModel {
                name,
                subscribers,
                racks,
                owner,
            });
        }
        Model {
            members: sorted,
            member_rack,
            topics: topic_models,
        }
    }

    pub(crate) fn partition_count(&self) -> usize {
        self.topics.iter().map(|t| t.racks.len()).sum()
    }
}

/// Whether reading a partition with `racks` from a member in `member_rack` crosses racks.
/// Unknown on either side means no preference, so no traffic cost.
pub(crate) fn crosses(racks: &[u32], member_rack: Option<u32>) -> bool {
    match member_rack {
        Some(r) => !racks.is_empty() && racks.binary_search(&r).is_err(),
        None => false,
    }
}

/// Partitions of one topic that cost the same on every member.
struct Class {
    topic: usize,
    owner: Option<usize>,
    partitions: Vec<i32>,
    /// Edge to the owner's (member, topic) node, if there is an owner.
    keep_edge: Option<usize>,
    /// Edges to pools: (pool index, edge id).
    pool_edges: Vec<(usize, usize)>,
}

/// Any member of one rack (`Some`), any member with a rack (`Cross`), or any member without
/// one (`NoRack`), for one topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum PoolKind {
    Rack(u32),
    Cross,
    NoRack,
}

struct Pool {
    node: usize,
    /// (member index, edge id) for every member the pool feeds, ascending by member.
    member_edges: Vec<(usize, usize)>,
}

/// Computes the balanced, cost-minimal assignment described in the module docs.
#[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
pub(crate) fn assign(
    members: &[MemberSpec],
    topics: &BTreeMap<String, TopicSpec>,
    weights: RackAwareWeights,
    mode: RackMode,
) -> GroupAssignment {
    let model = Model::new(members, topics, mode);
    let mut out: GroupAssignment = model
        .members
        .iter()
        .map(|m| (m.member_id.clone(), BTreeMap::new()))
        .collect();
    let total = model.partition_count();
    if total == 0 {
        return out;
    }

    // Level 3/4 cost of one partition: (traffic × crosses + overlap × moved) scaled above the
    // move count, plus the move count as the tie-break. A whole assignment's tie-break sum is at
    // most `total`, hence the `total + 1` scale.
    let scale = total as Cost + 1;
    let (traffic, overlap) = (weights.traffic as Cost, weights.overlap as Cost);
    let unit = |cross: bool, moved: bool| -> Cost {
        let c = if cross { traffic } else { 0 } + if moved { overlap } else { 0 };
        c * scale + Cost::from(moved)
    };
    // Level 2 multiplier: larger than any difference in the summed level 3/4 costs.
    let balance = total as Cost * ((traffic + overlap) * scale + 1) + 1;

    let mut net = Network::default();
    let source = net.add_node();
    let sink = net.add_node();
    let leftovers = net.add_node();
    let extras: Vec<usize> = model.members.iter().map(|_| net.add_node()).collect();
    let mut extra_units = vec![0usize; model.members.len()];
    let mut base_total = vec![0usize; model.members.len()];
    let mut leftover_total = 0i64;

    let mut classes: Vec<Class> = Vec::new();
    let mut pools: Vec<Pool> = Vec::new();
    for (ti, topic) in model.topics.iter().enumerate() {
        let count = topic.racks.len();
        let subs = topic.subscribers.len();
        let (floor, rest) = (count / subs, count % subs);
        leftover_total += rest as i64;

        // (member, topic) nodes with their share of the topic.
        let mut slot: BTreeMap<usize, usize> = BTreeMap::new();
        for &m in &topic.subscribers {
            let node = net.add_node();
            slot.insert(m, node);
            if floor > 0 {
                net.add_edge(node, sink, floor as i64, 0);
            }
            if rest > 0 {
                net.add_edge(node, extras[m], 1, 0);
                extra_units[m] += 1;
            }
            base_total[m] += floor;
        }

        // Pools, keyed so their order (and so the solution) is deterministic.
        let mut pool_index: BTreeMap<PoolKind, usize> = BTreeMap::new();
        for &m in &topic.subscribers {
            let kinds: &[PoolKind] = match model.member_rack[m] {
                Some(r) => &[PoolKind::Rack(r), PoolKind::Cross],
                None => &[PoolKind::NoRack],
            };
            for &kind in kinds {
                let p = *pool_index.entry(kind).or_insert_with(|| {
                    pools.push(Pool {
                        node: net.add_node(),
                        member_edges: Vec::new(),
                    });
                    pools.len() - 1
                });
                let e = net.add_edge(pools[p].node, slot[&m], count as i64, 0);
                pools[p].member_edges.push((m, e));
            }
        }

        // Classes of interchangeable partitions.
        let mut grouped: BTreeMap<(&[u32], Option<usize>), Vec<i32>> = BTreeMap::new();
        for p in 0..count {
            grouped
                .entry((&topic.racks[p], topic.owner[p]))
                .or_default()
                .push(p as i32);
        }
        for ((racks, owner), partitions) in grouped {
            let node = net.add_node();
            let size = partitions.len() as i64;
            net.add_edge(source, node, size, 0);
            let keep_edge = owner.map(|o| {
                let cost = unit(crosses(racks, model.member_rack[o]), false);
                net.add_edge(node, slot[&o], size, cost)
            });
            let moved = owner.is_some();
            let mut pool_edges = Vec::new();
            for (&kind, &p) in &pool_index {
                let cross = match kind {
                    PoolKind::Rack(r) => {
                        // A same-rack pool only helps partitions served from that rack; the
                        // cross pool already reaches its members at the traffic cost.
                        if racks.binary_search(&r).is_err() {
                            continue;
                        }
                        false
                    }
                    PoolKind::Cross => !racks.is_empty(),
                    PoolKind::NoRack => false,
                };
                let e = net.add_edge(node, pools[p].node, size, unit(cross, moved));
                pool_edges.push((p, e));
            }
            classes.push(Class {
                topic: ti,
                owner,
                partitions,
                keep_edge,
                pool_edges,
            });
        }
    }

    // Level 2 (see the module docs): capacities when subscriptions are equal, convex costs
    // otherwise. Members subscribed to no existing topic take no part in either.
    let active: Vec<usize> = (0..model.members.len())
        .filter(|&m| {
            model
                .topics
                .iter()
                .any(|t| t.subscribers.binary_search(&m).is_ok())
        })
        .collect();
    let homogeneous = model
        .topics
        .iter()
        .all(|t| t.subscribers.len() == active.len());
    if homogeneous {
        let (share, odd) = (
            leftover_total / active.len() as i64,
            leftover_total % active.len() as i64,
        );
        let odd_node = net.add_node();
        for &m in &active {
            if share > 0 {
                net.add_edge(extras[m], leftovers, share, 0);
            }
            if odd > 0 {
                net.add_edge(extras[m], odd_node, 1, 0);
            }
        }
        if odd > 0 {
            net.add_edge(odd_node, leftovers, odd, 0);
        }
    } else {
        for (m, &units) in extra_units.iter().enumerate() {
            for k in 1..=units {
                let marginal = (base_total[m] + k) as Cost;
                net.add_edge(extras[m], leftovers, 1, balance * marginal);
            }
        }
    }
    net.add_edge(leftovers, sink, leftover_total, 0);

    let flowed = net.min_cost_max_flow(source, sink);
    debug_assert_eq!(
        flowed as usize, total,
        "balanced assignment is always feasible"
    );

    // Decompose: each class first keeps what flows on its keep edge, then each pool's inflow is
    // matched to its outflow in class order and member order. Partitions within a class are
    // interchangeable, so any matching has the optimal cost; a fixed order keeps it
    // deterministic.
    let mut grants: Vec<Vec<(usize, i64)>> = vec![Vec::new(); classes.len()];
    for (ci, class) in classes.iter().enumerate() {
        if let (Some(e), Some(o)) = (class.keep_edge, class.owner) {
            let f = net.flow(e);
            if f > 0 {
                grants[ci].push((o, f));
            }
        }
    }
    let mut inflows: Vec<Vec<(usize, i64)>> = vec![Vec::new(); pools.len()];
    for (ci, class) in classes.iter().enumerate() {
        for &(p, e) in &class.pool_edges {
            let f = net.flow(e);
            if f > 0 {
                inflows[p].push((ci, f));
            }
        }
    }
    for (pool, mut inflow) in pools.iter().zip(inflows) {
        inflow.reverse();
        for &(m, e) in &pool.member_edges {
            let mut need = net.flow(e);
            while need > 0 {
                let (ci, have) = inflow.last_mut().expect("pool flow is conserved");
                let take = need.min(*have);
                grants[*ci].push((m, take));
                need -= take;
                *have -= take;
                if *have == 0 {
                    inflow.pop();
                }
            }
        }
    }
    for (class, grant) in classes.iter().zip(grants) {
        let topic = &model.topics[class.topic];
        let mut partitions = class.partitions.iter();
        for (m, n) in grant {
            let owned = out
                .get_mut(&model.members[m].member_id)
                .expect("every member has an entry")
                .entry(topic.name.to_string())
                .or_default();
            owned.extend(partitions.by_ref().take(n as usize).copied());
        }
        debug_assert!(partitions.next().is_none(), "every partition is granted");
    }
    out
}
