//! Controller election on the `kaas-controller` Lease, as a pure state machine run by the
//! control thread.
//!
//! [`ElectionState::step`] takes the Lease record the backend just read and the caller's local
//! monotonic time, and answers with an [`ElectionAction`]: write this record (to acquire or to
//! renew), stop acting as controller, or wait. The backend (`kube` or `file`) performs the write as
//! a compare-and-swap conditional on the record's `resource_version` and reports the outcome
//! through [`ElectionState::on_write_result`]. Nothing here reads a clock or does IO, so the
//! protocol is tested with simulated candidates, clocks and stores.
//!
//! # The protocol
//!
//! - A candidate **takes over** when the record names no holder (never written, or released), or
//!   when the record has not changed for a full lease duration *by the candidate's own monotonic
//!   clock*, counted from the moment it first saw the current record. Wall-clock stamps in the
//!   record are never compared with anything: two machines' clocks may disagree by minutes
//!   without effect. A takeover sets the holder and `lease_transitions + 1` in the same write.
//! - The holder **renews** every retry period (2 s), keeping `lease_transitions`.
//! - A record that already names us (a restart, or resuming after a step-down when nobody took
//!   over meanwhile) is taken back *without* raising `lease_transitions`: the holder did not
//!   change, and any other candidate's takeover in between would have replaced the holder.
//! - A holder that **releases** writes `holder: None` and keeps `lease_transitions`, so the next
//!   holder's takeover raises it past every epoch already used: the epoch never rewinds.
//! - [`ElectionState::epoch`] is `lease_transitions` of the record we hold; it is the controller
//!   epoch written into `assignment.json`.
//!
//! # Fencing: why two controllers never act at once
//!
//! Let holder H's last successful write be sent at instant `s` on H's monotonic clock. H stops
//! acting as controller at `s + renew_deadline` (10 s) unless a later write succeeds:
//! [`ElectionState::is_leader`] turns false then, and the next step returns
//! [`ElectionAction::StepDown`]. The clock starts at the *send*, not at the reply, which can only
//! make H stop earlier.
//!
//! A candidate C replaces H only with a compare-and-swap conditional on the version C observed,
//! so it succeeds only if that version — H's last write — is still current. C first saw that
//! version after it was applied, hence after H sent it, and C writes only when its own monotonic
//! clock shows `lease_duration` (15 s) since then. Both intervals start from their own readings
//! and are measured by clocks that tick at (very nearly) the same rate; the offset between the
//! two machines' clocks never enters. So H has stopped at least `15 − 10 = 5` seconds before C
//! can start: that margin absorbs clock-rate drift, scheduling delay and the retry period.
//!
//! The contract on the driver: gate every controller action on [`ElectionState::is_leader`] with
//! a fresh `now_ms` (or on [`ElectionState::leader_until_ms`]), step at least every retry period,
//! and keep at most one write outstanding. A process frozen in the middle of an action (GC pause,
//! SIGSTOP) can still finish that one write after it resumes; that is why `assignment.json`
//! carries the epoch and followers refuse a stale one — the second fence, outside this module.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Election timings (docs/DESIGN.md: duration 15 s, renew deadline 10 s, retry 2 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElectionConfig {
    /// How long a record must stay unchanged, by an observer's monotonic clock, before the
    /// observer may take the Lease over. Default 15 000 ms; must exceed `renew_deadline_ms`.
    pub lease_duration_ms: u64,
    /// How long the holder keeps acting as controller after its last successful renewal was
    /// sent. Default 10 000 ms; must be below `lease_duration_ms` — the gap is the fencing margin.
    pub renew_deadline_ms: u64,
    /// How often the holder renews and candidates retry. Default 2 000 ms; must be positive and
    /// below `renew_deadline_ms`, so several renewals fit in one deadline.
    pub retry_period_ms: u64,
}

impl Default for ElectionConfig {
    fn default() -> Self {
        Self {
            lease_duration_ms: 15_000,
            renew_deadline_ms: 10_000,
            retry_period_ms: 2_000,
        }
    }
}

