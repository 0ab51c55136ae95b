//! A small min-cost max-flow solver (primal-dual: successive shortest paths).
//!
//! Each phase runs Dijkstra on reduced costs (Johnson potentials keep them non-negative, so no
//! Bellman-Ford is needed after the start; every edge cost the assignors build is non-negative),
//! then pushes a blocking flow (Dinic-style, on BFS levels) through every edge whose reduced cost
//! is zero. Pushing many augmenting paths per Dijkstra is what makes 1,000 partitions × 100 members
//! cheap: the number of phases is the number of distinct shortest-path lengths, not the number of
//! partitions.
//!
//! Costs are built as `i128` because the assignors encode a lexicographic objective (balance
//! first, then traffic and movement, then movement alone) as one number with large multipliers;
//! with `u32` weights and tens of thousands of partitions that overflows `i64`. The solver runs
//! in `i64` whenever every distance provably fits (the usual case, and measurably faster) and in
//! `i128` otherwise.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::ops::{Add, Sub};

/// Cost of pushing one unit along an edge, as the network is built.
pub(crate) type Cost = i128;

/// Marks a node that BFS did not reach, or a dead end found during a blocking flow.
const UNSEEN: u32 = u32::MAX;

/// A flow network. Edge `e` and its residual twin are `e` and `e ^ 1`.
#[derive(Debug, Default)]
pub(crate) struct Network {
    nodes: usize,
    head: Vec<u32>,
    to: Vec<u32>,
    cap: Vec<i64>,
    cost: Vec<Cost>,
}

impl Network {
    /// Adds a node and returns its index.
    pub(crate) fn add_node(&mut self) -> usize {
        self.nodes += 1;
        self.nodes - 1
    }

    /// Adds an edge `from -> to` with capacity `cap` and per-unit `cost >= 0`; returns its id,
    /// which [`Network::flow`] takes after solving.
    pub(crate) fn add_edge(&mut self, from: usize, to: usize, cap: i64, cost: Cost) -> usize {
        debug_assert!(cost >= 0, "the solver starts from zero potentials");
        let id = self.to.len();
        self.head.extend([from as u32, to as u32]);
        self.to.extend([to as u32, from as u32]);
        self.cap.extend([cap, 0]);
        self.cost.extend([cost, -cost]);
        id
    }

    /// Units of flow on edge `edge` (the capacity its residual twin has gained).
    pub(crate) fn flow(&self, edge: usize) -> i64 {
        self.cap[edge ^ 1]
    }

    /// Pushes as much flow as possible from `source` to `sink` at minimum total cost; returns the
    /// amount pushed.
    pub(crate) fn min_cost_max_flow(&mut self, source: usize, sink: usize) -> i64 {
        // Potentials are shortest-path distances, so every number the solver handles is within
        // (nodes + 1) edge costs of zero, reduced costs within three times that.
        let max_cost = self
            .cost
            .iter()
            .map(|c| c.unsigned_abs())
            .max()
            .unwrap_or(0);
        let fits_i64 = max_cost
            .checked_mul(3 * (self.nodes as u128 + 2))
            .is_some_and(|bound| bound < i64::MAX as u128);
        if fits_i64 {
            let cost: Vec<i64> = self.cost.iter().map(|&c| c as i64).collect();
            Solver::new(self, cost).run(source, sink)
        } else {
            let cost = self.cost.clone();
            Solver::new(self, cost).run(source, sink)
        }
    }
}

/// The integer types the solver can run in.
trait SolverCost: Copy + Ord + Add<Output = Self> + Sub<Output = Self> + Default {}
impl SolverCost for i64 {}
impl SolverCost for i128 {}

/// Solver state over a network's edges: costs in the chosen width and a compact (CSR)
/// adjacency, which is what the inner loops walk.
struct Solver<'a, C> {
    head: &'a [u32],
    to: &'a [u32],
    cap: &'a mut Vec<i64>,
    cost: Vec<C>,
    /// Edges leaving node `u` are `out[first[u]..first[u + 1]]`.
    first: Vec<usize>,
    out: Vec<u32>,
}

