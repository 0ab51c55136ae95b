//! The heartbeat stream between every broker and the controller (`proto/heartbeat.proto`).
//!
//! - [`server::HeartbeatServer`] runs on the controller: it accepts one bidirectional stream per
//!   broker, records each status in a [`BrokerRegistry`], publishes the alive set through a
//!   `watch` channel, pushes PING every second and ASSIGNMENT_CHANGED when told to.
//! - [`client::HeartbeatClient`] runs on every broker (the controller included): it dials the
//!   current controller, sends its status every second, surfaces what the controller pushes, and
//!   re-dials with bounded backoff when the stream breaks or another broker wins the Lease.
//!
//! This module holds the decisions, which are pure (statuses and instants in, answers out):
//! which status supersedes which ([`supersedes`]), a broker's [`Health`] ([`health_of`]) and the
//! alive set ([`BrokerRegistry::alive`]).
//!
//! Liveness is judged by *last seen*, not by whether a stream is open: a broker whose stream
//! breaks and is re-dialled within the timeout (a controller restart, a network blip) never
//! leaves the alive set, so it does not cost the cluster a rebalance and a takeover per partition.
//! A broker that is really gone leaves it `alive_timeout` after its last status.

pub mod auth;
pub mod client;
pub mod server;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use kaas_proto::heartbeat::BrokerStatus;

use crate::assignment::{BrokerEntry, Health};
use crate::balancer::{AliveBrokers, BrokerId};

pub use client::{ClientConfig, ControllerEvent, HeartbeatClient, LocalStatus};
pub use server::{HeartbeatServer, ServerConfig};

/// Which statuses the controller may acknowledge: only those whose broker has applied every
/// file that took a partition from it.
///
/// An acknowledgement opens the broker's write fence for every partition the broker serves,
/// and a broker serves what the last file *it applied* says. A broker that was silent (paused,
/// cut off) had its partitions moved by time, not by its confirmation; when it comes back and
/// reports a status saying it still applies an older file, acknowledging that status would let
/// it acknowledge writes for partitions that now have another leader — exactly what a deposed
/// controller resumed from SIGSTOP did. So the controller refuses to acknowledge a broker until
/// its status reports a file at least as new as the newest one that took something from it (and,
/// after an election, one written by this controller at all). Pure.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AckFloor {
    /// Every broker must have applied at least this `(controller_epoch, assignment_version)`;
    /// `None` acknowledges any (tests of the stream alone).
    all: Option<(u64, u64)>,
    /// Brokers that lost partitions: the file that took them.
    per_broker: BTreeMap<BrokerId, (u64, u64)>,
}

impl AckFloor {
    /// No status is acknowledged before the broker applied this controller's first file of
    /// `controller_epoch`.
    pub fn for_epoch(controller_epoch: u64) -> Self {
        Self {
            all: Some((controller_epoch, 1)),
            per_broker: BTreeMap::new(),
        }
    }

    /// Every broker must also have applied `key`: at the start of a term, the newest file the
    /// controller starts from. Files before it (a previous controller's, or this epoch's before
    /// the term restarted) may have moved partitions by time, and this term's per-broker floors
    /// do not know them.
    pub fn raise_all(&mut self, key: (u64, u64)) {
        self.all = Some(self.all.map_or(key, |all| all.max(key)));
    }

    /// `broker` lost a partition in the file `key`: it is acknowledged again once it applied it.
    pub fn raise(&mut self, broker: BrokerId, key: (u64, u64)) {
        let floor = self.per_broker.entry(broker).or_default();
        *floor = (*floor).max(key);
    }

    /// Whether a status from `broker` reporting the file `applied` may be acknowledged.
    pub fn allows(&self, broker: BrokerId, applied: (u64, u64)) -> bool {
        self.all.is_none_or(|all| applied >= all)
            && self.per_broker.get(&broker).is_none_or(|f| applied >= *f)
    }
}

