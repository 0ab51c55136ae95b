//! Partition balancer and group-coordinator hash: pure decisions made on the control thread.
//!
//! [`BalancePlanner::plan`] decides which alive broker leads each partition. kaas has no
//! metadata log that remembers where partitions were put, so the controller recomputes the whole
//! assignment whenever an input changes (first Lease win, a topic change, a broker joining or
//! leaving). Every change of leader costs a takeover — the new leader opens the log and replays
//! its tail, and the old one must first stop acknowledging writes — so the planner is built to be
//! *stable*: it decides as little as possible, in the order of the design's cluster contract.
//!
//! 1. **Keep** every partition whose previous leader is alive.
//! 2. **Place** the rest, each on the broker with the fewest partitions of that topic (ties: the
//!    fewest partitions overall, then the rack with the fewest of that topic, then the lowest id).
//! 3. **Even out brokers**: every broker ends with ⌊P/N⌋ or ⌈P/N⌉ partitions. The planner fixes
//!    a target per broker and moves exactly the surplus, just-placed partitions before inherited
//!    ones, so no more inherited partitions move than the balance requires (see
//!    [`BalanceStats::cluster_moves_inherited`]).
//! 4. **Even out each topic** by swapping one partition each way between two brokers. A swap never
//!    changes a broker's total, so step 3's balance survives untouched.
//! 5. **Spread each topic across racks** (where we go beyond the reference design): single moves
//!    between a broker with ⌈P/N⌉ and one with ⌊P/N⌋, or swaps, that lower a rack-concentration
//!    score while keeping every guarantee of steps 3 and 4.
//!
//! Why step 4 always reaches a per-topic spread of at most one: take a topic `T` whose counts
//! differ by two or more between brokers `a` (most) and `b` (fewest). After step 3,
//! `total(b) ≥ total(a) − 1`, so summing over the other topics,
//! `Σ_{U≠T} (count_U(b) − count_U(a)) = total(b) − total(a) + count_T(a) − count_T(b) ≥ 1`:
//! some other topic `U` has strictly more partitions on `b` than on `a`. Swapping one `T`
//! partition `a → b` against one `U` partition `b → a` strictly narrows `T`, and leaves `U`'s two
//! counts inside the range they already spanned, so no topic's spread ever widens and each topic
//! is fixed once, in one pass. "Per-topic spread ≤ 1 when achievable" therefore holds always.
//!
//! **Pinned partitions** (a reassignment: `kafka-reassign-partitions`, Cruise Control) are put
//! on their named broker in step 1 when it is alive, and no later step moves them. They count
//! toward every total; step 3 gives a broker at least as many as are pinned to it and spreads
//! the rest as evenly as the pins allow (a broker pinned above its even share keeps exactly its
//! pins, and the others share what is left within one of each other: no broker holding an
//! unpinned partition has two more than the one with fewest), and steps 4 and 5 only exchange
//! unpinned partitions, so a topic's spread is at most one where the pins leave a partner to
//! swap with. Without pins every guarantee below holds exactly.
//!
//! **Settling brokers** (alive for less than the controller's `--rebalance-hold-ms`, see
//! `kaas_control::round`) keep what they lead and may be given partitions that have no alive
//! leader (step 2), but no step moves a partition another alive broker leads onto them: step 3
//! gives a settling broker at or below its even share exactly what it has, and shares the rest
//! among the others; steps 4 and 5 leave settling brokers out (they neither give nor take), so
//! step 4's argument below holds among the others, and a plan recomputed while the same
//! brokers settle moves nothing.
//! Why: a broker that just started is one clients have just lost. librdkafka 2.0.2 can leave
//! a partition for good on a broker that no longer leads it when Metadata names A, then B,
//! then A again before its thread for A let go of the partition — exactly what handing a
//! restarted broker its partitions back within a second does (its new address may not even
//! answer yet in a client that dials the old one). Kafka leaves the same choice to its
//! periodic preferred-leader election (`leader.imbalance.check.interval.seconds`, 300 s).
//! While a broker settles, the even spread of steps 3 and 4 holds among the others only; the
//! first plan after it settled restores it.
//!
//! Why a recompute with unchanged inputs moves nothing: steps 1–2 keep everything, step 3 finds
//! no surplus, and steps 4–5 only act on states from which an improving swap exists — their own
//! output is a state where none does.
//!
//! Determinism: every input is a `BTreeMap`, and every choice is made by a total order that ends
//! in broker and partition indices, so the same inputs give the same output on every controller.
//!
//! Cost: steps 1–3 are `O(P·N + P log P)`; each swap in steps 4–5 scans the partitions of the
//! brokers involved. 10,000 partitions over 20 brokers plan in about 2–8 ms without racks and
//! 15–35 ms with three racks (release build on a loaded 2-core machine; see the test
//! `ten_thousand_partitions_over_twenty_brokers`).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