impl<'a, C: SolverCost> Solver<'a, C> {
    fn new(net: &'a mut Network, cost: Vec<C>) -> Self {
        let mut first = vec![0usize; net.nodes + 1];
        for &h in &net.head {
            first[h as usize + 1] += 1;
        }
        for u in 0..net.nodes {
            first[u + 1] += first[u];
        }
        let mut fill = first.clone();
        let mut out = vec![0u32; net.head.len()];
        for (e, &h) in net.head.iter().enumerate() {
            out[fill[h as usize]] = e as u32;
            fill[h as usize] += 1;
        }
        Solver {
            head: &net.head,
            to: &net.to,
            cap: &mut net.cap,
            cost,
            first,
            out,
        }
    }

    fn edges(&self, u: usize) -> &[u32] {
        &self.out[self.first[u]..self.first[u + 1]]
    }

    fn run(&mut self, source: usize, sink: usize) -> i64 {
        let n = self.first.len() - 1;
        let mut potential: Vec<C> = vec![C::default(); n];
        let mut dist: Vec<Option<C>> = vec![None; n];
        let mut level = vec![UNSEEN; n];
        let mut next_arc = vec![0usize; n];
        let mut heap = BinaryHeap::new();
        let mut queue = VecDeque::new();
        let mut total = 0;
        loop {
            self.shortest_paths(source, &potential, &mut dist, &mut heap);
            if dist[sink].is_none() {
                return total;
            }
            // Nodes unreachable now stay unreachable (augmenting only reverses edges between
            // reachable nodes), so their potentials no longer matter.
            for (p, d) in potential.iter_mut().zip(&dist) {
                if let Some(d) = *d {
                    *p = *p + d;
                }
            }
            // Push along zero-reduced-cost edges until they no longer connect source and sink;
            // every such path is a shortest path, so the flow stays cost-optimal.
            while self.levels(source, sink, &potential, &dist, &mut level, &mut queue) {
                next_arc.copy_from_slice(&self.first[..n]);
                total += self.blocking_flow(source, sink, &potential, &mut level, &mut next_arc);
            }
        }
    }

    fn reduced_cost(&self, e: usize, potential: &[C]) -> C {
        self.cost[e] + potential[self.head[e] as usize] - potential[self.to[e] as usize]
    }

    /// Dijkstra on reduced costs; `dist[v]` is `None` when `v` is unreachable.
    fn shortest_paths(
        &self,
        source: usize,
        potential: &[C],
        dist: &mut [Option<C>],
        heap: &mut BinaryHeap<Reverse<(C, u32)>>,
    ) {
        dist.fill(None);
        dist[source] = Some(C::default());
        heap.clear();
        heap.push(Reverse((C::default(), source as u32)));
        while let Some(Reverse((d, u))) = heap.pop() {
            let u = u as usize;
            if dist[u] != Some(d) {
                continue;
            }
            for &e in self.edges(u) {
                let e = e as usize;
                if self.cap[e] == 0 {
                    continue;
                }
                let v = self.to[e] as usize;
                let nd = d + self.reduced_cost(e, potential);
                if dist[v].is_none_or(|old| nd < old) {
                    dist[v] = Some(nd);
                    heap.push(Reverse((nd, v as u32)));
                }
            }
        }
    }

    fn admissible(&self, e: usize, potential: &[C], dist: &[Option<C>]) -> bool {
        self.cap[e] > 0
            && dist[self.to[e] as usize].is_some()
            && self.reduced_cost(e, potential) == C::default()
    }

    /// BFS levels over admissible edges; returns whether the sink is reached. Levels make the
    /// admissible subgraph acyclic for the blocking flow (zero-cost cycles exist in it).
    fn levels(
        &self,
        source: usize,
        sink: usize,
        potential: &[C],
        dist: &[Option<C>],
        level: &mut [u32],
        queue: &mut VecDeque<usize>,
    ) -> bool {
        level.fill(UNSEEN);
        level[source] = 0;
        queue.clear();
        queue.push_back(source);
        while let Some(u) = queue.pop_front() {
            for &e in self.edges(u) {
                let e = e as usize;
                let v = self.to[e] as usize;
                if level[v] == UNSEEN && self.admissible(e, potential, dist) {
                    level[v] = level[u] + 1;
                    queue.push_back(v);
                }
            }
        }
        level[sink] != UNSEEN
    }

