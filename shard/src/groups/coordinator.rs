//! Which broker coordinates a group (or a transactional id): one pure decision.
//!
//! The SPEC's rule: FNV-1a-32 of the key modulo the full registered broker list, dead rows
//! included, so that losing one broker moves only the groups it coordinated; if that broker is
//! not alive, a deterministic fallback to an alive broker. In single-node mode the registered
//! list is this broker alone, so the answer is always this broker. Cluster mode will hand the
//! registered list from `assignment.json` to the same function.

use super::fnv1a32;

/// A broker as the rule sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredBroker {
    pub id: i32,
    pub alive: bool,
}

/// The coordinator of `key` among `brokers` (the registered list in a stable order). `None`
/// only when no broker is alive.
pub fn coordinator_for(key: &str, brokers: &[RegisteredBroker]) -> Option<i32> {
    if brokers.is_empty() {
        return None;
    }
    let h = fnv1a32(key.as_bytes()) as usize;
    let first = h % brokers.len();
    // The hashed row when it is alive; otherwise walk forward from it, so every broker that
    // survives picks the same fallback.
    (0..brokers.len())
        .map(|i| &brokers[(first + i) % brokers.len()])
        .find(|b| b.alive)
        .map(|b| b.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brokers(n: i32) -> Vec<RegisteredBroker> {
        (0..n)
            .map(|id| RegisteredBroker { id, alive: true })
            .collect()
    }

    // One broker coordinates everything; nothing alive means no coordinator.
    #[test]
    fn single_node() {
        assert_eq!(coordinator_for("g", &brokers(1)), Some(0));
        assert_eq!(coordinator_for("", &brokers(1)), Some(0));
        assert_eq!(coordinator_for("g", &[]), None);
        let dead = vec![RegisteredBroker {
            id: 3,
            alive: false,
        }];
        assert_eq!(coordinator_for("g", &dead), None);
    }

    // Losing a broker moves only the keys it coordinated.
    #[test]
    fn loss_moves_only_its_keys() {
        let all = brokers(5);
        let mut one_dead = all.clone();
        one_dead[2].alive = false;
        for i in 0..2000 {
            let k = format!("group-{i}");
            let before = coordinator_for(&k, &all).unwrap();
            let after = coordinator_for(&k, &one_dead).unwrap();
            if before != 2 {
                assert_eq!(before, after, "{k}");
            } else {
                assert_ne!(after, 2);
            }
        }
    }
}