pub use kaas_model::{BrokerId, LeaderMap, TopicPartition};

/// The brokers that may lead partitions, each with its rack (zone) if it reported one.
///
/// Brokers without a rack are treated as sharing one unnamed rack; when no broker has a rack
/// there is a single rack and the rack step has nothing to do.
pub type AliveBrokers = BTreeMap<BrokerId, Option<String>>;

/// Topics and their partition counts. A count of zero or less means no partitions.
pub type TopicCounts = BTreeMap<String, i32>;

/// What a plan did, step by step: for logs, metrics and the property tests that check the
/// planner moved no more than it had to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BalanceStats {
    /// Step 1: partitions kept on their alive previous leader.
    pub kept: usize,
    /// Step 2: partitions that had no alive leader and were placed.
    pub placed: usize,
    /// Step 3: partitions moved to even out brokers cluster-wide.
    pub cluster_moves: usize,
    /// Step 3: how many of those were inherited (kept in step 1). This is exactly the minimum any
    /// plan that keeps the cluster within one partition per broker must move, because the
    /// surplus of each broker is taken from its just-placed partitions first.
    pub cluster_moves_inherited: usize,
    /// Step 4: swaps made to even out topics across brokers (two partitions move per swap).
    pub topic_swaps: usize,
    /// Step 5: single moves made to spread topics across racks.
    pub rack_moves: usize,
    /// Step 5: swaps made to spread topics across racks.
    pub rack_swaps: usize,
    /// Partitions kept in step 1 that end up on another broker: the takeovers this plan costs
    /// beyond the partitions whose leader died.
    pub inherited_moved: usize,
}

/// The result of [`BalancePlanner::plan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BalancePlan {
    /// Every partition of every topic and its leader, an alive broker.
    pub assignment: LeaderMap,
    /// What it took to get there.
    pub stats: BalanceStats,
}

/// The partition balancer: a pure function of the previous assignment, the alive brokers (with
/// racks) and the topics. It reads no clock and does no IO; the controller feeds it and
/// publishes its output in `assignment.json`.
#[derive(Debug, Clone, Copy, Default)]
pub struct BalancePlanner;

impl BalancePlanner {
    /// Plans partition leadership. See the module docs for the five steps and their guarantees.
    ///
    /// Partitions in `previous` that no longer exist (deleted topics, or indexes beyond the
    /// topic's count) are dropped. With no alive broker the assignment is empty — the
    /// controller always pins itself into `alive`, so in practice it never is.
    pub fn plan(previous: &LeaderMap, alive: &AliveBrokers, topics: &TopicCounts) -> BalancePlan {
        Self::plan_pinned(previous, alive, topics, &LeaderMap::new())
    }

    /// [`BalancePlanner::plan`] with `pinned` partitions held on their broker while it is alive
    /// (see the module docs). Pins of partitions that do not exist or name a broker not in
    /// `alive` are ignored.
    pub fn plan_pinned(
        previous: &LeaderMap,
        alive: &AliveBrokers,
        topics: &TopicCounts,
        pinned: &LeaderMap,
    ) -> BalancePlan {
        Self::plan_settling(previous, alive, topics, pinned, &BTreeSet::new())
    }

