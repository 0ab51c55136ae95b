//! Lease election: simulated candidates sharing one in-memory compare-and-swap store, each with
//! its own monotonic clock, driven by a simulated global clock with pauses and write delays.

use std::collections::BTreeMap;

use kaas_control::election::{
    ElectionAction, ElectionConfig, ElectionConfigError, ElectionState, LeaseRecord, WriteError,
};
use proptest::prelude::*;

const RETRY_MS: u64 = 2_000;

/// The Lease store: compare-and-swap on `resource_version`, with a history of every write.
struct Store {
    record: LeaseRecord,
    version: u64,
    writable: bool,
    /// (global ms, holder, lease_transitions) after each successful write.
    history: Vec<(u64, Option<String>, u64)>,
}

impl Store {
    fn new() -> Self {
        Self {
            record: LeaseRecord::default(),
            version: 0,
            writable: true,
            history: Vec::new(),
        }
    }

    fn cas(&mut self, now: u64, new: LeaseRecord) -> Result<LeaseRecord, WriteError> {
        if !self.writable {
            return Err(WriteError::Unavailable);
        }
        if new.resource_version != self.record.resource_version {
            return Err(WriteError::Conflict);
        }
        self.version += 1;
        let stored = LeaseRecord {
            resource_version: self.version.to_string(),
            ..new
        };
        self.record = stored.clone();
        self.history
            .push((now, stored.holder.clone(), stored.lease_transitions));
        Ok(stored)
    }
}

/// The non-`Wait` actions a candidate took, for assertions about ordering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Did {
    Acquire,
    Renew,
    StepDown,
}

struct Node {
    state: ElectionState,
    /// This candidate's monotonic clock reads global time plus this.
    clock_offset_ms: u64,
    /// Global `[start, end)` windows during which the process is frozen.
    pauses: Vec<(u64, u64)>,
    /// (global ms, action) for every action other than `Wait`.
    log: Vec<(u64, Did)>,
}

enum Event {
    Wake(usize),
    Apply(usize, LeaseRecord),
    Reply(usize, Result<LeaseRecord, WriteError>),
}

struct Sim {
    now: u64,
    seq: u64,
    queue: BTreeMap<(u64, u64), Event>,
    store: Store,
    nodes: Vec<Node>,
    rng: u64,
    /// Each write takes up to this long to reach the store, and its reply as long again.
    max_delay_ms: u64,
    /// (global ms, candidate, epoch) each time a candidate starts leading.
    stints: Vec<(u64, usize, u64)>,
}

fn name(i: usize) -> String {
    format!("kaas-{i}")
}

impl Sim {
    /// Candidates with the given clock offsets, first stepping at the given global phases.
    fn new(offsets: &[u64], phases: &[u64]) -> Self {
        let mut sim = Sim {
            now: 0,
            seq: 0,
            queue: BTreeMap::new(),
            store: Store::new(),
            nodes: Vec::new(),
            rng: 0x9e37_79b9_7f4a_7c15,
            max_delay_ms: 0,
            stints: Vec::new(),
        };
        for (i, (&offset, &phase)) in offsets.iter().zip(phases).enumerate() {
            sim.nodes.push(Node {
                state: ElectionState::new(name(i), ElectionConfig::default()).expect("config"),
                clock_offset_ms: offset,
                pauses: Vec::new(),
                log: Vec::new(),
            });
            sim.schedule(phase, Event::Wake(i));
        }
        sim
    }

    fn schedule(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.queue.insert((at, self.seq), event);
    }

    fn local(&self, i: usize) -> u64 {
        self.now + self.nodes[i].clock_offset_ms
    }

    fn delay(&mut self) -> u64 {
        if self.max_delay_ms == 0 {
            return 0;
        }
        // xorshift64: deterministic per seed.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng % (self.max_delay_ms + 1)
    }

    fn paused_until(&self, i: usize) -> Option<u64> {
        self.nodes[i]
            .pauses
            .iter()
            .find(|&&(start, end)| start <= self.now && self.now < end)
            .map(|&(_, end)| end)
    }

