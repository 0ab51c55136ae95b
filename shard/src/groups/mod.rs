//! The group coordinator: consumer groups, their membership and their committed offsets.
//!
//! Owns: every group whose id hashes to this shard ([`owner_shard`]), with its membership state
//! machine — classic ([`classic`]: JoinGroup / SyncGroup / Heartbeat / LeaveGroup) or KIP-848
//! ([`consumer`]: ConsumerGroupHeartbeat, server-side assignment through [`assignor`]) — and
//! its committed offsets, kept durable in a per-group log ([`offsets`]). Runs on the shard that
//! owns the group: one `GroupManager` per shard, `Rc`/`RefCell` only, so no lock is ever shared
//! between shards; requests for a group reach its shard through `mesh::on_shard`.
//!
//! The state machines, the assignors, the settings and the errors are the pure `kaas-groups`
//! crate, re-exported here under their old paths; this module is their IO half: the
//! [`GroupManager`] (the groups of a shard, the time, new member ids, claims and loading in
//! cluster mode) and the offset logs.
//!
//! Which *broker* coordinates a group is a separate, pure decision: the design's FNV-1a rule in
//! `kaas_model::coordinator_for_group`, read through the cluster view
//! (`crate::cluster::ClusterView::coordinator`); in single-node mode it is always this broker.

pub mod manager;
pub mod offsets;

pub use kaas_groups::{
    assignor, classic, config, consumer, error, Committer, GroupConfig, GroupError, GroupKind,
};
pub use manager::GroupManager;

/// How often a shard checks its groups' timeouts (sessions, rebalance and initial delays).
/// Rebalances themselves never wait for it: a join or leave completes a phase at once.
pub const TICK: std::time::Duration = std::time::Duration::from_millis(50);

/// The shard that owns group `group_id`: FNV-1a of the id over the shard count, the same style
/// as `shard::owner_shard` for partitions, so a group always comes back to the same core and
/// its state needs no cross-shard lock.
pub fn owner_shard(group_id: &str, shards: usize) -> usize {
    kaas_model::group_shard(group_id, shards)
}

/// FNV-1a, 32 bits: the one implementation, shared with the coordinator rule.
pub use kaas_model::fnv1a_32;

#[cfg(test)]
mod tests {
    use super::*;

    // Group ownership is stable, in range, and spreads groups over the shards.
    #[test]
    fn group_ownership_spreads() {
        let mut counts = [0usize; 4];
        for i in 0..4000 {
            let g = format!("group-{i}");
            let s = owner_shard(&g, 4);
            assert_eq!(s, owner_shard(&g, 4));
            counts[s] += 1;
        }
        assert!(counts.iter().all(|c| *c > 800), "{counts:?}");
        assert_eq!(owner_shard("x", 1), 0);
        // Known FNV-1a-32 vectors.
        assert_eq!(fnv1a_32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a_32(b"a"), 0xe40c_292c);
    }
}