    /// [`BalancePlanner::plan_pinned`] where the `settling` brokers (alive, but started only
    /// just now) receive no partition another alive broker leads (see the module docs). Ids in
    /// `settling` that are not in `alive` are ignored.
    pub fn plan_settling(
        previous: &LeaderMap,
        alive: &AliveBrokers,
        topics: &TopicCounts,
        pinned: &LeaderMap,
        settling: &BTreeSet<BrokerId>,
    ) -> BalancePlan {
        let mut stats = BalanceStats::default();
        if alive.is_empty() {
            return BalancePlan {
                assignment: LeaderMap::new(),
                stats,
            };
        }
        let mut layout = Layout::new(previous, alive, topics, pinned, settling);
        layout.place_orphans(&mut stats);
        layout.even_out_brokers(&mut stats);
        layout.even_out_topics(&mut stats);
        layout.spread_racks(&mut stats);
        stats.inherited_moved = (0..layout.leader.len())
            .filter(|&p| layout.home[p] != NO_HOME && layout.leader[p] != layout.home[p])
            .count();
        BalancePlan {
            assignment: layout.into_assignment(alive, topics),
            stats,
        }
    }

    /// [`BalancePlanner::plan`] without the statistics.
    pub fn assign(previous: &LeaderMap, alive: &AliveBrokers, topics: &TopicCounts) -> LeaderMap {
        Self::plan(previous, alive, topics).assignment
    }
}

/// Marks a partition with no alive previous leader (and, before step 2, no current one).
const NO_HOME: usize = usize::MAX;

/// The working state of one plan, in dense indices: brokers, racks and topics are numbered in
/// their sorted order and partitions topic by topic, so index order is `TopicPartition` order.
struct Layout {
    /// Number of alive brokers.
    brokers: usize,
    /// Number of distinct racks among the alive brokers.
    racks: usize,
    /// Rack index of each broker.
    rack_of: Vec<usize>,
    /// First partition index of each topic, plus one past the last.
    topic_start: Vec<usize>,
    /// Topic index of each partition.
    topic_of: Vec<usize>,
    /// Each partition's alive previous leader, or `NO_HOME`.
    home: Vec<usize>,
    /// Each partition's current leader (`NO_HOME` only before step 2).
    leader: Vec<usize>,
    /// Pinned to its leader: no step after the first moves it.
    fixed: Vec<bool>,
    /// Per broker: settling, so it receives no partition another alive broker leads.
    settling: Vec<bool>,
    /// Each partition's position in `members[leader]`, for O(1) removal.
    slot: Vec<usize>,
    /// The partitions each broker currently leads, in no particular order.
    members: Vec<Vec<usize>>,
    /// How many partitions each broker leads.
    total: Vec<usize>,
    /// `[topic * brokers + broker]`: partitions of a topic on a broker.
    topic_count: Vec<usize>,
    /// `[topic * racks + rack]`: partitions of a topic in a rack.
    rack_count: Vec<usize>,
}

/// Ranks step-4 swaps, lowest first: takeovers the swap costs, change in rack spread, how much
/// the partner topic gains (more first), then brokers `a`, `b` and partitions `p`, `q` so the
/// order is total.
type SwapKey = (i64, i64, Reverse<usize>, usize, usize, usize, usize);

/// Ranks step-5 operations, lowest first: takeovers, change in rack score, then brokers and
/// partitions (`usize::MAX` for a single move's missing partner) so the order is total.
type RackKey = (i64, f64, usize, usize, usize, usize);

/// A candidate step-5 operation: move `p` from broker `a` to `b`, and `q` (if any) back.
#[derive(Clone, Copy)]
struct RackOp {
    a: usize,
    b: usize,
    p: usize,
    q: Option<usize>,
}