    fn run_until(&mut self, end: u64) {
        while let Some((&(at, seq), _)) = self.queue.first_key_value() {
            if at > end {
                break;
            }
            let event = self.queue.remove(&(at, seq)).expect("queued");
            self.now = at;
            self.handle(event);
            self.check();
        }
        self.now = end;
        self.check();
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Wake(i) => {
                if let Some(end) = self.paused_until(i) {
                    self.schedule(end, Event::Wake(i));
                    return;
                }
                let observed = self.store.record.clone();
                let local = self.local(i);
                let action = self.nodes[i].state.step(&observed, local);
                let now = self.now;
                match action {
                    ElectionAction::Acquire { new_record } => {
                        self.nodes[i].log.push((now, Did::Acquire));
                        let at = now + self.delay();
                        self.schedule(at, Event::Apply(i, new_record));
                    }
                    ElectionAction::Renew { new_record } => {
                        self.nodes[i].log.push((now, Did::Renew));
                        let at = now + self.delay();
                        self.schedule(at, Event::Apply(i, new_record));
                    }
                    ElectionAction::StepDown => self.nodes[i].log.push((now, Did::StepDown)),
                    ElectionAction::Wait => {}
                }
                self.schedule(now + RETRY_MS, Event::Wake(i));
            }
            Event::Apply(i, record) => {
                let result = self.store.cas(self.now, record);
                let at = self.now + self.delay();
                self.schedule(at, Event::Reply(i, result));
            }
            Event::Reply(i, result) => {
                if let Some(end) = self.paused_until(i) {
                    self.schedule(end, Event::Reply(i, result));
                    return;
                }
                let local = self.local(i);
                let before = self.nodes[i].state.is_leader(local);
                self.nodes[i].state.on_write_result(result, local);
                if !before && self.nodes[i].state.is_leader(local) {
                    let epoch = self.nodes[i].state.epoch().expect("leading");
                    self.stints.push((self.now, i, epoch));
                }
            }
        }
    }

    /// The fencing invariant, checked after every event: at most one candidate may act as
    /// controller, and it is the store's holder with the store's epoch.
    fn check(&self) {
        let leaders = self.leaders();
        assert!(
            leaders.len() <= 1,
            "two leaders at {}: {leaders:?}",
            self.now
        );
        for &i in &leaders {
            assert_eq!(self.store.record.holder, Some(name(i)), "at {}", self.now);
            assert_eq!(
                self.nodes[i].state.epoch(),
                Some(self.store.record.lease_transitions),
                "at {}",
                self.now
            );
        }
    }

    fn leaders(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].state.is_leader(self.local(i)))
            .collect()
    }

    fn leader(&self) -> Option<usize> {
        self.leaders().first().copied()
    }

    /// The epoch rules over the whole store history: `lease_transitions` rises by exactly one
    /// when a new holder takes the Lease, and otherwise (renewal, release, taking back our own
    /// record) stays the same — so it never decreases.
    fn check_epoch_history(&self) {
        let mut previous: (Option<String>, u64) = (None, 0);
        for (at, holder, transitions) in &self.store.history {
            let takeover = holder.is_some() && *holder != previous.0;
            let expected = previous.1 + u64::from(takeover);
            assert_eq!(*transitions, expected, "write at {at} by {holder:?}");
            previous = (holder.clone(), *transitions);
        }
        for pair in self.stints.windows(2) {
            let ((_, a, ea), (_, b, eb)) = (pair[0], pair[1]);
            assert!(eb >= ea, "epoch went back: {pair:?}");
            if a != b {
                assert!(eb > ea, "new leader without a new epoch: {pair:?}");
            }
        }
    }

    /// Global time of `holder`'s last successful write at or before `at`.
    fn last_write_by(&self, holder: usize, at: u64) -> u64 {
        self.store
            .history
            .iter()
            .filter(|(t, h, _)| *t <= at && *h == Some(name(holder)))
            .map(|(t, _, _)| *t)
            .max()
            .expect("holder wrote")
    }
}

/// When [`paused_holder_run`] freezes the leader (for 25 s, from just after this instant).
const FREEZE_AT: u64 = 30_000;

/// Runs three candidates, freezes the leader just after [`FREEZE_AT`] for 25 s, and returns the
/// simulation at 120 s together with the frozen candidate.
fn paused_holder_run(offsets: &[u64]) -> (Sim, usize) {
    let mut sim = Sim::new(offsets, &[0, 700, 1_400]);
    sim.run_until(FREEZE_AT);
    let frozen = sim.leader().expect("a leader by 30 s");
    sim.nodes[frozen]
        .pauses
        .push((FREEZE_AT + 1, FREEZE_AT + 25_000));
    sim.run_until(120_000);
    (sim, frozen)
}

// Three candidates elect exactly one leader, with epoch 1, and it keeps the Lease by renewing.
#[test]
fn one_leader_emerges_and_keeps_the_lease() {
    let mut sim = Sim::new(&[0, 0, 0], &[0, 700, 1_400]);
    sim.run_until(300_000);
    assert_eq!(sim.stints.len(), 1, "{:?}", sim.stints);
    let (_, leader, epoch) = sim.stints[0];
    assert_eq!(epoch, 1);
    assert_eq!(sim.leader(), Some(leader));
    assert!(sim.store.history.len() > 100, "renewals every 2 s");
    sim.check_epoch_history();
}

