//! Lossless handover: when the controller may give a partition to a new leader. Pure.
//!
//! The balancer says where partitions *should* be; this module decides what the next
//! `assignment.json` may *say*, so that no acknowledged write is ever lost when a partition
//! changes leader. The reference design flips the leader in one step and admits that the old
//! leader can keep acknowledging writes for 1–3 s that the new leader never sees. Here a
//! partition leaving broker A passes through [`PendingMove`] (no leader at all) until A has
//! provably stopped acknowledging writes for it; only then does a file name the new leader.
//!
//! # Two ways to know that A has stopped
//!
//! 1. **A confirmed.** A applies files in order. Applying one that no longer lists a partition
//!    means: stop acknowledging it (the shard drops it from its serving set before anything
//!    else), wait for the writes in flight, fsync, persist manifest and producer state, close.
//!    Only then does A report the file's `(controller_epoch, assignment_version)` as applied in
//!    its heartbeat. So `applied ≥ since` proves every write A acknowledged for the partition is
//!    on disk and A will acknowledge no more.
//! 2. **A is fenced by time.** A broker acknowledges writes only while its *write fence* is
//!    open, for `F` = [`Timing::broker_fence`] after
//!    - **an acknowledgement**: A *sent* a status that a controller acknowledged (a PING
//!      carrying that status's sequence). A controller acknowledges only while its Lease is
//!      valid at the moment of sending (`Leadership::leads_now`), and only a status reporting
//!      that A applied every file that took a partition from A (`heartbeat::AckFloor`): the
//!      fence covers whatever A serves, and A serves what the last file *it applied* says, so
//!      an acknowledgement of a broker still on an older file would reopen its fence for
//!      partitions that already have a new leader (a controller resumed from SIGSTOP did this).
//!
//!    A Lease read never opens the fence. Earlier versions also let a read showing the
//!    controller that last acknowledged A (later: only a record unchanged past that holder's
//!    renew deadline) keep A writable while a dead controller's Lease ran out. Both are unsafe:
//!    a holder that still renews may be alive and moving A's partitions by A's silence, and a
//!    holder past its deadline may still have a file it computed in time land later and move
//!    them (`control/tests/handover_model.rs` finds both within a second). The cost is write
//!    availability between a controller's death and the first acknowledgement of its successor.
//!
//!    Let this controller have taken the Lease at `s` (its takeover write landed by then), and
//!    let `t` be the arrival here of the last status received from A. Any acknowledged status of
//!    A was sent before it arrived where it was acknowledged: here, at or before `t`; at a
//!    previous controller, before that controller's renew deadline, which precedes `s`. So A
//!    has stopped by `max(t, s) + F`. The **previous holder** P acknowledged itself only before
//!    its own renew deadline, which the election places at least `G` = `lease_duration − renew_deadline`
//!    before `s` *when this controller took P's Lease over because it had run out*
//!    (`ElectionState::expired_holder`): P has stopped by `max(t, s − G) + F`. A Lease that P
//!    **released** (a SIGTERM drain: P stops acting as controller but keeps serving its
//!    partitions until they move) gives no gap: P may have acknowledged itself an instant
//!    before the release, so it is counted like any other broker, by `max(t, s) + F`.
//!    Counting `G` for a released Lease handed a draining controller's partitions to another
//!    broker within a millisecond of the election while it still served them.
//!
//!    The controller waits [`Timing::release_after`] = `F + margin` past those instants
//!    ([`silent_for`]); the margin absorbs clock-rate drift, scheduling delay and a write
//!    already submitted when the fence closed (appends check the fence before writing and again
//!    before acknowledging; a write in flight completes or fails within the margin, or the
//!    storage watchdog fails it).
//!
//! A broker that cannot reach a controller therefore stops acknowledging within `F`, before any
//! controller may hand its partitions away. That costs availability for
//! that broker's partitions, never an acknowledged write.
//!
//! Moving *to* a broker is always safe once the old leader stopped: the new leader opens the log,
//! recovers it (every acknowledged write is fsynced, so it is there), raises the leader epoch and
//! starts a new segment before its first write.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::assignment::{Assignment, PendingMove};
use crate::balancer::{self, BrokerId, TopicPartition};

/// The handover timings. [`Timing::broker_fence`] must be shorter than
/// [`Timing::release_after`]; the difference is the safety margin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How long a broker keeps acknowledging writes after sending a status that a controller
    /// acknowledged.
    pub broker_fence: Duration,
    /// How long a controller waits past a broker's last status before treating it as stopped.
    pub release_after: Duration,
}

impl Default for Timing {
    /// Statuses go every 500 ms, so a 2.5 s fence tolerates four lost or late ones; 1 s of
    /// margin.
    fn default() -> Self {
        Self {
            broker_fence: Duration::from_millis(2_500),
            release_after: Duration::from_millis(3_500),
        }
    }
}

