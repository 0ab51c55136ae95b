//! What a classic group keeps across a coordinator restart or move: its last settled
//! generation. Kafka writes the same thing (members, protocol, leader, assignments) into
//! `__consumer_offsets` and a new coordinator loads it, so members keep heartbeating and
//! committing with the generation they have. Without it every restart answered the members
//! UNKNOWN_MEMBER_ID, refused their next commit and made them rejoin: about one auto-commit
//! interval of records was delivered again per restart (sarama: 804–899 over two restarts).
//!
//! Only settled states are stored: `Stable` (a generation with its assignments) and `Empty`
//! (no members; the generation number carries on). A group in the middle of a rebalance
//! stores nothing new; loaded, it comes back as its last settled generation, and members that
//! had moved on get ILLEGAL_GENERATION or UNKNOWN_MEMBER_ID and rejoin, as on Kafka.

use super::*;

/// One member of a stored generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
    pub assignment: Bytes,
}

/// A settled classic group: `Stable` when it has members, `Empty` when it has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredGroup {
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub leader: Option<String>,
    /// In order of arrival (the oldest becomes leader when the leader leaves).
    pub members: Vec<StoredMember>,
}

/// A cheap fingerprint of the group's settled state, compared on every tick to decide whether
/// the stored copy is behind. `None` while a rebalance is in progress (nothing to store).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SettledKey {
    pub generation: i32,
    pub members: usize,
    /// The member ids: a static member replaced by its new instance keeps the generation and
    /// the count but changes its id, and must be stored again.
    pub ids: u64,
}

impl ClassicGroup {
    /// The fingerprint of the settled state, or `None` mid-rebalance (or dead).
    pub fn settled_key(&self) -> Option<SettledKey> {
        match self.state {
            ClassicState::Stable | ClassicState::Empty => Some(SettledKey {
                generation: self.generation,
                members: self.members.len(),
                ids: {
                    use std::hash::{Hash, Hasher};
                    let mut h = std::collections::hash_map::DefaultHasher::new();
                    // A BTreeMap: the same members hash the same.
                    self.members.keys().for_each(|id| id.hash(&mut h));
                    h.finish()
                },
            }),
            _ => None,
        }
    }

    /// The settled state to store, or `None` mid-rebalance.
    pub fn stored(&self) -> Option<StoredGroup> {
        self.settled_key()?;
        let mut members: Vec<&ClassicMember> = self.members.values().collect();
        members.sort_by_key(|m| m.seq);
        Some(StoredGroup {
            generation: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol_name.clone(),
            leader: self.leader.clone(),
            members: members
                .into_iter()
                .map(|m| StoredMember {
                    member_id: m.member_id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    session_timeout_ms: m.session_timeout_ms,
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    protocol_type: m.protocol_type.clone(),
                    protocols: m.protocols.clone(),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        })
    }

    /// A group as it was stored. Every member's session starts afresh at `now`: the members
    /// heartbeated a coordinator that is gone, and each gets its whole session timeout to find
    /// this one (Kafka does the same on load). A stored group that does not hold together (a
    /// leader that is not a member, members without a protocol) comes back `Empty` at its
    /// generation, so its members rejoin rather than being answered from a broken state.
    pub fn restore(
        group_id: &str,
        initial_delay_ms: u64,
        stored: StoredGroup,
        now: Instant,
    ) -> ClassicGroup {
        let mut g = ClassicGroup::new(group_id, initial_delay_ms);
        g.generation = stored.generation.max(0);
        let whole = !stored.members.is_empty()
            && stored.protocol_type.is_some()
            && stored.protocol_name.as_ref().is_some_and(|p| {
                stored
                    .members
                    .iter()
                    .all(|m| m.protocols.iter().any(|(n, _)| n == p))
            })
            && stored
                .leader
                .as_ref()
                .is_some_and(|l| stored.members.iter().any(|m| &m.member_id == l));
        if !whole {
            g.protocol_type = stored.protocol_type;
            return g;
        }
        for m in stored.members {
            if let Some(i) = &m.instance_id {
                g.static_members.insert(i.clone(), m.member_id.clone());
            }
            let seq = g.next_seq;
            g.next_seq += 1;
            g.members.insert(
                m.member_id.clone(),
                ClassicMember {
                    member_id: m.member_id,
                    instance_id: m.instance_id,
                    client_id: m.client_id,
                    client_host: m.client_host,
                    session_timeout_ms: m.session_timeout_ms,
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    protocol_type: m.protocol_type,
                    protocols: m.protocols,
                    assignment: m.assignment,
                    join_waiter: None,
                    sync_waiter: None,
                    last_heartbeat: now,
                    seq,
                },
            );
        }
        g.protocol_type = stored.protocol_type;
        g.protocol_name = stored.protocol_name;
        g.leader = stored.leader;
        g.state = ClassicState::Stable;
        g
    }
}