// A frozen holder is replaced only a full lease duration after its last write, and when it
// resumes its first action is to step down; it never writes again as the old holder.
#[test]
fn paused_holder_is_replaced_and_steps_down_on_resume() {
    let (sim, frozen) = paused_holder_run(&[0, 0, 0]);
    let last_write = sim.last_write_by(frozen, FREEZE_AT);
    let (took_over_at, successor, epoch) = *sim.stints.last().expect("a successor");
    assert_ne!(successor, frozen);
    assert_eq!(epoch, 2);
    assert!(
        took_over_at >= last_write + 15_000,
        "{took_over_at} vs {last_write}"
    );
    assert!(
        took_over_at <= last_write + 15_000 + 2 * RETRY_MS,
        "{took_over_at}"
    );
    let after_resume: Vec<Did> = sim.nodes[frozen]
        .log
        .iter()
        .filter(|(t, _)| *t > FREEZE_AT)
        .map(|(_, d)| *d)
        .collect();
    assert_eq!(
        after_resume.first(),
        Some(&Did::StepDown),
        "{after_resume:?}"
    );
    assert!(!after_resume.contains(&Did::Renew));
    assert!(sim
        .store
        .history
        .iter()
        .all(|(t, h, _)| *t <= FREEZE_AT || *h != Some(name(frozen))));
    assert_eq!(sim.leader(), Some(successor));
    sim.check_epoch_history();
}

// Clock offsets between candidates change nothing: the same run with wildly different monotonic
// clocks produces the same writes at the same global times.
#[test]
fn clock_skew_between_candidates_does_not_matter() {
    let (aligned, frozen_a) = paused_holder_run(&[0, 0, 0]);
    let (skewed, frozen_b) = paused_holder_run(&[1_000_000_000_000, 0, 7_000_000_013]);
    assert_eq!(frozen_a, frozen_b);
    assert_eq!(aligned.store.history, skewed.store.history);
    assert_eq!(aligned.stints, skewed.stints);
}

// Releasing writes holder None with the same transitions; the next holder gets epoch + 1 and
// the released candidate never takes the Lease again.
#[test]
fn release_keeps_transitions_and_the_next_holder_gets_a_higher_epoch() {
    let mut sim = Sim::new(&[0, 0, 0], &[0, 700, 1_400]);
    sim.run_until(20_000);
    let leader = sim.leader().expect("leader");
    let released = sim.nodes[leader].state.release().expect("we lead");
    assert_eq!(released.holder, None);
    assert_eq!(released.lease_transitions, 1);
    assert!(!sim.nodes[leader].state.is_leader(sim.local(leader)));
    let stored = sim.store.cas(sim.now, released);
    assert_eq!(stored.as_ref().map(|r| r.lease_transitions), Ok(1));
    let local = sim.local(leader);
    sim.nodes[leader].state.on_write_result(stored, local);
    sim.run_until(60_000);
    let (_, next, epoch) = *sim.stints.last().expect("next leader");
    assert_ne!(next, leader);
    assert_eq!(epoch, 2);
    assert!(sim.stints.iter().filter(|s| s.1 == leader).count() == 1);
    sim.check_epoch_history();
}

// A holder that cannot write steps down at its renew deadline, before anyone else could take
// over; when the store comes back the Lease is led again and the epoch rules hold.
#[test]
fn holder_that_cannot_renew_steps_down_at_the_deadline() {
    let mut sim = Sim::new(&[0, 0, 0], &[0, 700, 1_400]);
    sim.run_until(20_000);
    let leader = sim.leader().expect("leader");
    let last_write = sim.last_write_by(leader, 20_000);
    let until = sim.nodes[leader].state.leader_until_ms().expect("leading");
    assert_eq!(
        until,
        last_write + sim.nodes[leader].clock_offset_ms + 10_000
    );
    sim.store.writable = false;
    sim.run_until(last_write + 9_999);
    assert_eq!(sim.leader(), Some(leader));
    sim.run_until(last_write + 10_000);
    assert_eq!(sim.leader(), None, "deadline reached");
    sim.run_until(50_000);
    let step_down = sim.nodes[leader]
        .log
        .iter()
        .find(|(t, d)| *t > 20_000 && *d == Did::StepDown)
        .expect("stepped down");
    assert!(step_down.0 <= last_write + 10_000 + RETRY_MS);
    sim.store.writable = true;
    sim.run_until(90_000);
    assert!(sim.leader().is_some());
    sim.check_epoch_history();
}

