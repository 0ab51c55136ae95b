//! The cluster as the shards see it: who leads what, which brokers exist, and whether this
//! broker may acknowledge writes right now.
//!
//! Written by the control thread (the accepted `assignment.json`, the Lease holder, the write
//! fence), read lock-free by every shard: the state is an `ArcSwap` snapshot and the fence an
//! atomic deadline. In single-node mode the view is fixed: this broker leads everything and the
//! fence never closes.
//!
//! Which partitions a shard *serves* is not in this view but in the shard's own serving set,
//! changed only by [`ControlMsg`]s from the control thread, in the order relinquish → publish
//! the new view → revalidate what it keeps → take over (the last two at the new view's
//! leader epochs). Metadata reads this view; the ownership check reads the serving
//! set; both follow the same accepted assignment.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use kaas_model::BrokerId;
use kaas_model::{Assignment, Health};

/// One broker as Metadata and DescribeCluster show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerInfo {
    pub id: i32,
    pub host: String,
    pub port: u16,
    pub rack: Option<String>,
    /// Not alive (dead or draining): DescribeCluster v2 reports it fenced.
    pub fenced: bool,
}

/// One accepted assignment, indexed for the request path.
#[derive(Debug, Default)]
pub struct ClusterState {
    /// The accepted `assignment.json`, `None` before the first one.
    pub assignment: Option<Arc<Assignment>>,
    /// Topic → leader of each partition index (-1: none, e.g. in handover).
    leaders: HashMap<String, Vec<i32>>,
    /// Topics only in handover (every partition of theirs pending), which `leaders` lacks:
    /// placed by a controller, unlike a topic created since the last file. With how many
    /// partitions the controller placed (one past the highest pending index): a topic grown
    /// since is not placed whole.
    in_handover: HashMap<String, usize>,
}

impl ClusterState {
    /// Indexes `assignment` for lookups by topic name without allocating.
    pub fn new(assignment: Option<Arc<Assignment>>) -> Self {
        let mut leaders: HashMap<String, Vec<i32>> = HashMap::new();
        if let Some(a) = &assignment {
            for (tp, leader) in &a.partitions {
                let Ok(index) = usize::try_from(tp.partition) else {
                    continue;
                };
                let row = leaders.entry(tp.topic.clone()).or_default();
                if row.len() <= index {
                    row.resize(index + 1, -1);
                }
                row[index] = leader.0;
            }
        }
        let mut in_handover: HashMap<String, usize> = HashMap::new();
        for m in assignment.iter().flat_map(|a| &a.pending) {
            if leaders.contains_key(&m.topic) {
                continue;
            }
            let placed = usize::try_from(m.partition).map_or(0, |i| i + 1);
            let n = in_handover.entry(m.topic.clone()).or_default();
            *n = (*n).max(placed);
        }
        // A partition in handover is placed too, without a leader: its row reaches it.
        for m in assignment.iter().flat_map(|a| &a.pending) {
            if let (Some(row), Ok(index)) =
                (leaders.get_mut(&m.topic), usize::try_from(m.partition))
            {
                if row.len() <= index {
                    row.resize(index + 1, -1);
                }
            }
        }
        Self {
            assignment,
            leaders,
            in_handover,
        }
    }
}

/// What the control thread asks a shard to do with partitions (cluster mode only).
pub enum ControlMsg {
    /// Stop serving these partitions and close them (fsync, manifest, producer state); answer
    /// when every one is closed.
    Relinquish {
        partitions: Vec<(String, i32)>,
        done: futures::channel::oneshot::Sender<Vec<((String, i32), String)>>,
    },
    /// Open, recover, raise the leader epoch, then serve these partitions; answer with the ones
    /// that failed and why.
    TakeOver {
        partitions: Vec<(String, i32)>,
        done: futures::channel::oneshot::Sender<Vec<((String, i32), String)>>,
    },
    /// Reopen (relinquish, then take over at a new epoch) those of these partitions that
    /// another broker has taken over since this shard opened them; answer with the ones whose
    /// take-over failed.
    Revalidate {
        partitions: Vec<(String, i32)>,
        done: futures::channel::oneshot::Sender<Vec<((String, i32), String)>>,
    },
    /// Another broker changed topic or broker configs: re-apply them to the open logs.
    ConfigsChanged,
    /// The view changed: close the consumer groups this broker no longer coordinates and
    /// release their locks.
    ReleaseGroups {
        done: futures::channel::oneshot::Sender<()>,
    },
}

