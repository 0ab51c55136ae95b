//! The kaas control thread: everything that decides, and nothing that touches log data.
//!
//! Owns: the health/readiness/metrics HTTP endpoint, and in cluster mode the Lease election,
//! the heartbeat stream, the partition balancer and the `assignment.json` writer/watcher.
//! Runs on the control thread only (a tokio current-thread runtime on its own OS thread); it
//! talks to the shards through lock-free channels and atomics, never through a shared lock.
//! The decision logic (`balancer`, `election`) is pure: observed state and time in, decisions
//! out, so it is tested without sockets or clocks.

pub mod assignment;
pub mod balancer;
pub mod chain;
pub mod election;
pub mod epochs;
pub mod handover;
pub mod health;
pub mod heartbeat;
pub mod lease;
pub mod round;

/// Publishes `value` on a `watch` channel unless it already holds an equal value, so receivers
/// wake only for real changes (a re-published alive set or Lease view would otherwise make
/// the controller recompute and the heartbeat client re-dial).
pub fn set_if_changed<T: PartialEq>(tx: &tokio::sync::watch::Sender<T>, value: T) {
    tx.send_if_modified(|current| {
        let changed = *current != value;
        if changed {
            *current = value;
        }
        changed
    });
}
