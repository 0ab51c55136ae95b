//! One controller round as a pure function: what the controller knows → `Unchanged` or
//! `Write(next assignment)`.
//!
//! The binary (`src/cluster/controller.rs`) gathers the inputs — the newest file it wrote or accepted,
//! a snapshot of the heartbeat registry, the catalog's topics, its Lease epoch and how long it
//! has led — calls [`controller_round`], and does the IO around the answer (the last Lease
//! check, raising the acknowledgement floor, the compare-and-swap write). Everything subtle is
//! decided here, and `control/tests/controller_round.rs` checks it by property:
//!
//! - unchanged inputs write nothing (a second round over the file the first wrote is
//!   `Unchanged`);
//! - a base with a lower `(epoch, version)` never wins, whatever the order of the candidates;
//! - during the grace period after an election no broker the previous file had alive is
//!   dropped for not having reconnected yet;
//! - the handover never names a new leader for a partition before its old leader confirmed
//!   (applied the file that took it away) or went silent past its release time;
//! - a partition's leader epoch rises exactly when it leaves its leader (`crate::epochs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::assignment::{Assignment, Health};
use crate::balancer::{AliveBrokers, BalancePlanner, BrokerId, LeaderMap, TopicCounts};
use crate::epochs;
use crate::handover::{self, Standing, Timing};
use crate::heartbeat::BrokerRegistry;

/// What one round decides from.
pub struct RoundInputs<'a> {
    /// This controller's Lease epoch.
    pub epoch: u64,
    /// How long this controller has held the Lease.
    pub leading_for: Duration,
    /// After winning the Lease, brokers get this long to connect before they count as gone.
    pub grace: Duration,
    /// The previous Lease holder when this controller took its Lease over because it had run
    /// out (`ElectionState::expired_holder`; `None` after a release): its fence was renewed
    /// at least `gap` before this Lease began.
    pub previous_holder: Option<BrokerId>,
    /// `lease_duration − renew_deadline`.
    pub gap: Duration,
    /// The newest of these by `(epoch, version)` is the base (the last file written, the last
    /// accepted); `None`s are ignored.
    pub bases: [Option<&'a Arc<Assignment>>; 2],
    /// The heartbeat registry at `now`.
    pub registry: &'a BrokerRegistry,
    /// How long after its last status a broker stays alive.
    pub alive_timeout: Duration,
    /// Topics and their partition counts.
    pub topics: &'a TopicCounts,
    /// Partitions an operator reassigned: held on their broker while it is alive.
    pub pinned: &'a LeaderMap,
    /// A broker that came up less than this long ago is given no partition another alive
    /// broker leads (`--rebalance-hold-ms`; see `crate::balancer`).
    pub hold: Duration,
    pub timing: &'a Timing,
    pub now: Instant,
}

/// A round's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Round {
    /// The base already says everything: write nothing.
    Unchanged,
    /// Write this file (version = base's + 1).
    Write(Assignment),
}

/// The newest candidate by `(controller_epoch, assignment_version)`: a deposed controller's
/// file carries a lower epoch, so it never becomes the base whatever its version.
pub fn newest_base(bases: [Option<&Arc<Assignment>>; 2]) -> Option<&Arc<Assignment>> {
    bases.into_iter().flatten().max_by_key(|a| a.order_key())
}

/// Decides one round. See the module docs.
pub fn controller_round(inputs: &RoundInputs<'_>) -> Round {
    let previous = newest_base(inputs.bases).map(|a| &**a);
    let registry = inputs.registry;
    let in_grace = inputs.leading_for < inputs.grace;
    let mut alive: AliveBrokers = registry.alive(inputs.now, inputs.alive_timeout);
    if in_grace {
        if let Some(prev) = previous {
            // Not the previous controller: its Lease ran out, so it is most likely gone (if
            // not, it reconnects and its partitions come back through the normal handover).
            for b in prev.brokers.iter().filter(|b| b.health == Health::Alive) {
                if registry.get(b.id).is_none() && Some(b.id) != inputs.previous_holder {
                    alive.entry(b.id).or_insert_with(|| b.rack.clone());
                }
            }
        }
    }
    let base = handover::planning_base(previous);
    let settling = registry.settling(inputs.now, inputs.hold);
    let plan =
        BalancePlanner::plan_settling(&base, &alive, inputs.topics, inputs.pinned, &settling);
    let version = previous.map_or(0, |p| p.assignment_version) + 1;
    let standing = |b: BrokerId| {
        let record = registry.get(b);
        Standing {
            applied: record.map(|r| {
                (
                    r.status.applied_controller_epoch,
                    r.status.applied_assignment_version,
                )
            }),
            silent_for: handover::silent_for(
                record.map(|r| inputs.now.saturating_duration_since(r.last_seen)),
                inputs.leading_for,
                (Some(b) == inputs.previous_holder).then_some(inputs.gap),
            ),
        }
    };
    let (partitions, pending) = handover::next_leadership(
        previous,
        &plan.assignment,
        (inputs.epoch, version),
        standing,
        inputs.timing,
    );
    let mut rows = registry.broker_rows(
        previous.map_or(&[][..], |p| &p.brokers),
        inputs.now,
        inputs.alive_timeout,
    );
    if in_grace {
        // Not heard yet is not dead yet: keep their previous health until the grace ends, so
        // group coordinators do not move while brokers reconnect to a new controller.
        if let Some(prev) = previous {
            for row in &mut rows {
                if registry.get(row.id).is_none() {
                    if let Some(p) = prev.broker(row.id) {
                        row.health = p.health;
                    }
                }
            }
        }
    }
    let mut next = Assignment::new(inputs.epoch, version, rows, partitions, []);
    next.pending = pending;
    next.leader_epochs = epochs::next_epochs(previous, &next);
    let unchanged = previous.is_some_and(|p| {
        p.controller_epoch == inputs.epoch
            && p.brokers == next.brokers
            && p.partitions == next.partitions
            && p.pending == next.pending
            && p.leader_epochs == next.leader_epochs
    });
    if unchanged {
        Round::Unchanged
    } else {
        Round::Write(next)
    }
}