/// The last status received from one broker.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusRecord {
    /// The status as sent.
    pub status: BrokerStatus,
    /// When it was received (the controller's monotonic clock).
    pub last_seen: Instant,
    /// The server-assigned id of the stream it came on; higher ids are newer streams.
    pub stream: u64,
    /// When this controller first heard from the broker process that sent it, healthy and not
    /// draining: a lower sequence than the one recorded is a new process (sequences rise
    /// across a process's reconnects). The balancer gives a broker that came up less than
    /// `--rebalance-hold-ms` ago no partition another broker leads (see `crate::balancer`).
    pub up_since: Instant,
}

/// Whether a status with `(stream, sequence)` supersedes the recorded one.
///
/// A broker may briefly have two streams open (it re-dialled before the server noticed the old
/// one break), and a status delayed on the old stream must not overwrite a newer one — it could
/// undo a drain. A newer stream always wins: it is how a *restarted* broker process, whose
/// sequence starts again from zero, gets recorded at all. On the same stream the sequence must
/// rise.
pub fn supersedes(recorded: Option<&StatusRecord>, stream: u64, sequence: u64) -> bool {
    match recorded {
        None => true,
        Some(r) if stream != r.stream => stream > r.stream,
        Some(r) => sequence > r.status.sequence,
    }
}

/// A broker's health at `now`: `Dead` when not heard from within `timeout` or reporting itself
/// unhealthy, `Draining` when it announced shutdown, `Alive` otherwise.
pub fn health_of(
    status: &BrokerStatus,
    last_seen: Instant,
    now: Instant,
    timeout: Duration,
) -> Health {
    if now.saturating_duration_since(last_seen) > timeout || !status.healthy {
        Health::Dead
    } else if status.draining {
        Health::Draining
    } else {
        Health::Alive
    }
}

/// The rack of a status (`None` for the proto's empty string).
fn rack_of(status: &BrokerStatus) -> Option<String> {
    (!status.rack.is_empty()).then(|| status.rack.clone())
}

/// Every broker heard from since the controller started, with its last status.
///
/// Pure state: callers pass the time in, so the aging rules are tested without sleeping.
#[derive(Debug, Clone, Default)]
pub struct BrokerRegistry {
    brokers: BTreeMap<BrokerId, StatusRecord>,
    pinned: Option<(BrokerId, Option<String>)>,
}

impl BrokerRegistry {
    /// An empty registry. `pinned` is the controller itself (id and rack): the design pins it into
    /// the alive set so an assignment is never computed empty, even before its own heartbeat
    /// client has connected.
    pub fn new(pinned: Option<(BrokerId, Option<String>)>) -> Self {
        Self {
            brokers: BTreeMap::new(),
            pinned,
        }
    }

    /// Records a status received on `stream` at `now`. Returns false (and records nothing) for
    /// a negative broker id or a status superseded by one already recorded.
    pub fn record(&mut self, stream: u64, status: BrokerStatus, now: Instant) -> bool {
        if status.broker_id < 0 {
            return false;
        }
        let id = BrokerId(status.broker_id);
        let recorded = self.brokers.get(&id);
        if !supersedes(recorded, stream, status.sequence) {
            return false;
        }
        let up_since = match recorded {
            Some(r)
                if status.sequence > r.status.sequence
                    && r.status.healthy
                    && !r.status.draining =>
            {
                r.up_since
            }
            _ => now,
        };
        self.brokers.insert(
            id,
            StatusRecord {
                status,
                last_seen: now,
                stream,
                up_since,
            },
        );
        true
    }

    /// The recorded brokers that came up less than `hold` before `now` (see
    /// [`StatusRecord::up_since`]).
    pub fn settling(&self, now: Instant, hold: Duration) -> BTreeSet<BrokerId> {
        self.brokers
            .iter()
            .filter(|(_, r)| now.saturating_duration_since(r.up_since) < hold)
            .map(|(id, _)| *id)
            .collect()
    }

    /// The last status of `id`.
    pub fn get(&self, id: BrokerId) -> Option<&StatusRecord> {
        self.brokers.get(&id)
    }