impl Layout {
    /// Step 1: index the inputs, keep every partition whose previous leader is alive, and put
    /// every pinned partition on its broker.
    fn new(
        previous: &LeaderMap,
        alive: &AliveBrokers,
        topics: &TopicCounts,
        pinned: &LeaderMap,
        settling: &BTreeSet<BrokerId>,
    ) -> Self {
        let broker_index: BTreeMap<BrokerId, usize> =
            alive.keys().enumerate().map(|(i, b)| (*b, i)).collect();
        let rack_names: BTreeMap<Option<&str>, usize> = {
            let mut names: Vec<Option<&str>> = alive.values().map(|r| r.as_deref()).collect();
            names.sort_unstable();
            names.dedup();
            names.into_iter().enumerate().map(|(i, r)| (r, i)).collect()
        };
        let rack_of: Vec<usize> = alive.values().map(|r| rack_names[&r.as_deref()]).collect();

        let mut topic_index: BTreeMap<&str, usize> = BTreeMap::new();
        let mut topic_start = vec![0];
        let mut topic_of = Vec::new();
        for (name, &count) in topics {
            let count = usize::try_from(count).unwrap_or(0);
            let t = topic_index.len();
            topic_index.insert(name.as_str(), t);
            topic_of.extend(std::iter::repeat_n(t, count));
            topic_start.push(topic_of.len());
        }

        let partitions = topic_of.len();
        let brokers = alive.len();
        let racks = rack_names.len();
        let mut layout = Layout {
            brokers,
            racks,
            rack_of,
            topic_start,
            topic_of,
            home: vec![NO_HOME; partitions],
            leader: vec![NO_HOME; partitions],
            fixed: vec![false; partitions],
            settling: alive.keys().map(|b| settling.contains(b)).collect(),
            slot: vec![0; partitions],
            members: vec![Vec::new(); brokers],
            total: vec![0; brokers],
            topic_count: vec![0; topic_index.len() * brokers],
            rack_count: vec![0; topic_index.len() * racks],
        };
        // A named partition that exists, and a broker that is alive, as dense indices.
        let locate = |layout: &Layout, tp: &TopicPartition, broker: &BrokerId| {
            let t = *topic_index.get(tp.topic.as_str())?;
            let b = *broker_index.get(broker)?;
            let index = usize::try_from(tp.partition).ok()?;
            (index < layout.size(t)).then(|| (layout.topic_start[t] + index, b))
        };
        for (tp, broker) in previous {
            if let Some((p, b)) = locate(&layout, tp, broker) {
                layout.home[p] = b;
                layout.attach(p, b);
            }
        }
        for (tp, broker) in pinned {
            if let Some((p, b)) = locate(&layout, tp, broker) {
                if layout.leader[p] != b {
                    if layout.leader[p] != NO_HOME {
                        layout.detach(p);
                    }
                    layout.attach(p, b);
                }
                layout.fixed[p] = true;
            }
        }
        layout
    }

    fn topics(&self) -> usize {
        self.topic_start.len() - 1
    }

    fn size(&self, t: usize) -> usize {
        self.topic_start[t + 1] - self.topic_start[t]
    }

    fn tc(&self, t: usize, b: usize) -> usize {
        self.topic_count[t * self.brokers + b]
    }

    fn rc(&self, t: usize, r: usize) -> usize {
        self.rack_count[t * self.racks + r]
    }

    fn attach(&mut self, p: usize, b: usize) {
        let t = self.topic_of[p];
        self.leader[p] = b;
        self.slot[p] = self.members[b].len();
        self.members[b].push(p);
        self.total[b] += 1;
        self.topic_count[t * self.brokers + b] += 1;
        self.rack_count[t * self.racks + self.rack_of[b]] += 1;
    }

    fn detach(&mut self, p: usize) {
        let t = self.topic_of[p];
        let b = self.leader[p];
        let slot = self.slot[p];
        self.members[b].swap_remove(slot);
        if let Some(&moved) = self.members[b].get(slot) {
            self.slot[moved] = slot;
        }
        self.total[b] -= 1;
        self.topic_count[t * self.brokers + b] -= 1;
        self.rack_count[t * self.racks + self.rack_of[b]] -= 1;
        self.leader[p] = NO_HOME;
    }