impl ElectionConfig {
    /// Checks the ordering the fencing argument depends on:
    /// `0 < retry_period < renew_deadline < lease_duration`.
    pub fn validate(&self) -> Result<(), ElectionConfigError> {
        if self.renew_deadline_ms >= self.lease_duration_ms {
            return Err(ElectionConfigError::DeadlineNotBeforeExpiry {
                renew_deadline_ms: self.renew_deadline_ms,
                lease_duration_ms: self.lease_duration_ms,
            });
        }
        if self.retry_period_ms == 0 || self.retry_period_ms >= self.renew_deadline_ms {
            return Err(ElectionConfigError::RetryNotBeforeDeadline {
                retry_period_ms: self.retry_period_ms,
                renew_deadline_ms: self.renew_deadline_ms,
            });
        }
        Ok(())
    }
}

/// An [`ElectionConfig`] that would break the fencing argument.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ElectionConfigError {
    /// A holder could still be acting when another candidate takes over.
    #[error(
        "renew deadline ({renew_deadline_ms} ms) must be shorter than the lease duration \
         ({lease_duration_ms} ms), or a stalled controller could overlap its successor"
    )]
    DeadlineNotBeforeExpiry {
        renew_deadline_ms: u64,
        lease_duration_ms: u64,
    },
    /// The holder would not get to renew before its own deadline.
    #[error(
        "retry period ({retry_period_ms} ms) must be positive and shorter than the renew \
         deadline ({renew_deadline_ms} ms)"
    )]
    RetryNotBeforeDeadline {
        retry_period_ms: u64,
        renew_deadline_ms: u64,
    },
}

/// The Lease as stored by a backend: the Kubernetes Lease's fields, or the lease file's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// The holder's identity, or `None` when the Lease is free (never held, or released).
    pub holder: Option<String>,
    /// Opaque stamp of the last takeover. Candidates compare records only for change, never
    /// against a clock; the state machine writes its own monotonic milliseconds here, and a
    /// backend whose field is a timestamp (the kube Lease's `acquireTime`) may write its own
    /// wall-clock time instead.
    pub acquire_time: Option<String>,
    /// Opaque stamp of the last renewal; same rules as `acquire_time`. A change in it (or in
    /// any other field) is what restarts an observer's expiry countdown.
    pub renew_time: Option<String>,
    /// How long observers must see the record unchanged before taking over, as promised by the
    /// holder that wrote it.
    pub lease_duration_ms: u64,
    /// Number of changes of holder so far: the cluster epoch. Rises by one on each takeover,
    /// stays on renewal and on release.
    pub lease_transitions: u64,
    /// The store's version token for compare-and-swap (the kube `resourceVersion`). A record
    /// returned in an action carries the version it was based on: the backend writes it only if
    /// the stored version still equals it, then reports the stored record with its new version.
    pub resource_version: String,
}

/// What the caller should do after a [`ElectionState::step`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ElectionAction {
    /// Write `new_record` (compare-and-swap on its `resource_version`) to take the Lease. On
    /// success we lead with epoch `new_record.lease_transitions`.
    Acquire { new_record: LeaseRecord },
    /// Write `new_record` (compare-and-swap) to renew the Lease we hold.
    Renew { new_record: LeaseRecord },
    /// Stop acting as controller now: our renew deadline passed, or the record shows we were
    /// replaced. We remain a candidate.
    StepDown,
    /// Nothing to do until the next step.
    Wait,
}

/// Why a Lease write did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum WriteError {
    /// The stored version differs from the one the write was based on (HTTP 409, or the lease
    /// file changed): someone else wrote first. Re-observe and step again.
    #[error("lease changed since it was read (compare-and-swap conflict)")]
    Conflict,
    /// The store could not be reached, or the write's outcome is unknown (timeout). Treated as
    /// not written: the renew deadline keeps running from the last write known to have succeeded.
    #[error("lease store unavailable or the write's outcome is unknown")]
    Unavailable,
}

/// One candidate's view of the election. See the module docs for the protocol.
#[derive(Debug, Clone)]
pub struct ElectionState {
    identity: String,
    config: ElectionConfig,
    /// The last record value seen and the local instant it was first seen: the start of its
    /// expiry countdown.
    last_seen: Option<(LeaseRecord, u64)>,
    /// Set while we hold the Lease and act as controller.
    leading: Option<Leadership>,
    /// The write we asked for and have not heard back about.
    in_flight: Option<InFlight>,
    /// Set by [`ElectionState::release`]: a shutting-down candidate never acquires again.
    released: bool,
}