// Takeover sets the holder and transitions + 1 in one write; renewal keeps transitions and the
// version it was based on; the epoch is that of the record we hold.
#[test]
fn takeover_adds_one_and_renewal_keeps_transitions() {
    let mut c = ElectionState::new("a", ElectionConfig::default()).expect("config");
    let free = LeaseRecord {
        lease_transitions: 4,
        resource_version: "17".into(),
        ..LeaseRecord::default()
    };
    let ElectionAction::Acquire { new_record } = c.step(&free, 1_000) else {
        panic!("free lease is taken");
    };
    assert_eq!(new_record.holder.as_deref(), Some("a"));
    assert_eq!(new_record.lease_transitions, 5);
    assert_eq!(new_record.resource_version, "17");
    assert_eq!(new_record.lease_duration_ms, 15_000);
    let stored = LeaseRecord {
        resource_version: "18".into(),
        ..new_record
    };
    c.on_write_result(Ok(stored.clone()), 1_000);
    assert_eq!(c.epoch(), Some(5));
    assert!(c.is_leader(1_000));
    assert_eq!(c.step(&stored, 2_999), ElectionAction::Wait);
    let ElectionAction::Renew { new_record } = c.step(&stored, 3_000) else {
        panic!("renew due after the retry period");
    };
    assert_eq!(new_record.lease_transitions, 5);
    assert_eq!(new_record.resource_version, "18");
    assert_ne!(new_record.renew_time, stored.renew_time);
}

// Renewals that keep failing end leadership exactly at the renew deadline measured from the
// last successful renewal's send time.
#[test]
fn failed_renewals_step_down_at_the_deadline() {
    let mut c = ElectionState::new("a", ElectionConfig::default()).expect("config");
    let ElectionAction::Acquire { new_record } = c.step(&LeaseRecord::default(), 0) else {
        panic!("free lease is taken");
    };
    let held = LeaseRecord {
        resource_version: "1".into(),
        ..new_record
    };
    c.on_write_result(Ok(held.clone()), 0);
    for now in [2_000, 4_000, 6_000, 8_000] {
        assert!(matches!(c.step(&held, now), ElectionAction::Renew { .. }));
        c.on_write_result(Err(WriteError::Unavailable), now);
    }
    assert!(c.is_leader(9_999));
    assert!(!c.is_leader(10_000));
    assert_eq!(c.step(&held, 10_000), ElectionAction::StepDown);
    assert_eq!(c.epoch(), None);
}

// Expiry is counted on the observer's own clock from when it first saw the record; the stamps
// inside the record are never compared with a clock, and any change restarts the countdown.
#[test]
fn expiry_counts_from_first_observation_not_from_stamps() {
    let mut c = ElectionState::new("b", ElectionConfig::default()).expect("config");
    let mut held = LeaseRecord {
        holder: Some("a".into()),
        renew_time: Some("2001-01-01T00:00:00Z".into()), // ancient by anyone's wall clock
        lease_duration_ms: 15_000,
        lease_transitions: 3,
        resource_version: "9".into(),
        ..LeaseRecord::default()
    };
    assert_eq!(c.step(&held, 100_000), ElectionAction::Wait);
    assert_eq!(c.step(&held, 114_999), ElectionAction::Wait);
    held.renew_time = Some("2001-01-01T00:00:02Z".into());
    held.resource_version = "10".into();
    assert_eq!(c.step(&held, 114_999), ElectionAction::Wait);
    assert_eq!(c.step(&held, 129_998), ElectionAction::Wait);
    let ElectionAction::Acquire { new_record } = c.step(&held, 129_999) else {
        panic!("expired 15 s after the last change");
    };
    assert_eq!(new_record.lease_transitions, 4);
    assert_eq!(new_record.resource_version, "10");
    // A conflict leaves us a candidate; the next step re-observes.
    c.on_write_result(Err(WriteError::Conflict), 130_000);
    assert_eq!(c.epoch(), None);
}

// A record that names us (restart, or after a step-down) is taken back without a new epoch.
#[test]
fn taking_back_our_own_record_keeps_the_epoch() {
    let mut c = ElectionState::new("a", ElectionConfig::default()).expect("config");
    let ours = LeaseRecord {
        holder: Some("a".into()),
        lease_duration_ms: 15_000,
        lease_transitions: 7,
        resource_version: "3".into(),
        ..LeaseRecord::default()
    };
    let ElectionAction::Acquire { new_record } = c.step(&ours, 5) else {
        panic!("our own record is taken back at once");
    };
    assert_eq!(new_record.lease_transitions, 7);
}