    /// Iterative DFS blocking flow (no recursion: residual paths can be long and this runs on a
    /// shard's stack). `next_arc[u]` indexes `out`, so dead arcs are skipped for good.
    fn blocking_flow(
        &mut self,
        source: usize,
        sink: usize,
        potential: &[C],
        level: &mut [u32],
        next_arc: &mut [usize],
    ) -> i64 {
        let mut pushed = 0;
        let mut path: Vec<usize> = Vec::new();
        let mut u = source;
        loop {
            if u == sink {
                let f = path.iter().map(|&e| self.cap[e]).min().unwrap_or(0);
                for &e in &path {
                    self.cap[e] -= f;
                    self.cap[e ^ 1] += f;
                }
                pushed += f;
                // Resume from the tail of the first edge the push saturated.
                let k = path.iter().position(|&e| self.cap[e] == 0).unwrap_or(0);
                path.truncate(k);
                u = path.last().map_or(source, |&e| self.to[e] as usize);
                continue;
            }
            let mut advanced = false;
            while next_arc[u] < self.first[u + 1] {
                let e = self.out[next_arc[u]] as usize;
                let v = self.to[e] as usize;
                if self.cap[e] > 0
                    && level[v] != UNSEEN
                    && level[v] == level[u] + 1
                    && self.reduced_cost(e, potential) == C::default()
                {
                    path.push(e);
                    u = v;
                    advanced = true;
                    break;
                }
                next_arc[u] += 1;
            }
            if !advanced {
                if u == source {
                    return pushed;
                }
                level[u] = UNSEEN;
                let e = path
                    .pop()
                    .expect("a non-source node on the path has an entry edge");
                u = self.head[e] as usize;
                next_arc[u] += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves the solver fills the cheap route first, then the dear one.
    #[test]
    fn picks_cheapest_paths_up_to_capacity() {
        let mut net = Network::default();
        let (s, a, b, t) = (
            net.add_node(),
            net.add_node(),
            net.add_node(),
            net.add_node(),
        );
        net.add_edge(s, a, 3, 0);
        let cheap = net.add_edge(a, t, 2, 1);
        let dear = net.add_edge(a, b, 5, 5);
        net.add_edge(b, t, 5, 0);
        assert_eq!(net.min_cost_max_flow(s, t), 3);
        assert_eq!(net.flow(cheap), 2);
        assert_eq!(net.flow(dear), 1);
    }

    // Proves a later, cheaper-overall solution reroutes earlier flow along a residual edge.
    #[test]
    fn reroutes_through_residual_edges() {
        // Two workers, two jobs; the greedy first choice (x->p) must be undone.
        let mut net = Network::default();
        let s = net.add_node();
        let (x, y, p, q, t) = (
            net.add_node(),
            net.add_node(),
            net.add_node(),
            net.add_node(),
            net.add_node(),
        );
        net.add_edge(s, x, 1, 0);
        net.add_edge(s, y, 1, 0);
        let xp = net.add_edge(x, p, 1, 1);
        let xq = net.add_edge(x, q, 1, 2);
        let yp = net.add_edge(y, p, 1, 1);
        net.add_edge(y, q, 1, 10);
        net.add_edge(p, t, 1, 0);
        net.add_edge(q, t, 1, 0);
        assert_eq!(net.min_cost_max_flow(s, t), 2);
        assert_eq!((net.flow(xp), net.flow(xq), net.flow(yp)), (0, 1, 1));
    }

    // Proves the wide (i128) path gives the same answer when costs are too large for i64.
    #[test]
    fn huge_costs_use_the_wide_path_and_agree() {
        let unit: Cost = 1 << 100;
        let mut net = Network::default();
        let (s, a, b, t) = (
            net.add_node(),
            net.add_node(),
            net.add_node(),
            net.add_node(),
        );
        net.add_edge(s, a, 3, 0);
        let cheap = net.add_edge(a, t, 2, unit);
        let dear = net.add_edge(a, b, 5, 5 * unit);
        net.add_edge(b, t, 5, 0);
        assert_eq!(net.min_cost_max_flow(s, t), 3);
        assert_eq!((net.flow(cheap), net.flow(dear)), (2, 1));
    }
}