#[derive(Debug, Clone)]
struct Leadership {
    /// The record as stored by our last successful write.
    record: LeaseRecord,
    /// When that write was sent, by our clock: the start of the renew deadline.
    renewed_at_ms: u64,
    /// See [`ElectionState::expired_holder`].
    expired_holder: Option<String>,
}

#[derive(Debug, Clone)]
struct InFlight {
    kind: WriteKind,
    sent_at_ms: u64,
    /// For an acquire: the holder named by the record it replaces, when that record expired
    /// (not when it was free or already named us).
    replaces: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteKind {
    Acquire,
    Renew,
    Release,
}

impl ElectionState {
    /// A candidate named `identity` (unique per broker process, e.g. the pod name).
    pub fn new(
        identity: impl Into<String>,
        config: ElectionConfig,
    ) -> Result<Self, ElectionConfigError> {
        config.validate()?;
        Ok(Self {
            identity: identity.into(),
            config,
            last_seen: None,
            leading: None,
            in_flight: None,
            released: false,
        })
    }

    /// This candidate's identity, as written into `holder`.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The timings in force.
    pub fn config(&self) -> &ElectionConfig {
        &self.config
    }

    /// Decides what to do, given the record just read from the store and the local monotonic
    /// time. Call it at least every `retry_period_ms`, always with a fresh read.
    pub fn step(&mut self, observed: &LeaseRecord, now_ms: u64) -> ElectionAction {
        self.observe(observed, now_ms);

        if let Some(lead) = &self.leading {
            let deadline_passed = now_ms >= self.deadline(lead);
            let still_ours = self.names_us(observed)
                && observed.lease_transitions == lead.record.lease_transitions;
            if deadline_passed || !still_ours {
                self.leading = None;
                return ElectionAction::StepDown;
            }
            let renew_due = now_ms
                >= lead
                    .renewed_at_ms
                    .saturating_add(self.config.retry_period_ms);
            if self.in_flight.is_some() || !renew_due {
                return ElectionAction::Wait;
            }
            let new_record = LeaseRecord {
                renew_time: Some(stamp(now_ms)),
                lease_duration_ms: self.config.lease_duration_ms,
                ..observed.clone()
            };
            self.in_flight = Some(InFlight {
                kind: WriteKind::Renew,
                sent_at_ms: now_ms,
                replaces: None,
            });
            return ElectionAction::Renew { new_record };
        }

        if self.released || self.in_flight.is_some() {
            return ElectionAction::Wait;
        }
        let ours = self.names_us(observed);
        let free = observed.holder.is_none();
        if !(ours || free || self.expired(observed, now_ms)) {
            return ElectionAction::Wait;
        }
        let (acquire_time, lease_transitions) = if ours {
            // Taking back a record that names us is not a change of holder.
            (observed.acquire_time.clone(), observed.lease_transitions)
        } else {
            (
                Some(stamp(now_ms)),
                observed.lease_transitions.saturating_add(1),
            )
        };
        let new_record = LeaseRecord {
            holder: Some(self.identity.clone()),
            acquire_time,
            renew_time: Some(stamp(now_ms)),
            lease_duration_ms: self.config.lease_duration_ms,
            lease_transitions,
            resource_version: observed.resource_version.clone(),
        };
        self.in_flight = Some(InFlight {
            kind: WriteKind::Acquire,
            sent_at_ms: now_ms,
            replaces: if ours || free {
                None
            } else {
                observed.holder.clone()
            },
        });
        ElectionAction::Acquire { new_record }
    }

    /// Feeds back the outcome of the write the last action asked for — the stored record on
    /// success, or why it failed — at local time `now_ms`. A conflict needs no special handling
    /// here: the next step sees the fresh record.
    ///
    /// A successful acquire whose reply arrives after the renew deadline its send started (a
    /// reply delayed, or the process frozen in between) does not make us leader: the deadline
    /// has already passed. The record still names us, so the next step takes it back with a
    /// fresh write and a fresh deadline.
    pub fn on_write_result(&mut self, result: Result<LeaseRecord, WriteError>, now_ms: u64) {
        let Some(flight) = self.in_flight.take() else {
            return;
        };
        let Ok(record) = result else {
            return;
        };
        if !self.names_us(&record) {
            return;
        }
        match flight.kind {
            WriteKind::Acquire => {
                let lead = Leadership {
                    record,
                    renewed_at_ms: flight.sent_at_ms,
                    expired_holder: flight.replaces,
                };
                if now_ms < self.deadline(&lead) {
                    self.leading = Some(lead);
                }
            }
            WriteKind::Renew => {
                // A renewal that lands after we stepped down does not make us leader again;
                // the next step takes the record back explicitly.
                if let Some(lead) = &mut self.leading {
                    if record.lease_transitions == lead.record.lease_transitions {
                        lead.record = record;
                        lead.renewed_at_ms = lead.renewed_at_ms.max(flight.sent_at_ms);
                    }
                }
            }
            WriteKind::Release => {}
        }
    }

