//! Why: `controller_round` decides what the controller writes; these properties are the
//! handover's safety claims (docs/DESIGN.md, `control/src/handover.rs`) checked over random
//! clusters, bases, registries and clocks rather than four examples.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kaas_control::assignment::{Assignment, BrokerEntry, Health};
use kaas_control::balancer::{BrokerId, LeaderMap, TopicCounts};
use kaas_control::handover::Timing;
use kaas_control::heartbeat::BrokerRegistry;
use kaas_control::round::{controller_round, newest_base, Round, RoundInputs};
use kaas_proto::heartbeat::BrokerStatus;
use proptest::prelude::*;

const TIMING: Timing = Timing {
    broker_fence: Duration::from_millis(2_500),
    release_after: Duration::from_millis(3_500),
};
const GRACE: Duration = Duration::from_secs(2);
const GAP: Duration = Duration::from_secs(5);

/// One broker as the registry heard it: (id, heard?, ms since its last status, healthy,
/// draining, applied file).
type Heard = (i32, bool, u64, bool, bool, (u64, u64));

#[derive(Debug, Clone)]
struct World {
    epoch: u64,
    leading_for_ms: u64,
    /// The previous file: epoch, version, leaders of topic `t` (by partition), alive rows.
    base: Option<(u64, u64, Vec<i32>, Vec<bool>)>,
    heard: Vec<Heard>,
    partitions: i32,
    previous_holder: Option<i32>,
    /// `--rebalance-hold-ms`: a broker first heard less than this long ago is settling.
    hold_ms: u64,
}

fn world() -> impl Strategy<Value = World> {
    let brokers = 4i32;
    (
        2u64..6,
        0u64..8_000,
        prop::option::of((
            1u64..6,
            1u64..50,
            prop::collection::vec(0..brokers, 1..12),
            prop::collection::vec(any::<bool>(), brokers as usize),
        )),
        prop::collection::vec(
            (
                any::<bool>(),
                0u64..8_000,
                prop::bool::weighted(0.9),
                prop::bool::weighted(0.1),
                (0u64..7, 0u64..60),
            ),
            brokers as usize,
        ),
        1i32..12,
        prop::option::of(0..brokers),
        prop_oneof![Just(0u64), 0u64..10_000],
    )
        .prop_map(
            |(epoch, leading_for_ms, base, heard, partitions, previous_holder, hold_ms)| World {
                epoch,
                leading_for_ms,
                base,
                heard: heard
                    .into_iter()
                    .enumerate()
                    .map(|(i, (h, age, ok, dr, ap))| (i as i32, h, age, ok, dr, ap))
                    .collect(),
                partitions,
                previous_holder,
                hold_ms,
            },
        )
}

fn row(id: i32, alive: bool) -> BrokerEntry {
    BrokerEntry {
        id: BrokerId(id),
        host: format!("b{id}"),
        port: 9092,
        rack: None,
        health: if alive { Health::Alive } else { Health::Dead },
    }
}

fn base_file(w: &World) -> Option<Arc<Assignment>> {
    let (epoch, version, leaders, alive) = w.base.as_ref()?;
    let rows = alive
        .iter()
        .enumerate()
        .map(|(i, a)| row(i as i32, *a))
        .collect();
    let partitions = leaders
        .iter()
        .enumerate()
        .map(|(p, l)| {
            (
                kaas_control::balancer::TopicPartition::new("t", p as i32),
                BrokerId(*l),
            )
        })
        .collect();
    Some(Arc::new(Assignment::new(
        *epoch,
        *version,
        rows,
        partitions,
        [],
    )))
}

fn registry(w: &World, now: Instant) -> BrokerRegistry {
    let mut r = BrokerRegistry::new(None);
    for (i, &(id, heard, age_ms, healthy, draining, applied)) in w.heard.iter().enumerate() {
        if !heard {
            continue;
        }
        let status = BrokerStatus {
            broker_id: id,
            advertised_host: format!("b{id}"),
            advertised_port: 9092,
            healthy,
            draining,
            sequence: 1,
            applied_controller_epoch: applied.0,
            applied_assignment_version: applied.1,
            ..Default::default()
        };
        assert!(r.record(i as u64 + 1, status, now - Duration::from_millis(age_ms)));
    }
    r
}