    fn relocate(&mut self, p: usize, to: usize) {
        self.detach(p);
        self.attach(p, to);
    }

    /// How many more takeovers the plan costs if `p` moves to `to`: +1 for an inherited
    /// partition leaving its previous leader, −1 for one going back to it, 0 otherwise (a
    /// just-placed partition costs the same takeover wherever it lands).
    fn move_cost(&self, p: usize, to: usize) -> i64 {
        let home = self.home[p];
        i64::from(to != home) - i64::from(self.leader[p] != home)
    }

    /// Change in topic `t`'s sum of squared per-rack counts if one of its partitions moves from
    /// broker `from` to broker `to`; negative means better spread. Used to break ties.
    fn rack_delta(&self, t: usize, from: usize, to: usize) -> i64 {
        let (rf, rt) = (self.rack_of[from], self.rack_of[to]);
        if rf == rt {
            return 0;
        }
        2 * (self.rc(t, rt) as i64 - self.rc(t, rf) as i64) + 2
    }

    /// Step 2: place every partition without an alive leader on the broker with the fewest
    /// partitions of its topic (ties: fewest overall, rack with fewest of the topic, lowest id).
    fn place_orphans(&mut self, stats: &mut BalanceStats) {
        for p in 0..self.leader.len() {
            if self.leader[p] != NO_HOME {
                stats.kept += 1;
                continue;
            }
            let t = self.topic_of[p];
            let b = (0..self.brokers)
                .min_by_key(|&b| (self.tc(t, b), self.total[b], self.rc(t, self.rack_of[b]), b))
                .expect("at least one alive broker");
            self.attach(p, b);
            stats.placed += 1;
        }
    }

    /// Step 3: give every broker ⌊P/N⌋ or ⌈P/N⌉ partitions with the fewest possible moves.
    ///
    /// The `P mod N` brokers allowed ⌈P/N⌉ are chosen among those already above ⌊P/N⌋ —
    /// each such choice saves a move — preferring those whose *inherited* partitions alone are
    /// above ⌊P/N⌋, since there the saved move would be a takeover. Each broker then sheds its
    /// surplus, just-placed partitions first and, among those, the topic it holds the most of
    /// relative to that topic's fair share; each goes to the short broker with the fewest of
    /// that topic, so step 4 has little left to swap.
    fn even_out_brokers(&mut self, stats: &mut BalanceStats) {
        let n = self.brokers;
        let target = self.broker_targets();
        let mut deficit: Vec<usize> = (0..n)
            .map(|b| target[b].saturating_sub(self.total[b]))
            .collect();

        for (s, &goal) in target.iter().enumerate() {
            let mut surplus = self.total[s].saturating_sub(goal);
            if surplus == 0 {
                continue;
            }
            // Per topic, the broker's partitions split into [just placed, inherited], each
            // sorted so that `pop` yields the lowest partition first.
            let mut pools: BTreeMap<usize, [Vec<usize>; 2]> = BTreeMap::new();
            for &p in self.members[s].iter().filter(|&&p| !self.fixed[p]) {
                let class = usize::from(self.home[p] == s);
                pools.entry(self.topic_of[p]).or_default()[class].push(p);
            }
            for lists in pools.values_mut() {
                lists[0].sort_unstable_by(|x, y| y.cmp(x));
                lists[1].sort_unstable_by(|x, y| y.cmp(x));
            }
            let key = |layout: &Layout, t: usize, lists: &[Vec<usize>; 2]| {
                let class = usize::from(lists[0].is_empty());
                let over = (layout.tc(t, s) * n) as i64 - layout.size(t) as i64;
                (Reverse(class), over, Reverse(t))
            };
            let mut heap: BinaryHeap<_> = pools.iter().map(|(&t, l)| key(self, t, l)).collect();
            while surplus > 0 {
                let Some((Reverse(class), _, Reverse(t))) = heap.pop() else {
                    break;
                };
                let lists = pools.get_mut(&t).expect("pooled topic");
                let p = lists[class].pop().expect("non-empty pool");
                let to = (0..n)
                    .filter(|&d| deficit[d] > 0)
                    .min_by_key(|&d| {
                        (
                            self.tc(t, d),
                            self.rc(t, self.rack_of[d]),
                            Reverse(deficit[d]),
                            d,
                        )
                    })
                    .expect("surplus and deficit are equal in total");
                self.relocate(p, to);
                surplus -= 1;
                deficit[to] -= 1;
                stats.cluster_moves += 1;
                stats.cluster_moves_inherited += class;
                let lists = &pools[&t];
                if !lists[0].is_empty() || !lists[1].is_empty() {
                    heap.push(key(self, t, lists));
                }
            }
        }
    }