    /// Gives the Lease up, for a clean shutdown: we stop acting as controller immediately, and
    /// the returned record (holder `None`, `lease_transitions` kept) is to be written with
    /// compare-and-swap. After this the candidate never acquires again.
    ///
    /// Returns `None` when we do not lead, or when a write is still outstanding (its outcome
    /// would make the release's version stale); the Lease then lapses after its duration.
    pub fn release(&mut self) -> Option<LeaseRecord> {
        self.released = true;
        let lead = self.leading.take()?;
        if self.in_flight.is_some() {
            return None;
        }
        self.in_flight = Some(InFlight {
            kind: WriteKind::Release,
            // Unused for a release: its outcome changes nothing we time.
            sent_at_ms: lead.renewed_at_ms,
            replaces: None,
        });
        Some(LeaseRecord {
            holder: None,
            ..lead.record
        })
    }

    /// The epoch of the Lease we hold (its `lease_transitions`), or `None` when not leading.
    /// It is set by a successful acquire and cleared by the step that notices a passed deadline
    /// or a replacement, so gate actions on [`ElectionState::is_leader`], which is exact.
    pub fn epoch(&self) -> Option<u64> {
        self.leading.as_ref().map(|l| l.record.lease_transitions)
    }

    /// While we lead: the holder whose Lease had run out when we took it over. It stopped
    /// acting as controller at least `lease_duration − renew_deadline` before our takeover
    /// (see the module docs), so it stopped acknowledging itself that long before too, which
    /// the handover may count (`handover::silent_for`). `None` when we took over a free record
    /// — never held, or **released** — or one already naming us: a holder that releases may
    /// have acknowledged itself an instant before its release, so no such gap is known (a
    /// controller stopped by SIGTERM releases; counting the gap for it handed its partitions
    /// over while it still served them).
    pub fn expired_holder(&self) -> Option<&str> {
        self.leading.as_ref()?.expired_holder.as_deref()
    }

    /// Whether we may act as controller at local time `now_ms`: we hold the Lease and our
    /// renew deadline has not passed.
    pub fn is_leader(&self, now_ms: u64) -> bool {
        self.leader_until_ms().is_some_and(|until| now_ms < until)
    }

    /// The local instant at which we stop being controller unless a renewal succeeds first.
    pub fn leader_until_ms(&self) -> Option<u64> {
        self.leading.as_ref().map(|l| self.deadline(l))
    }

    fn deadline(&self, lead: &Leadership) -> u64 {
        lead.renewed_at_ms
            .saturating_add(self.config.renew_deadline_ms)
    }

    fn names_us(&self, record: &LeaseRecord) -> bool {
        record.holder.as_deref() == Some(self.identity.as_str())
    }

    /// Restarts the expiry countdown whenever the record differs from the last one seen.
    fn observe(&mut self, observed: &LeaseRecord, now_ms: u64) {
        if self.last_seen.as_ref().map(|(r, _)| r) != Some(observed) {
            self.last_seen = Some((observed.clone(), now_ms));
        }
    }

    /// Whether the current holder has gone a full lease duration without a visible write. The
    /// duration is the longer of the holder's promise and our own setting, so a misconfigured
    /// peer can only make us wait longer, never cut a live holder short.
    fn expired(&self, observed: &LeaseRecord, now_ms: u64) -> bool {
        let Some((_, since_ms)) = &self.last_seen else {
            return false;
        };
        let duration_ms = observed
            .lease_duration_ms
            .max(self.config.lease_duration_ms);
        now_ms.saturating_sub(*since_ms) >= duration_ms
    }
}

/// The opaque stamp written into `acquire_time`/`renew_time`: our own monotonic milliseconds,
/// meaningful to nobody else — observers only notice that it changed.
fn stamp(now_ms: u64) -> String {
    now_ms.to_string()
}