/// The longest [`ClusterView::catch_up`] waits. Every broker applies the controller's file
/// within milliseconds of the others; the bound only matters when no such change is coming.
pub const CATCH_UP: Duration = Duration::from_millis(250);

/// The shared view. See the module docs.
pub struct ClusterView {
    enabled: bool,
    me: i32,
    advertised: (String, u16),
    state: ArcSwap<ClusterState>,
    /// The write fence: nanoseconds after `base` until which writes may be acknowledged.
    fence_until_ns: AtomicU64,
    /// How many times the fence reopened after it had closed: a write may be acknowledged only
    /// if this did not change between the check before the write and the acknowledgement (see
    /// [`ClusterView::fence_term`]).
    fence_lapses: AtomicU64,
    base: Instant,
    /// SIGTERM received: the broker is draining.
    draining: AtomicBool,
    /// The Lease holder's broker id as last read (-1: not known yet). Kept apart from the
    /// assignment: it is known from the first Lease read, before any assignment is accepted.
    lease_holder: std::sync::atomic::AtomicI32,
    /// This broker's `--rack`: what Metadata reports for it on a single node, and the rack
    /// every partition is read from there.
    rack: Option<String>,
    /// Cluster mode: asks the control thread to re-read `assignment.json` now (set at start).
    refresh: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl ClusterView {
    /// The fixed view of a single-node broker: it leads everything, its fence never closes.
    pub fn single(me: i32, host: String, port: u16) -> Self {
        Self {
            enabled: false,
            me,
            advertised: (host, port),
            state: ArcSwap::from_pointee(ClusterState::default()),
            fence_until_ns: AtomicU64::new(u64::MAX),
            fence_lapses: AtomicU64::new(0),
            base: Instant::now(),
            draining: AtomicBool::new(false),
            lease_holder: std::sync::atomic::AtomicI32::new(-1),
            rack: None,
            refresh: std::sync::OnceLock::new(),
        }
    }

    /// This broker's rack (`--rack`).
    pub fn with_rack(mut self, rack: Option<String>) -> Self {
        self.rack = rack;
        self
    }

    /// The view of a cluster member before its first assignment: it leads nothing and may not
    /// acknowledge writes until a controller acknowledged its heartbeat.
    pub fn cluster(me: i32, host: String, port: u16) -> Self {
        Self {
            enabled: true,
            fence_until_ns: AtomicU64::new(0),
            ..Self::single(me, host, port)
        }
    }

    /// Installs how [`ClusterView::refresh`] reaches the assignment watcher (control thread,
    /// once at start).
    pub fn set_refresh(&self, refresh: impl Fn() + Send + Sync + 'static) {
        let _ = self.refresh.set(Box::new(refresh));
    }

    /// Asks for `assignment.json` to be read again now rather than at the next push or poll
    /// (a no-op on a single node). The view changes when the file held something new.
    pub fn refresh(&self) {
        if let Some(f) = self.refresh.get() {
            f();
        }
    }

    /// Waits, up to [`CATCH_UP`], while `behind` says this broker's view has not caught up
    /// with a change the controller or another broker made moments ago: a topic created
    /// through another broker (`handlers::metadata::catch_up`), or a partition this broker is
    /// about to take over (`Shard::await_take_over`). Asks for the assignment to be re-read
    /// first. Shard threads only (a glommio timer paces the checks).
    pub async fn catch_up(&self, behind: impl Fn() -> bool) {
        if !behind() {
            return;
        }
        self.refresh();
        let deadline = Instant::now() + CATCH_UP;
        while behind() && Instant::now() < deadline {
            glommio::timer::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Whether cluster mode is on.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// This broker's id.
    pub fn me(&self) -> i32 {
        self.me
    }

    /// The current state snapshot.
    pub fn state(&self) -> Arc<ClusterState> {
        self.state.load_full()
    }

    /// Publishes a new state (control thread).
    pub fn publish(&self, state: ClusterState) {
        self.state.store(Arc::new(state));
    }

    /// The leader of a partition: this broker in single-node mode; in cluster mode the
    /// assignment's answer (`None` while the partition is unassigned or in handover).
    pub fn leader(&self, topic: &str, partition: i32) -> Option<i32> {
        if !self.enabled {
            return Some(self.me);
        }
        let index = usize::try_from(partition).ok()?;
        self.state
            .load()
            .leaders
            .get(topic)
            .and_then(|row| row.get(index))
            .copied()
            .filter(|l| *l >= 0)
    }

    /// The leader epoch the accepted assignment gives a partition (cluster mode; `None` on a
    /// single node, before the first assignment, and in files written before controllers gave
    /// epochs). See `kaas_model::Assignment::leader_epochs`.
    pub fn assigned_epoch(&self, topic: &str, partition: i32) -> Option<i32> {
        if !self.enabled {
            return None;
        }
        self.state
            .load()
            .assignment
            .as_ref()
            .and_then(|a| a.leader_epoch(topic, partition))
    }

    /// Whether a controller has placed `topic` yet: false in cluster mode for a topic created
    /// after the accepted assignment was written (its partitions have no leader until the
    /// controller's next file, up to a catalog reload and a round later). Always true on a
    /// single node.
    pub fn placed(&self, topic: &str) -> bool {
        if !self.enabled {
            return true;
        }
        let state = self.state.load();
        state.leaders.contains_key(topic) || state.in_handover.contains_key(topic)
    }

    /// Whether a controller has placed `topic` with at least `partitions` partitions (after
    /// CreatePartitions the new ones have no leader until its next file). Always true on a
    /// single node.
    pub fn placed_partitions(&self, topic: &str, partitions: i32) -> bool {
        if !self.enabled {
            return true;
        }
        let state = self.state.load();
        match state.leaders.get(topic) {
            Some(row) => row.len() >= usize::try_from(partitions).unwrap_or(0),
            None => state
                .in_handover
                .get(topic)
                .is_some_and(|&n| n >= usize::try_from(partitions).unwrap_or(0)),
        }
    }

    /// The rack of the broker leading a partition, for the rack-aware assignor: from the
    /// assignment's broker rows in cluster mode (`None` while the partition is in handover);
    /// this broker's `--rack` on a single node.
    pub fn leader_rack(&self, topic: &str, partition: i32) -> Option<String> {
        if !self.enabled {
            return self.rack.clone();
        }
        // One snapshot for both lookups: a heartbeat asks this for every subscribed partition.
        let state = self.state.load();
        let leader = *state
            .leaders
            .get(topic)?
            .get(usize::try_from(partition).ok()?)?;
        state
            .assignment
            .as_ref()?
            .broker(BrokerId(leader))?
            .rack
            .clone()
    }

    /// The controller's id: this broker in single-node mode; in cluster mode the Lease
    /// holder, when the broker list this view reports contains it. Otherwise (no Lease read
    /// yet, or an assignment written before the controller's own row) this broker names
    /// itself: clients send admin requests (CreateTopics, ...) to the controller, every kaas
    /// broker serves them, and a controller id that is -1 or missing from Metadata's broker
    /// list makes librdkafka's admin client wait minutes for a metadata refresh.
    pub fn controller(&self) -> i32 {
        if !self.enabled {
            return self.me;
        }
        let holder = self.lease_holder.load(Ordering::Acquire);
        let listed = self
            .state
            .load()
            .assignment
            .as_ref()
            .is_some_and(|a| a.broker(BrokerId(holder)).is_some());
        if listed {
            holder
        } else {
            self.me
        }
    }

    /// Records the Lease holder's broker id (control thread, on every Lease read).
    pub fn set_lease_holder(&self, id: Option<i32>) {
        self.lease_holder.store(id.unwrap_or(-1), Ordering::Release);
    }

    /// Every registered broker (this one alone in single-node mode).
    pub fn brokers(&self) -> Vec<BrokerInfo> {
        let me = BrokerInfo {
            id: self.me,
            host: self.advertised.0.clone(),
            port: self.advertised.1,
            rack: self.rack.clone(),
            fenced: false,
        };
        if !self.enabled {
            return vec![me];
        }
        let state = self.state.load();
        let Some(a) = &state.assignment else {
            return vec![me];
        };
        let mut out: Vec<BrokerInfo> = a
            .brokers
            .iter()
            .map(|b| BrokerInfo {
                id: b.id.0,
                host: b.host.clone(),
                port: b.port,
                rack: b.rack.clone(),
                fenced: b.health != Health::Alive,
            })
            .collect();
        if !out.iter().any(|b| b.id == self.me) {
            out.push(me);
        }
        out
    }

    /// The coordinator of a consumer group: this broker in single-node mode; in cluster mode
    /// the assignment's answer (the FNV-1a hash rule), `None` before the first assignment.
    pub fn coordinator(&self, group: &str) -> Option<i32> {
        if !self.enabled {
            return Some(self.me);
        }
        self.state
            .load()
            .assignment
            .as_ref()
            .and_then(|a| a.coordinator(group))
            .map(|b| b.0)
    }

    /// Whether this broker may acknowledge a write now: always in single-node mode; in cluster
    /// mode only while the write fence is open (see `kaas_control::handover`). Checked before a
    /// write is submitted and again before it is acknowledged.
    pub fn may_acknowledge(&self) -> bool {
        let until = self.fence_until_ns.load(Ordering::Acquire);
        until == u64::MAX || self.nanos(Instant::now()) < until
    }

    /// The fence's current term when it is open: a write checked under term `t` may be
    /// acknowledged later only if [`Self::fence_held_since`]`(t)`, i.e. the fence stayed open
    /// the whole time. Open now is not enough: a fence that closed in between let the
    /// controller hand the partitions away by time, and an acknowledgement of a later status
    /// may have reopened it since.
    pub fn fence_term(&self) -> Option<u64> {
        let term = self.fence_lapses.load(Ordering::SeqCst);
        self.may_acknowledge().then_some(term)
    }

    /// Whether the fence is open now and has not closed since [`Self::fence_term`] returned
    /// `term`.
    pub fn fence_held_since(&self, term: u64) -> bool {
        // The fence first, then the term: `extend_fence` counts a lapse before it reopens, so
        // an open fence seen here comes with the count of the lapse that preceded it.
        self.may_acknowledge() && self.fence_lapses.load(Ordering::SeqCst) == term
    }

    /// Opens the fence until `until` (never moves it back: acknowledgements can arrive out of
    /// order). Called from the control thread only.
    pub fn extend_fence(&self, until: Instant) {
        let until = self.nanos(until);
        let prev = self.fence_until_ns.load(Ordering::SeqCst);
        if prev != u64::MAX && prev <= self.nanos(Instant::now()) && until > prev {
            // Closed until now: this reopens it.
            self.fence_lapses.fetch_add(1, Ordering::SeqCst);
        }
        self.fence_until_ns.fetch_max(until, Ordering::SeqCst);
    }

    /// How long the fence stays open from now (zero when closed); for /healthz.
    pub fn fence_remaining(&self) -> Duration {
        let until = self.fence_until_ns.load(Ordering::Acquire);
        if until == u64::MAX {
            return Duration::MAX;
        }
        Duration::from_nanos(until.saturating_sub(self.nanos(Instant::now())))
    }

    /// Marks the broker as draining (SIGTERM).
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Whether the broker is draining.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kaas_model::BrokerEntry;
    use kaas_model::{BrokerId, TopicPartition};

    // A write checked under one term is acknowledged only if the fence stayed open: a fence
    // that closed and was reopened by a later acknowledgement does not count (a controller may
    // have handed the partitions away in between).
    #[test]
    fn a_fence_that_closed_in_between_does_not_hold() {
        let view = ClusterView::cluster(1, "h".into(), 2);
        assert_eq!(
            view.fence_term(),
            None,
            "closed before the first acknowledgement"
        );
        view.extend_fence(Instant::now() + Duration::from_millis(30));
        let term = view.fence_term().expect("open");
        view.extend_fence(Instant::now() + Duration::from_millis(40));
        assert!(
            view.fence_held_since(term),
            "extended while open: still the same term"
        );
        std::thread::sleep(Duration::from_millis(60));
        assert!(!view.fence_held_since(term), "closed");
        view.extend_fence(Instant::now() + Duration::from_secs(5));
        assert!(view.may_acknowledge(), "reopened");
        assert!(
            !view.fence_held_since(term),
            "but not held since the write was checked"
        );
        let later = view.fence_term().expect("open");
        assert!(view.fence_held_since(later));
        let single = ClusterView::single(0, "h".into(), 1);
        let t = single.fence_term().expect("single node: always open");
        assert!(single.fence_held_since(t));
    }

    // Single-node mode leads everything and never fences; cluster mode starts fenced and
    // leading nothing, then follows the published assignment.
    #[test]
    fn single_and_cluster_views() {
        let single = ClusterView::single(0, "h".into(), 1);
        assert_eq!(single.leader("t", 7), Some(0));
        assert!(single.may_acknowledge());
        let view = ClusterView::cluster(1, "h".into(), 2);
        assert!(!view.may_acknowledge());
        assert_eq!(view.leader("t", 0), None);
        view.extend_fence(Instant::now() + Duration::from_secs(5));
        assert!(view.may_acknowledge());
        view.extend_fence(Instant::now());
        assert!(view.may_acknowledge(), "the fence never moves back");
        let brokers = (0..2)
            .map(|id| BrokerEntry {
                id: BrokerId(id),
                host: format!("b{id}"),
                port: 9092,
                rack: None,
                health: if id == 0 { Health::Dead } else { Health::Alive },
            })
            .collect();
        let a = Assignment::new(
            3,
            1,
            brokers,
            [(TopicPartition::new("t", 1), BrokerId(0))]
                .into_iter()
                .collect(),
            [],
        );
        view.publish(ClusterState::new(Some(Arc::new(a))));
        view.set_lease_holder(Some(1));
        assert_eq!(view.leader("t", 1), Some(0));
        assert_eq!(view.leader("t", 0), None);
        assert_eq!(view.controller(), 1);
        assert!(view.brokers()[0].fenced);
        assert_eq!(view.coordinator("g"), Some(1));
    }

    // A topic is placed once the accepted file names it, as led or in handover; one created
    // since (auto-created on some broker, the controller not yet through its next round) is
    // not, and Metadata answers LEADER_NOT_AVAILABLE for it.
    #[test]
    fn topics_created_after_the_file_are_not_placed() {
        assert!(ClusterView::single(0, "h".into(), 1).placed("anything"));
        let view = ClusterView::cluster(1, "h".into(), 2);
        assert!(!view.placed("t"), "no file yet");
        let mut a = Assignment::new(
            3,
            1,
            Vec::new(),
            [(TopicPartition::new("led", 0), BrokerId(1))]
                .into_iter()
                .collect(),
            [],
        );
        a.pending.push(kaas_model::PendingMove {
            topic: "moving".into(),
            partition: 0,
            from: BrokerId(0),
            to: BrokerId(1),
            since: (3, 1),
        });
        view.publish(ClusterState::new(Some(Arc::new(a))));
        assert!(view.placed("led"));
        assert!(view.placed("moving"), "every partition in handover: placed");
        assert!(!view.placed("new"));
        // Grown to three since the file (CreatePartitions): the one partition in handover
        // does not make the new ones placed. Before, CreatePartitions answered at once here.
        assert!(view.placed_partitions("moving", 1));
        assert!(!view.placed_partitions("moving", 3));
        assert!(view.placed_partitions("led", 1));
        assert!(!view.placed_partitions("led", 3));
    }
}