    /// Step 3's goal per broker: ⌊P/N⌋ or ⌈P/N⌉, the ⌈P/N⌉ given to brokers already above
    /// ⌊P/N⌋ (inherited partitions first), never fewer than a broker's pins, and for a settling
    /// broker never more than it has.
    fn broker_targets(&self) -> Vec<usize> {
        let n = self.brokers;
        let partitions = self.leader.len();
        let mut kept = vec![0usize; n];
        let mut pins = vec![0usize; n];
        for p in 0..partitions {
            if self.home[p] != NO_HOME {
                kept[self.home[p]] += 1;
            }
            if self.fixed[p] {
                pins[self.leader[p]] += 1;
            }
        }
        // A broker pinned above the even share keeps exactly its pins; the others share the
        // rest. "Above" is above ⌈rest/free⌉, or at it when more brokers are pinned there than
        // there are ⌈⌉ places (`extra`). A settling broker at or below ⌊rest/free⌋ keeps
        // exactly what it has. Capping changes the share of the others, so repeat until no
        // broker is left to cap.
        let mut capped: Vec<Option<usize>> = vec![None; n];
        let (floor, extra) = loop {
            let free = capped.iter().filter(|c| c.is_none()).count();
            if free == 0 {
                break (0, 0);
            }
            let rest = partitions - capped.iter().flatten().sum::<usize>();
            let (floor, extra) = (rest / free, rest % free);
            let open = |b: &usize| capped[*b].is_none();
            let above_ceil: Vec<usize> = (0..n)
                .filter(open)
                .filter(|&b| pins[b] > floor + usize::from(extra > 0))
                .collect();
            let above_floor: Vec<usize> =
                (0..n).filter(open).filter(|&b| pins[b] > floor).collect();
            // Pinned brokers first, then settling ones: each is capped at what it must keep.
            let cap: Vec<(usize, usize)> = if !above_ceil.is_empty() {
                above_ceil.into_iter().map(|b| (b, pins[b])).collect()
            } else if above_floor.len() > extra {
                above_floor.into_iter().map(|b| (b, pins[b])).collect()
            } else {
                (0..n)
                    .filter(open)
                    .filter(|&b| self.settling[b] && self.total[b] <= floor)
                    .map(|b| (b, self.total[b]))
                    .collect()
            };
            if cap.is_empty() {
                break (floor, extra);
            }
            for (b, keep) in cap {
                capped[b] = Some(keep);
            }
        };
        let mut order: Vec<usize> = (0..n).filter(|&b| capped[b].is_none()).collect();
        order.sort_by_key(|&b| {
            (
                Reverse(pins[b] > floor),
                Reverse(self.total[b] > floor),
                Reverse(kept[b] > floor),
                b,
            )
        });
        let mut target: Vec<usize> = (0..n).map(|b| capped[b].unwrap_or(floor)).collect();
        for &b in &order[..extra] {
            target[b] = floor + 1;
        }
        debug_assert!(
            (0..n).all(|b| target[b] >= pins[b]),
            "a target below a broker's pins"
        );
        debug_assert!(
            (0..n).all(|b| !self.settling[b] || target[b] <= self.total[b]),
            "a settling broker given a target above what it has"
        );
        debug_assert_eq!(target.iter().sum::<usize>(), partitions);
        target
    }

