//! When a draining broker may stop.
//!
//! A broker that gets SIGTERM reports draining and waits until the controller has moved its
//! partitions to brokers that stay. When every broker is stopped at once (SIGTERM to all, or a
//! StatefulSet scaled to 0) nobody stays: the controller gave its Lease up when it began to
//! drain, and draining brokers do not compete for it, so no controller is left to mark the
//! others draining in `assignment.json`, and each broker saw the others "alive" there and
//! waited the whole drain timeout (30 s; 120 s in the chart) for a move that could not happen.
//!
//! So each draining broker also leaves a marker, `<data>/__cluster/draining/<id>`, on the
//! shared volume, and removes it when it starts again. A broker has drained when nothing is
//! assigned to it any more, or when no broker that could take its partitions is left: every
//! other broker the assignment calls alive has a marker too. A marker left by a broker that
//! was killed while draining only says what is true of it until it restarts (it takes no
//! partition before its marker is gone: removing it is the first thing cluster mode does).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use kaas_control::assignment::{Assignment, Health, CLUSTER_DIR};
use kaas_control::balancer::BrokerId;

const MARKERS: &str = "draining";

fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join(CLUSTER_DIR).join(MARKERS)
}

/// Leaves this broker's marker (visible to the other brokers; no fsync: a power cut stops the
/// drain as well).
pub fn mark(data_dir: &Path, me: i32) -> std::io::Result<()> {
    let d = dir(data_dir);
    std::fs::create_dir_all(&d)?;
    std::fs::write(d.join(me.to_string()), b"")
}

/// Removes this broker's marker: it is starting, and may take partitions again.
pub fn unmark(data_dir: &Path, me: i32) -> std::io::Result<()> {
    match std::fs::remove_file(dir(data_dir).join(me.to_string())) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The brokers whose markers are on the volume now.
pub fn draining(data_dir: &Path) -> BTreeSet<i32> {
    std::fs::read_dir(dir(data_dir))
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether broker `me`, draining, may stop: nothing is assigned to it (no partition led, none
/// pending a move from it) and it serves nothing (`serving_nothing`), or no broker is left
/// that could take its partitions — none the assignment calls alive, other than itself and
/// those that drain too.
pub fn may_stop(
    assignment: Option<&Assignment>,
    me: i32,
    serving_nothing: bool,
    draining: &BTreeSet<i32>,
) -> bool {
    let Some(a) = assignment else {
        return serving_nothing;
    };
    let takers = a
        .brokers
        .iter()
        .any(|b| b.id.0 != me && b.health == Health::Alive && !draining.contains(&b.id.0));
    // Also wait until the controller has seen our confirmation and given the partitions to
    // their new leaders: exiting earlier would leave them pending until our silence passes
    // the fence bound.
    let assigned =
        a.led_by(BrokerId(me)).next().is_some() || a.pending.iter().any(|m| m.from.0 == me);
    serving_nothing && !assigned || !takers
}

#[cfg(test)]
mod tests {
    use super::*;
    use kaas_control::assignment::BrokerEntry;
    use kaas_control::balancer::TopicPartition;

    fn assignment(brokers: &[(i32, Health)], leaders: &[i32]) -> Assignment {
        Assignment {
            controller_epoch: 1,
            assignment_version: 1,
            brokers: brokers
                .iter()
                .map(|(id, health)| BrokerEntry {
                    id: BrokerId(*id),
                    host: "127.0.0.1".into(),
                    port: 9092,
                    rack: None,
                    health: *health,
                })
                .collect(),
            partitions: leaders
                .iter()
                .enumerate()
                .map(|(p, l)| (TopicPartition::new("t", p as i32), BrokerId(*l)))
                .collect(),
            consumer_groups: Default::default(),
            pending: Vec::new(),
            leader_epochs: Default::default(),
        }
    }

    /// Why: a whole-cluster stop waited the full drain timeout because every broker saw the
    /// others alive; with every other alive broker draining too, there is nobody to wait for.
    #[test]
    fn everyone_draining_stops_at_once() {
        let a = assignment(
            &[(0, Health::Alive), (1, Health::Alive), (2, Health::Alive)],
            &[0, 1, 2],
        );
        assert!(!may_stop(Some(&a), 0, false, &BTreeSet::from([0])));
        assert!(!may_stop(Some(&a), 0, false, &BTreeSet::from([0, 1])));
        assert!(may_stop(Some(&a), 0, false, &BTreeSet::from([0, 1, 2])));
    }

    /// Why: with a broker left to take over, a drain still waits for its partitions to move.
    #[test]
    fn a_taker_left_means_waiting_for_the_move() {
        let a = assignment(&[(0, Health::Alive), (1, Health::Alive)], &[0, 1]);
        assert!(!may_stop(Some(&a), 0, true, &BTreeSet::from([0])));
        let moved = assignment(&[(0, Health::Draining), (1, Health::Alive)], &[1, 1]);
        assert!(may_stop(Some(&moved), 0, true, &BTreeSet::from([0])));
        assert!(
            !may_stop(Some(&moved), 0, false, &BTreeSet::from([0])),
            "still serving"
        );
    }

    /// Why: the marker round-trips on the volume and removing a missing one is not an error.
    #[test]
    fn markers_are_seen_and_removed() {
        let d = tempfile::tempdir().unwrap();
        assert!(draining(d.path()).is_empty());
        mark(d.path(), 2).unwrap();
        mark(d.path(), 0).unwrap();
        assert_eq!(draining(d.path()), BTreeSet::from([0, 2]));
        unmark(d.path(), 2).unwrap();
        unmark(d.path(), 2).unwrap();
        assert_eq!(draining(d.path()), BTreeSet::from([0]));
    }
}