fn decide(w: &World, base: Option<&Arc<Assignment>>, now: Instant) -> Round {
    let reg = registry(w, now);
    let topics: TopicCounts = [("t".to_string(), w.partitions)].into_iter().collect();
    controller_round(&RoundInputs {
        epoch: w.epoch,
        leading_for: Duration::from_millis(w.leading_for_ms),
        grace: GRACE,
        previous_holder: w.previous_holder.map(BrokerId),
        gap: GAP,
        bases: [base, None],
        registry: &reg,
        alive_timeout: TIMING.release_after,
        topics: &topics,
        pinned: &LeaderMap::new(),
        hold: Duration::from_millis(w.hold_ms),
        timing: &TIMING,
        now,
    })
}

/// When the properties' rounds run: late enough that every registry age is in the past.
fn round_time() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

/// Who leads `t`/`p` in `a`: `Some(Some(broker))`, `Some(None)` in handover, `None` unplaced.
fn leadership(a: &Assignment, p: i32) -> Option<Option<BrokerId>> {
    let tp = kaas_control::balancer::TopicPartition::new("t", p);
    if let Some(l) = a.leader(&tp) {
        return Some(Some(l));
    }
    a.pending.iter().any(|m| m.tp() == tp).then_some(None)
}

/// The leader-epoch rule between two consecutive files: the same leader (or still none) keeps
/// its epoch, and so does the leader that ends a handover; leaving a leader raises it by one
/// (to 1 for a partition new to the files).
fn check_epochs(before: &Assignment, after: &Assignment) -> Result<(), TestCaseError> {
    for p in 0..12 {
        let Some(now) = leadership(after, p) else {
            prop_assert_eq!(
                after.leader_epoch("t", p),
                None,
                "unplaced t-{} has an epoch",
                p
            );
            continue;
        };
        let was = leadership(before, p);
        let (eb, en) = (before.leader_epoch("t", p), after.leader_epoch("t", p));
        if was == Some(now) || (was == Some(None) && now.is_some()) {
            prop_assert_eq!(
                en,
                eb,
                "t-{} went from {:?} to {:?} but its epoch changed",
                p,
                was,
                now
            );
        } else {
            prop_assert_eq!(
                en,
                Some(eb.map_or(1, |e| e + 1)),
                "t-{} went from {:?} to {:?}",
                p,
                was,
                now
            );
        }
    }
    Ok(())
}

/// The base file of `w` and the file a round over it writes; `None` when it writes nothing.
fn written(w: &World) -> Option<(Arc<Assignment>, Assignment)> {
    let now = round_time();
    let base = base_file(w)?;
    match decide(w, Some(&base), now) {
        Round::Unchanged => None,
        Round::Write(next) => Some((base, next)),
    }
}