/// How long ago, by the controller's clock, broker A may last have renewed its write fence:
/// `now − max(last status received, lease start)`; for the previous Lease holder (pass
/// `Some(gap)`, the election's `lease_duration − renew_deadline`)
/// `now − max(last status received, lease start − gap)`. See the module docs.
pub fn silent_for(
    last_status_age: Option<Duration>,
    leading_for: Duration,
    previous_holder_gap: Option<Duration>,
) -> Duration {
    let since_lease = leading_for + previous_holder_gap.unwrap_or_default();
    match last_status_age {
        Some(age) => age.min(since_lease),
        None => since_lease,
    }
}

/// What the controller knows about one broker when deciding a handover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    /// `(controller_epoch, assignment_version)` the broker last reported as applied, if it has
    /// reported to this controller.
    pub applied: Option<(u64, u64)>,
    /// How long it may have been since the broker's write fence was last renewed
    /// ([`silent_for`]).
    pub silent_for: Duration,
}

impl Standing {
    /// Whether the broker has stopped acknowledging writes for a partition taken from it in the
    /// file `since`: it confirmed, or it has been silent past the fence.
    pub fn released(&self, since: (u64, u64), timing: &Timing) -> bool {
        self.applied.is_some_and(|a| a >= since) || self.fenced(timing)
    }

    /// Whether the broker's write fence has certainly closed.
    pub fn fenced(&self, timing: &Timing) -> bool {
        self.silent_for >= timing.release_after
    }
}

/// The brokers that may still serve a partition in `prev` (its leader, or the `from` of a move
/// in flight) and may not in `next`: each is acknowledged again only once it has applied `next`
/// (see `heartbeat::AckFloor`).
pub fn lost_leadership(prev: &Assignment, next: &Assignment) -> BTreeSet<BrokerId> {
    let holders = |a: &Assignment| -> BTreeSet<(TopicPartition, BrokerId)> {
        a.partitions
            .iter()
            .map(|(tp, b)| (tp.clone(), *b))
            .chain(a.pending.iter().map(|m| (m.tp(), m.from)))
            .collect()
    };
    let kept = holders(next);
    holders(prev)
        .into_iter()
        .filter(|h| !kept.contains(h))
        .map(|(_, b)| b)
        .collect()
}

/// The previous leadership the balancer should keep stable: published leaders, and for
/// partitions in flight the broker they are going to.
pub fn planning_base(previous: Option<&Assignment>) -> balancer::LeaderMap {
    let Some(prev) = previous else {
        return balancer::LeaderMap::new();
    };
    let mut base = prev.partitions.clone();
    for m in &prev.pending {
        base.insert(m.tp(), m.to);
    }
    base
}