// Only a Lease taken over because it ran out names the holder it replaced: that holder stopped
// acting an election gap before the takeover, which the handover may count. A released Lease
// (SIGTERM) names none, since its holder may have acknowledged itself an instant before the
// release; nor does one that was never held or already named us. Renewals keep the answer.
#[test]
fn only_an_expired_lease_names_the_holder_it_replaced() {
    let take = |observed: &LeaseRecord, now: u64| {
        let mut c = ElectionState::new("b", ElectionConfig::default()).expect("config");
        assert_eq!(c.expired_holder(), None, "not leading");
        if now > 0 {
            // First sight starts the expiry countdown.
            assert_eq!(c.step(observed, 0), ElectionAction::Wait);
        }
        let ElectionAction::Acquire { new_record } = c.step(observed, now) else {
            panic!("{observed:?} is taken at {now}");
        };
        let stored = LeaseRecord {
            resource_version: "2".into(),
            ..new_record
        };
        c.on_write_result(Ok(stored.clone()), now);
        assert!(c.is_leader(now));
        (c, stored)
    };
    let held_by = |holder: &str| LeaseRecord {
        holder: Some(holder.into()),
        lease_duration_ms: 15_000,
        lease_transitions: 3,
        resource_version: "1".into(),
        ..LeaseRecord::default()
    };
    let (mut c, stored) = take(&held_by("a"), 15_000);
    assert_eq!(c.expired_holder(), Some("a"));
    assert!(matches!(
        c.step(&stored, 17_000),
        ElectionAction::Renew { .. }
    ));
    c.on_write_result(Ok(stored.clone()), 17_000);
    assert_eq!(c.expired_holder(), Some("a"), "kept across renewals");
    let released = LeaseRecord {
        holder: None,
        ..held_by("a")
    };
    assert_eq!(take(&released, 0).0.expired_holder(), None);
    assert_eq!(take(&LeaseRecord::default(), 0).0.expired_holder(), None);
    assert_eq!(take(&held_by("b"), 0).0.expired_holder(), None);
}

// The design's timings are the defaults, and orderings that break fencing are refused.
#[test]
fn config_defaults_and_validation() {
    let d = ElectionConfig::default();
    assert_eq!(
        (d.lease_duration_ms, d.renew_deadline_ms, d.retry_period_ms),
        (15_000, 10_000, 2_000)
    );
    assert_eq!(d.validate(), Ok(()));
    let overlapping = ElectionConfig {
        renew_deadline_ms: 15_000,
        ..d
    };
    assert!(matches!(
        ElectionState::new("a", overlapping).map(|_| ()),
        Err(ElectionConfigError::DeadlineNotBeforeExpiry { .. })
    ));
    let slow_retry = ElectionConfig {
        retry_period_ms: 10_000,
        ..d
    };
    assert!(matches!(
        slow_retry.validate(),
        Err(ElectionConfigError::RetryNotBeforeDeadline { .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    // Under random freezes, write delays, store outages and clock offsets, no two candidates
    // ever act as controller at once, the leader is always the store's holder at the store's
    // epoch, epochs follow the takeover rule, and once the faults stop a leader emerges.
    #[test]
    fn faults_never_make_two_leaders(
        offsets in prop::collection::vec(0u64..1_000_000_000_000, 2..=3),
        phases in prop::collection::vec(0u64..RETRY_MS, 3),
        pauses in prop::collection::vec((0usize..3, 0u64..150_000, 1u64..40_000), 0..6),
        outage in prop::option::of((0u64..150_000, 1u64..30_000)),
        max_delay_ms in 0u64..=800,
        seed in 1u64..u64::MAX,
    ) {
        let mut sim = Sim::new(&offsets, &phases[..offsets.len()]);
        sim.max_delay_ms = max_delay_ms;
        sim.rng = seed;
        let mut quiet_from = 0;
        for (i, start, len) in pauses {
            let i = i % offsets.len();
            sim.nodes[i].pauses.push((start, start + len));
            quiet_from = quiet_from.max(start + len);
        }
        if let Some((start, len)) = outage {
            sim.run_until(start);
            sim.store.writable = false;
            sim.run_until(start + len);
            sim.store.writable = true;
            quiet_from = quiet_from.max(start + len);
        }
        sim.run_until(quiet_from + 60_000);
        sim.check_epoch_history();
        prop_assert_eq!(sim.leaders().len(), 1);
    }
}