proptest! {
    // Writing what a round decided and deciding again from it writes nothing more, unless the
    // first file is still waiting on a handover (then the second round may only resolve it).
    #[test]
    fn unchanged_inputs_write_nothing(w in world()) {
        let now = Instant::now() + Duration::from_secs(60);
        let base = base_file(&w);
        // A base from a later epoch would be refused by the brokers; rounds never see one.
        prop_assume!(base.as_ref().is_none_or(|b| b.controller_epoch <= w.epoch));
        if let Round::Write(first) = decide(&w, base.as_ref(), now) {
            let first = Arc::new(first);
            match decide(&w, Some(&first), now) {
                Round::Unchanged => {}
                Round::Write(second) => prop_assert!(
                    !first.pending.is_empty(),
                    "a settled file was rewritten: {first:?} then {second:?}"
                ),
            }
        }
    }

    // Leader epochs are the controller's (crate::epochs): over two rounds, the second after
    // the brokers' clocks moved on (a handover may resolve), a partition's epoch rises exactly
    // when it leaves its leader (to none or to another broker).
    #[test]
    fn an_epoch_rises_exactly_when_a_partition_leaves_its_leader(
        w in world(),
        epochs in prop::collection::vec(1i32..20, 12),
        later_ms in 0u64..10_000,
    ) {
        let now = round_time();
        let Some(base) = base_file(&w) else { return Ok(()) };
        prop_assume!(base.controller_epoch <= w.epoch);
        let mut with_epochs = (*base).clone();
        for p in 0..w.base.as_ref().map_or(0, |b| b.2.len() as i32) {
            with_epochs.set_leader_epoch("t", p, epochs[p as usize]);
        }
        let base = Arc::new(with_epochs);
        let Round::Write(first) = decide(&w, Some(&base), now) else { return Ok(()) };
        check_epochs(&base, &first)?;
        let first = Arc::new(first);
        if let Round::Write(second) = decide(&w, Some(&first), now + Duration::from_millis(later_ms)) {
            check_epochs(&first, &second)?;
        }
    }

    // The base is the newest by (epoch, version) whichever slot holds it.
    #[test]
    fn a_lower_epoch_never_wins(a in (1u64..9, 1u64..99), b in (1u64..9, 1u64..99)) {
        let file = |(e, v): (u64, u64)| Arc::new(Assignment::new(e, v, vec![row(0, true)], Default::default(), []));
        let (fa, fb) = (file(a), file(b));
        let want = a.max(b);
        prop_assert_eq!(newest_base([Some(&fa), Some(&fb)]).unwrap().order_key(), want);
        prop_assert_eq!(newest_base([Some(&fb), Some(&fa)]).unwrap().order_key(), want);
        prop_assert_eq!(newest_base([None, Some(&fa)]).unwrap().order_key(), a);
    }

    // Within the grace period after winning the Lease, a broker the base had alive and that
    // has not reconnected yet keeps its row's health, and no other broker gets its partitions.
    #[test]
    fn grace_drops_no_previously_alive_broker(w in world()) {
        let w = World { leading_for_ms: w.leading_for_ms % GRACE.as_millis() as u64, ..w };
        prop_assume!(base_file(&w).is_some_and(|b| b.controller_epoch <= w.epoch));
        let Some((base, next)) = written(&w) else { return Ok(()) };
        for b in base.brokers.iter().filter(|b| b.health == Health::Alive) {
            let heard = w.heard.iter().any(|h| h.0 == b.id.0 && h.1);
            if heard || Some(b.id.0) == w.previous_holder {
                continue;
            }
            prop_assert_eq!(next.broker(b.id).map(|r| r.health), Some(Health::Alive), "row of {:?}", b.id);
            // Its partitions may be evened out, but only through a pending move: none is
            // given to another broker while it may still be writing.
            for (tp, leader) in &base.partitions {
                if *leader == b.id && tp.partition < w.partitions {
                    let now_led = next.leader(tp);
                    prop_assert!(now_led.is_none() || now_led == Some(b.id), "{:?} left {:?} during grace for {:?}", tp, b.id, now_led);
                }
            }
        }
    }

    // A partition changes leader only once its old leader confirmed (applied a file at least
    // as new as the one that took it away — here, this round's) or has been silent past its
    // release time; until then it is pending and has no leader.
    #[test]
    fn no_new_leader_before_the_old_one_stopped(w in world()) {
        prop_assume!(base_file(&w).is_some_and(|b| b.controller_epoch <= w.epoch));
        let Some((base, next)) = written(&w) else { return Ok(()) };
        for (tp, old) in &base.partitions {
            let Some(new) = next.leader(tp) else { continue };
            if new == *old {
                continue;
            }
            // What handover::silent_for computes: since the last status, capped by the Lease's
            // age (plus the election gap for the previous holder).
            let gap = if w.previous_holder == Some(old.0) { GAP.as_millis() as u64 } else { 0 };
            let since_lease = w.leading_for_ms + gap;
            let silent_ms = w
                .heard
                .iter()
                .find(|h| h.0 == old.0 && h.1)
                .map_or(since_lease, |h| h.2.min(since_lease));
            let silent = Duration::from_millis(silent_ms) >= TIMING.release_after;
            prop_assert!(silent, "{tp:?} moved from {old:?} (silent {silent_ms} ms) to {new:?} without a handover");
        }
        for m in &next.pending {
            prop_assert!(next.leader(&m.tp()).is_none(), "pending {m:?} names a leader");
        }
    }

    // A broker that came up less than the hold ago is given no partition another alive
    // broker led in the base (a client that just lost it would be sent straight back); it
    // may be given partitions whose leader is gone.
    #[test]
    fn a_settling_broker_takes_nothing_from_an_alive_broker(w in world()) {
        prop_assume!(base_file(&w).is_some_and(|b| b.controller_epoch <= w.epoch));
        let Some((base, next)) = written(&w) else { return Ok(()) };
        let now = round_time();
        let reg = registry(&w, now);
        let settling = reg.settling(now, Duration::from_millis(w.hold_ms));
        let in_grace = w.leading_for_ms < GRACE.as_millis() as u64;
        let alive = |b: BrokerId| {
            reg.alive(now, TIMING.release_after).contains_key(&b)
                || (in_grace
                    && reg.get(b).is_none()
                    && Some(b.0) != w.previous_holder
                    && base.broker(b).is_some_and(|r| r.health == Health::Alive))
        };
        for (tp, new) in &next.partitions {
            let Some(old) = base.leader(tp) else { continue };
            if settling.contains(new) && old != *new {
                prop_assert!(!alive(old), "{tp:?} moved from alive {old:?} to settling {new:?}");
            }
        }
    }
}