/// The partitions and pending moves of the next file (stamped `next_key`), given the balancer's
/// `desired` leadership and each broker's standing. A partition goes to its desired leader at
/// once when it had none (new partition) or when its holder is that same broker, already
/// stopped, or fenced; otherwise it is held in [`PendingMove`] until the holder stops.
///
/// Partitions not in `desired` (deleted topics) are dropped: their leader relinquishes them and
/// nobody takes them.
pub fn next_leadership(
    previous: Option<&Assignment>,
    desired: &balancer::LeaderMap,
    next_key: (u64, u64),
    standing: impl Fn(BrokerId) -> Standing,
    timing: &Timing,
) -> (balancer::LeaderMap, Vec<PendingMove>) {
    let empty = balancer::LeaderMap::new();
    let published = previous.map_or(&empty, |p| &p.partitions);
    let in_flight: BTreeMap<TopicPartition, &PendingMove> = previous
        .map(|p| p.pending.iter().map(|m| (m.tp(), m)).collect())
        .unwrap_or_default();
    let mut partitions = balancer::LeaderMap::new();
    let mut pending = Vec::new();
    for (tp, &want) in desired {
        // The broker that may still be acknowledging writes for `tp`, and the file from which
        // it has been told to stop (`None`: it is told by the file we are writing now).
        let holder = match (published.get(tp), in_flight.get(tp)) {
            (Some(&leader), _) => Some((leader, None)),
            (None, Some(m)) => Some((m.from, Some(m.since))),
            (None, None) => None,
        };
        let free = match holder {
            None => true,
            Some((from, _)) if from == want => true,
            Some((from, None)) => standing(from).fenced(timing),
            Some((from, Some(since))) => standing(from).released(since, timing),
        };
        if free {
            partitions.insert(tp.clone(), want);
        } else {
            let (from, since) = holder.expect("a partition with no holder is free");
            pending.push(PendingMove {
                topic: tp.topic.clone(),
                partition: tp.partition,
                from,
                to: want,
                since: since.unwrap_or(next_key),
            });
        }
    }
    // The rule's point: a partition in transit has no leader in the file (nobody may write it
    // until its holder stopped), and moves only between two different brokers.
    debug_assert!(
        pending
            .iter()
            .all(|m| !partitions.contains_key(&m.tp()) && m.from != m.to),
        "a pending move names a leader"
    );
    (partitions, pending)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assignment::{BrokerEntry, Health};

    fn tp(p: i32) -> TopicPartition {
        TopicPartition::new("t", p)
    }

    fn file(key: (u64, u64), leaders: &[(i32, i32)], pending: Vec<PendingMove>) -> Assignment {
        let brokers = (0..3)
            .map(|id| BrokerEntry {
                id: BrokerId(id),
                host: "h".into(),
                port: 1,
                rack: None,
                health: Health::Alive,
            })
            .collect();
        let mut a = Assignment::new(
            key.0,
            key.1,
            brokers,
            leaders
                .iter()
                .map(|(p, l)| (tp(*p), BrokerId(*l)))
                .collect(),
            [],
        );
        a.pending = pending;
        a
    }

    fn desired(leaders: &[(i32, i32)]) -> balancer::LeaderMap {
        leaders
            .iter()
            .map(|(p, l)| (tp(*p), BrokerId(*l)))
            .collect()
    }

    fn live(applied: (u64, u64)) -> Standing {
        Standing {
            applied: Some(applied),
            silent_for: Duration::from_millis(400),
        }
    }

    // A move away from a live leader goes through pending, and completes only once the old
    // leader reports the file that took the partition away.
    #[test]
    fn live_leader_must_confirm_before_the_move() {
        let t = Timing::default();
        let v1 = file((1, 1), &[(0, 0), (1, 0)], vec![]);
        let want = desired(&[(0, 0), (1, 1)]);
        let (parts, pending) = next_leadership(Some(&v1), &want, (1, 2), |_| live((1, 1)), &t);
        assert_eq!(parts, desired(&[(0, 0)]));
        assert_eq!(pending.len(), 1);
        assert_eq!(
            (pending[0].from, pending[0].to, pending[0].since),
            (BrokerId(0), BrokerId(1), (1, 2))
        );
        let mut v2 = file((1, 2), &[(0, 0)], pending);
        v2.partitions = parts;
        // Broker 0 has not applied v2 yet: still pending, same `since`.
        let (_, pending) = next_leadership(Some(&v2), &want, (1, 3), |_| live((1, 1)), &t);
        assert_eq!(pending[0].since, (1, 2));
        // Now it has: the partition goes to broker 1.
        let (parts, pending) = next_leadership(Some(&v2), &want, (1, 3), |_| live((1, 2)), &t);
        assert!(pending.is_empty());
        assert_eq!(parts, want);
    }

    // A silent leader is released by time alone; a new partition is placed at once; a
    // partition moving back to its holder needs no wait; deleted partitions vanish.
    #[test]
    fn fenced_new_and_returning_partitions() {
        let t = Timing::default();
        let silent = Standing {
            applied: None,
            silent_for: t.release_after,
        };
        let barely = Standing {
            applied: None,
            silent_for: t.release_after - Duration::from_millis(1),
        };
        let prev = file(
            (2, 5),
            &[(0, 0), (9, 0)],
            vec![PendingMove {
                topic: "t".into(),
                partition: 1,
                from: BrokerId(2),
                to: BrokerId(1),
                since: (2, 4),
            }],
        );
        let want = desired(&[(0, 1), (1, 2), (2, 1)]);
        let (parts, pending) = next_leadership(Some(&prev), &want, (2, 6), |_| barely, &t);
        // 0: holder 0 not yet fenced → pending; 1: back to its holder 2 → placed; 2: new.
        assert_eq!(parts, desired(&[(1, 2), (2, 1)]));
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].tp(), tp(0));
        let (parts, pending) = next_leadership(Some(&prev), &want, (2, 6), |_| silent, &t);
        assert!(pending.is_empty());
        assert_eq!(parts, want);
    }

    // Silence of a broker never heard counts from the lease start, and for the previous holder
    // from the lease start minus the election gap; a status heard restarts it.
    #[test]
    fn silence_of_unheard_brokers_counts_from_the_lease() {
        let (gap, one) = (Duration::from_secs(5), Duration::from_secs(1));
        assert_eq!(silent_for(None, one, None), one);
        assert_eq!(silent_for(None, one, Some(gap)), Duration::from_secs(6));
        assert_eq!(
            silent_for(Some(Duration::from_millis(300)), one, Some(gap)),
            Duration::from_millis(300)
        );
    }

    // The planner's base keeps in-flight partitions on their destination.
    #[test]
    fn planning_base_uses_destinations() {
        let prev = file(
            (1, 1),
            &[(0, 0)],
            vec![PendingMove {
                topic: "t".into(),
                partition: 1,
                from: BrokerId(0),
                to: BrokerId(2),
                since: (1, 1),
            }],
        );
        assert_eq!(planning_base(Some(&prev)), desired(&[(0, 0), (1, 2)]));
    }
}