    /// Step 4: swap partitions pairwise until every topic's per-broker counts differ by at most
    /// one. The module docs show a partner always exists and no swap widens another topic.
    fn even_out_topics(&mut self, stats: &mut BalanceStats) {
        let n = self.brokers;
        let open: Vec<usize> = (0..n).filter(|&b| !self.settling[b]).collect();
        for t in 0..self.topics() {
            loop {
                let counts = &self.topic_count[t * n..(t + 1) * n];
                let most = open.iter().map(|&b| counts[b]).max().unwrap_or(0);
                let fewest = open.iter().map(|&b| counts[b]).min().unwrap_or(0);
                if most < fewest + 2 {
                    break;
                }
                let heavy: Vec<usize> = open
                    .iter()
                    .copied()
                    .filter(|&b| counts[b] == most)
                    .collect();
                let light: Vec<usize> = open
                    .iter()
                    .copied()
                    .filter(|&b| counts[b] == fewest)
                    .collect();
                // Cheapest swap first (fewest takeovers), then best rack spread, then the partner
                // topic that gains most, then indices for determinism.
                let mut best: Option<(SwapKey, (usize, usize, usize, usize))> = None;
                for &a in &heavy {
                    let ours: Vec<usize> = self.members[a]
                        .iter()
                        .copied()
                        .filter(|&p| self.topic_of[p] == t && !self.fixed[p])
                        .collect();
                    for &b in &light {
                        let Some(&p) = ours.iter().min_by_key(|&&p| (self.move_cost(p, b), p))
                        else {
                            break; // every partition of the topic on `a` is pinned
                        };
                        let cost_p = self.move_cost(p, b);
                        let rack_p = self.rack_delta(t, a, b);
                        for &q in &self.members[b] {
                            let u = self.topic_of[q];
                            if u == t || self.fixed[q] || self.tc(u, b) < self.tc(u, a) + 1 {
                                continue;
                            }
                            let key = (
                                cost_p + self.move_cost(q, a),
                                rack_p + self.rack_delta(u, b, a),
                                Reverse(self.tc(u, b) - self.tc(u, a)),
                                a,
                                b,
                                p,
                                q,
                            );
                            if best.as_ref().is_none_or(|(k, _)| key < *k) {
                                best = Some((key, (a, b, p, q)));
                            }
                        }
                    }
                }
                let Some((_, (a, b, p, q))) = best else {
                    debug_assert!(
                        self.fixed.iter().any(|f| *f),
                        "step 4 found no partner; step 3 left brokers uneven"
                    );
                    break;
                };
                self.relocate(p, b);
                self.relocate(q, a);
                stats.topic_swaps += 1;
            }
        }
    }

    /// Step 5: spread each topic across racks without undoing steps 3 and 4.
    ///
    /// The score is the sum over topics of the topic's Herfindahl index over racks,
    /// `Σ_R (count_R / P_T)²`: lower is better spread, and dividing by `P_T²` makes every topic
    /// count the same, so a three-partition topic on two racks outweighs a hundred-partition topic
    /// one partition off even. An operation moves one partition of a topic from broker `a` to `b`
    /// in another rack where that topic has at least two fewer, and is allowed only if it keeps
    /// the guarantees: either a single move from a broker with ⌈P/N⌉ to one with ⌊P/N⌋, or a swap
    /// with a partition of a topic that has more on `b` than on `a`; in both cases the topic counts
    /// involved stay within the range they spanned. Every operation strictly lowers the score, so
    /// the loop ends; the move budget only guards against pathological inputs.
    fn spread_racks(&mut self, stats: &mut BalanceStats) {
        if self.racks < 2 {
            return;
        }
        let mut budget = 4 * self.leader.len() + 64;
        loop {
            let mut changed = false;
            for t in 0..self.topics() {
                while budget > 0 {
                    let Some(op) = self.best_rack_op(t) else {
                        break;
                    };
                    self.relocate(op.p, op.b);
                    match op.q {
                        Some(q) => {
                            self.relocate(q, op.a);
                            stats.rack_swaps += 1;
                        }
                        None => stats.rack_moves += 1,
                    }
                    budget -= 1;
                    changed = true;
                }
            }
            if !changed || budget == 0 {
                break;
            }
        }
    }