    /// Every recorded broker.
    pub fn records(&self) -> impl Iterator<Item = (BrokerId, &StatusRecord)> {
        self.brokers.iter().map(|(id, r)| (*id, r))
    }

    /// The alive set at `now` — brokers seen within `timeout` that report healthy and not
    /// draining, plus the pinned controller — with racks, ready for the balancer.
    pub fn alive(&self, now: Instant, timeout: Duration) -> AliveBrokers {
        let mut alive: AliveBrokers = self
            .brokers
            .iter()
            .filter(|(_, r)| health_of(&r.status, r.last_seen, now, timeout) == Health::Alive)
            .map(|(id, r)| (*id, rack_of(&r.status)))
            .collect();
        if let Some((id, rack)) = &self.pinned {
            alive.entry(*id).or_insert_with(|| rack.clone());
        }
        alive
    }

    /// The `brokers` rows for the next `assignment.json`: every broker recorded here with its
    /// health at `now`, plus every row of `previous` not recorded here, kept as `Dead` (dead rows
    /// stay so the coordinator hash keeps its modulus). The pinned controller is `Alive` unless
    /// it reported draining. Sorted by id.
    pub fn broker_rows(
        &self,
        previous: &[BrokerEntry],
        now: Instant,
        timeout: Duration,
    ) -> Vec<BrokerEntry> {
        let mut rows: BTreeMap<BrokerId, BrokerEntry> = previous
            .iter()
            .map(|b| {
                (
                    b.id,
                    BrokerEntry {
                        health: Health::Dead,
                        ..b.clone()
                    },
                )
            })
            .collect();
        for (id, r) in &self.brokers {
            let mut health = health_of(&r.status, r.last_seen, now, timeout);
            if self.pinned.as_ref().is_some_and(|(p, _)| p == id) && health == Health::Dead {
                health = Health::Alive;
            }
            rows.insert(
                *id,
                BrokerEntry {
                    id: *id,
                    host: r.status.advertised_host.clone(),
                    port: u16::try_from(r.status.advertised_port).unwrap_or(0),
                    rack: rack_of(&r.status),
                    health,
                },
            );
        }
        rows.into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(id: i32, seq: u64, healthy: bool, draining: bool) -> BrokerStatus {
        BrokerStatus {
            broker_id: id,
            advertised_host: format!("b{id}"),
            advertised_port: 9092,
            rack: if id % 2 == 0 {
                "a".into()
            } else {
                String::new()
            },
            healthy,
            draining,
            sequence: seq,
            ..Default::default()
        }
    }

    // A broker that lost partitions by time is acknowledged again only once it applied the
    // file that moved them; after an election, only once it applied a file of the new epoch.
    #[test]
    fn ack_floor_waits_for_the_file_that_took_partitions() {
        let mut floor = AckFloor::for_epoch(8);
        assert!(
            !floor.allows(BrokerId(1), (7, 40)),
            "a file of the old epoch"
        );
        assert!(floor.allows(BrokerId(1), (8, 1)));
        floor.raise(BrokerId(1), (8, 5));
        floor.raise(BrokerId(1), (8, 3));
        assert!(!floor.allows(BrokerId(1), (8, 4)));
        assert!(floor.allows(BrokerId(1), (8, 5)));
        assert!(
            floor.allows(BrokerId(2), (8, 2)),
            "other brokers are not held back"
        );
        assert!(AckFloor::default().allows(BrokerId(1), (0, 0)));
        // A term restarted within the epoch starts from the newest file it knows.
        floor.raise_all((8, 6));
        assert!(!floor.allows(BrokerId(2), (8, 5)));
        assert!(floor.allows(BrokerId(2), (8, 6)));
    }

    // Only healthy, non-draining brokers seen within the timeout are alive; the pin always is.
    #[test]
    fn alive_set_from_statuses_and_time() {
        let t0 = Instant::now();
        let timeout = Duration::from_secs(5);
        let mut reg = BrokerRegistry::new(Some((BrokerId(9), None)));
        assert!(reg.record(1, status(0, 1, true, false), t0));
        assert!(reg.record(2, status(1, 1, true, true), t0));
        assert!(reg.record(3, status(2, 1, false, false), t0));
        assert!(reg.record(4, status(3, 1, true, false), t0 + Duration::from_secs(4)));
        let alive = reg.alive(t0 + Duration::from_secs(5), timeout);
        let ids: Vec<i32> = alive.keys().map(|b| b.0).collect();
        assert_eq!(ids, vec![0, 3, 9]);
        assert_eq!(alive[&BrokerId(0)], Some("a".to_string()));
        let later = reg.alive(t0 + Duration::from_millis(5_001), timeout);
        assert_eq!(later.keys().map(|b| b.0).collect::<Vec<_>>(), vec![3, 9]);
    }

    // A broker settles `hold` after this controller first heard from its process: a
    // reconnect (new stream, rising sequence) keeps the clock, a restart (sequence from the
    // start again) or a recovery from draining or unhealthy restarts it.
    #[test]
    fn settling_counts_from_the_process_coming_up() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let hold = Duration::from_secs(30);
        let mut reg = BrokerRegistry::new(None);
        assert!(reg.record(1, status(0, 1, true, false), t0));
        assert!(reg.record(1, status(0, 2, true, false), s(20)));
        assert!(
            reg.record(2, status(0, 3, true, false), s(25)),
            "a reconnect"
        );
        assert_eq!(reg.settling(s(29), hold), BTreeSet::from([BrokerId(0)]));
        assert!(reg.settling(s(30), hold).is_empty());
        assert!(reg.record(3, status(0, 1, true, false), s(40)), "a restart");
        assert_eq!(reg.settling(s(69), hold), BTreeSet::from([BrokerId(0)]));
        assert!(reg.settling(s(70), hold).is_empty());
        assert!(reg.record(3, status(0, 2, false, false), s(71)));
        assert!(
            reg.record(3, status(0, 3, true, false), s(72)),
            "healthy again"
        );
        assert_eq!(reg.get(BrokerId(0)).map(|r| r.up_since), Some(s(72)));
        assert!(reg.settling(s(72), Duration::ZERO).is_empty(), "no hold");
    }