    /// The cheapest score-lowering rack operation for topic `t`, if there is one.
    fn best_rack_op(&self, t: usize) -> Option<RackOp> {
        let size = self.size(t);
        if size < 2 {
            return None;
        }
        let racks = &self.rack_count[t * self.racks..(t + 1) * self.racks];
        let most = racks.iter().copied().max().unwrap_or(0);
        let fewest = racks.iter().copied().min().unwrap_or(0);
        if most < fewest + 2 {
            return None;
        }
        let t_den = (size * size) as i128;
        // (takeovers, score change, then indices), lowest wins.
        let mut best: Option<(RackKey, RackOp)> = None;
        let mut consider = |key: RackKey, op: RackOp| {
            let better = match &best {
                None => true,
                Some((k, _)) => key.partial_cmp(k) == Some(std::cmp::Ordering::Less),
            };
            if better {
                best = Some((key, op));
            }
        };
        // Settling brokers neither give nor take here (see the module docs).
        let open = || (0..self.brokers).filter(|&b| !self.settling[b]);
        for a in open() {
            let ra = self.rack_of[a];
            if self.tc(t, a) == 0 || racks[ra] < fewest + 2 {
                continue;
            }
            let ours: Vec<usize> = self.members[a]
                .iter()
                .copied()
                .filter(|&p| self.topic_of[p] == t && !self.fixed[p])
                .collect();
            if ours.is_empty() {
                continue;
            }
            for b in open() {
                let rb = self.rack_of[b];
                if rb == ra || racks[ra] < racks[rb] + 2 || self.tc(t, b) + 1 > self.tc(t, a) {
                    continue;
                }
                let p = *ours
                    .iter()
                    .min_by_key(|&&p| (self.move_cost(p, b), p))
                    .expect("broker leads the topic");
                let cost_p = self.move_cost(p, b);
                // Score change ×½ for `t`: (1 − d) / P², with d the rack gap it closes.
                let t_num = 1 - (racks[ra] - racks[rb]) as i128;
                if self.total[a] == self.total[b] + 1 {
                    let score = t_num as f64 / t_den as f64;
                    consider(
                        (cost_p, score, a, b, p, usize::MAX),
                        RackOp { a, b, p, q: None },
                    );
                }
                for &q in &self.members[b] {
                    let u = self.topic_of[q];
                    if u == t || self.fixed[q] || self.tc(u, b) < self.tc(u, a) + 1 {
                        continue;
                    }
                    let u_size = self.size(u) as i128;
                    let u_den = u_size * u_size;
                    let u_num = 1 + self.rc(u, ra) as i128 - self.rc(u, rb) as i128;
                    // Exact test that the score strictly drops; the float only ranks.
                    if t_num * u_den + u_num * t_den >= 0 {
                        continue;
                    }
                    let score = t_num as f64 / t_den as f64 + u_num as f64 / u_den as f64;
                    consider(
                        (cost_p + self.move_cost(q, a), score, a, b, p, q),
                        RackOp {
                            a,
                            b,
                            p,
                            q: Some(q),
                        },
                    );
                }
            }
        }
        best.map(|(_, op)| op)
    }

    /// The plan as `TopicPartition → BrokerId`, built in sorted order.
    fn into_assignment(self, alive: &AliveBrokers, topics: &TopicCounts) -> LeaderMap {
        let ids: Vec<BrokerId> = alive.keys().copied().collect();
        let mut out = LeaderMap::new();
        for (t, name) in topics.keys().enumerate() {
            for (index, p) in (self.topic_start[t]..self.topic_start[t + 1]).enumerate() {
                let partition = i32::try_from(index).expect("partition count is an i32");
                out.insert(
                    TopicPartition::new(name.clone(), partition),
                    ids[self.leader[p]],
                );
            }
        }
        out
    }
}

pub use kaas_model::{coordinator_for_group, fnv1a_32};