    // A late status from an old stream never overwrites a newer one; a new stream always wins.
    #[test]
    fn newer_stream_and_sequence_win() {
        let t0 = Instant::now();
        let mut reg = BrokerRegistry::new(None);
        assert!(reg.record(5, status(0, 10, true, true), t0));
        assert!(!reg.record(4, status(0, 11, true, false), t0));
        assert!(!reg.record(5, status(0, 10, true, false), t0));
        assert!(reg.record(5, status(0, 11, true, false), t0));
        assert!(reg.record(6, status(0, 0, true, false), t0));
        assert!(!reg.record(7, status(-1, 0, true, false), t0));
        assert_eq!(reg.get(BrokerId(0)).unwrap().stream, 6);
    }

    // Rows keep dead brokers from the previous file and mark silent ones dead.
    #[test]
    fn broker_rows_keep_dead_rows() {
        let t0 = Instant::now();
        let timeout = Duration::from_secs(5);
        let mut reg = BrokerRegistry::new(None);
        reg.record(1, status(0, 1, true, false), t0);
        reg.record(2, status(1, 1, true, true), t0);
        let previous = vec![BrokerEntry {
            id: BrokerId(7),
            host: "old".into(),
            port: 1,
            rack: None,
            health: Health::Alive,
        }];
        let rows = reg.broker_rows(&previous, t0, timeout);
        let got: Vec<(i32, Health)> = rows.iter().map(|r| (r.id.0, r.health)).collect();
        assert_eq!(
            got,
            vec![(0, Health::Alive), (1, Health::Draining), (7, Health::Dead)]
        );
        let rows = reg.broker_rows(&[], t0 + Duration::from_secs(6), timeout);
        assert!(rows.iter().all(|r| r.health == Health::Dead));
    }
}
