//! [`ElectionDriver`]: runs the pure [`ElectionState`] against a [`LeaseBackend`] with tokio's
//! monotonic clock, and publishes who leads on a [`watch`] channel.
//!
//! # What the driver adds to the election's fencing
//!
//! [`crate::election`] proves that a holder stops acting as controller at least
//! `lease_duration − renew_deadline` before anyone else can take over — provided the driver
//! (a) steps at least every retry period with a fresh read, (b) keeps at most one write
//! outstanding, and (c) lets nobody act after [`ElectionState::is_leader`] turns false. Here:
//!
//! - (a) each round reads, steps, performs the action and feeds its result back, then sleeps
//!   until one retry period after the round began. A holder wakes earlier, when its next
//!   renewal is due; anyone wakes earlier when nudged ([`ElectionDriver::with_nudge`]: a sign
//!   that the holder changed), but never less than a quarter of a retry period after the round
//!   began. Reading more often changes no expiry, which counts from the first sight of a
//!   record: it only learns of a new or released holder sooner;
//! - (b) a round awaits its write before the next round begins; every read and write is bounded
//!   by [`ElectionDriver::io_timeout`], and a timed-out write counts as not written;
//! - (c) the published [`Leadership::leader`] turns false at the deadline itself: between
//!   rounds the driver wakes at [`ElectionState::leader_until_ms`], and while a read or write
//!   is pending it watches the same instant, so a store that hangs or fails cannot keep a
//!   stale `leader: true` on the channel. Consumers that act
//!   later than they read the channel should re-check it just before acting.
//!
//! Time is milliseconds of [`tokio::time::Instant`] since the driver was built, so paused-time
//! tests and real runs use the same code.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::{sleep_until, Instant};
use tracing::{debug, info, warn};

use super::LeaseBackend;
use crate::election::{
    ElectionAction, ElectionConfig, ElectionConfigError, ElectionState, LeaseRecord, WriteError,
};

/// Who leads, as this broker last saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leadership {
    /// Whether this broker is the controller now (holds the Lease, renew deadline not passed).
    pub leader: bool,
    /// The Lease holder in the last record read (the controller to dial), if any.
    pub holder: Option<String>,
    /// When `leader`, the epoch of the Lease we hold; otherwise `lease_transitions` of the last
    /// record read: the cluster epoch a follower must not see an assignment fall below.
    pub epoch: u64,
    /// When `leader`, the instant our renew deadline passes unless a renewal succeeds first.
    /// Controller actions that must never happen after the deadline (acknowledging a broker's
    /// status, which extends that broker's write fence) compare it with the clock at the moment
    /// of acting, so a process resumed from a pause cannot act on a stale `leader: true`.
    pub leader_until: Option<Instant>,
    /// When `leader`: the holder whose Lease had run out when we took it over, or `None` when
    /// the Lease was free (released, never held) or already ours
    /// ([`ElectionState::expired_holder`]). Only an expired holder's own write fence is known
    /// to have closed an election gap before our takeover (`handover::silent_for`).
    pub expired_holder: Option<String>,
}

impl Leadership {
    /// Whether we lead at this very instant (the exact gate; see [`Self::leader_until`]).
    pub fn leads_now(&self) -> bool {
        self.leader
            && self
                .leader_until
                .is_some_and(|until| Instant::now() < until)
    }
}

/// Runs one candidate's election against a backend. See the module docs.
pub struct ElectionDriver<B> {
    backend: B,
    state: ElectionState,
    start: Instant,
    io_timeout: Duration,
    last_seen: Option<LeaseRecord>,
    tx: watch::Sender<Leadership>,
    nudge: Arc<Notify>,
}

impl<B: LeaseBackend> ElectionDriver<B> {
    /// A candidate named `identity` (unique per broker process) on `backend`. Reads and writes
    /// are bounded by the retry period by default.
    pub fn new(
        backend: B,
        identity: impl Into<String>,
        config: ElectionConfig,
    ) -> Result<Self, ElectionConfigError> {
        let state = ElectionState::new(identity, config)?;
        let (tx, _) = watch::channel(Leadership::default());
        Ok(Self {
            backend,
            state,
            start: Instant::now(),
            io_timeout: Duration::from_millis(config.retry_period_ms),
            last_seen: None,
            tx,
            nudge: Arc::new(Notify::new()),
        })
    }

    /// Reads the Lease again soon when `nudge` is notified, instead of at the next retry
    /// period: for a broker whose heartbeat stream the controller just closed (it stepped down
    /// or released the Lease), which otherwise dials the old address for up to a retry period
    /// while its write fence runs out.
    pub fn with_nudge(mut self, nudge: Arc<Notify>) -> Self {
        self.nudge = nudge;
        self
    }

    /// Bounds each Lease read and write (default: the retry period). A write that times out is
    /// treated as not written; it must stay well below the renew deadline.
    pub fn with_io_timeout(mut self, io_timeout: Duration) -> Self {
        self.io_timeout = io_timeout;
        self
    }

    /// The bound on each Lease read and write.
    pub fn io_timeout(&self) -> Duration {
        self.io_timeout
    }

    /// A receiver of every change of [`Leadership`].
    pub fn subscribe(&self) -> watch::Receiver<Leadership> {
        self.tx.subscribe()
    }

    /// The backend, e.g. to inspect the store in tests.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Whether this candidate is the controller at this instant (the exact gate; the channel
    /// can lag it by a scheduling delay).
    pub fn is_leader(&self) -> bool {
        self.state.is_leader(self.now_ms())
    }

    /// Runs rounds until `shutdown` completes, then releases the Lease if held. Shutdown is
    /// noticed between rounds; a round takes at most two I/O timeouts (a read and a write).
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> B {
        tokio::pin!(shutdown);
        loop {
            let round_start = Instant::now();
            self.round().await;
            let config = *self.state.config();
            let retry = Duration::from_millis(config.retry_period_ms);
            let mut wake = round_start + retry;
            if let Some(until) = self.state.leader_until_ms() {
                let until = self.start + Duration::from_millis(until);
                // Renew as soon as it is due (one retry period after the last renewal was
                // sent), but never spin: at most two rounds per retry period.
                let renew_due = until - Duration::from_millis(config.renew_deadline_ms) + retry;
                wake = wake.min(renew_due.max(round_start + retry / 2)).min(until);
            }
            tokio::select! {
                () = &mut shutdown => break,
                () = sleep_until(wake) => {}
                () = self.nudge.notified() => {
                    // At most four rounds per retry period, however often it is nudged.
                    let soon = wake.min(round_start + retry / 4);
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = sleep_until(soon) => {}
                    }
                }
            }
        }
        self.release().await;
        self.backend
    }

    /// One round: publish (so a passed deadline shows at once), read, step, write, publish.
    pub async fn round(&mut self) {
        self.publish();
        let observed = match self.bounded(self.backend.get()).await {
            Some(Ok(record)) => record,
            Some(Err(e)) => {
                warn!(identity = self.state.identity(), "{e}");
                self.publish();
                return;
            }
            None => {
                warn!(identity = self.state.identity(), "lease read timed out");
                self.publish();
                return;
            }
        };
        self.last_seen = Some(observed.clone());
        match self.state.step(&observed, self.now_ms()) {
            ElectionAction::Acquire { new_record } => {
                let result = self.write(&new_record).await;
                if let Ok(stored) = &result {
                    info!(
                        identity = self.state.identity(),
                        epoch = stored.lease_transitions,
                        "acquired the controller lease"
                    );
                }
                self.feed(result);
            }
            ElectionAction::Renew { new_record } => {
                let result = self.write(&new_record).await;
                self.feed(result);
            }
            ElectionAction::StepDown => {
                info!(
                    identity = self.state.identity(),
                    holder = observed.holder.as_deref().unwrap_or(""),
                    "stepped down as controller"
                );
            }
            ElectionAction::Wait => {}
        }
        self.publish();
    }

    /// Gives the Lease up (holder cleared, `leaseTransitions` kept, so the next takeover raises
    /// the epoch past every one used), and publishes `leader: false` first: nothing may act as
    /// controller once a release is under way. Never acquires again afterwards.
    pub async fn release(&mut self) {
        let record = self.state.release();
        self.publish();
        if let Some(record) = record {
            let result = self.write(&record).await;
            match &result {
                Ok(_) => info!(identity = self.state.identity(), "released the lease"),
                Err(e) => {
                    warn!(
                        identity = self.state.identity(),
                        "lease release failed: {e}"
                    )
                }
            }
            self.feed(result);
        }
    }

    async fn write(&self, record: &LeaseRecord) -> Result<LeaseRecord, WriteError> {
        self.bounded(self.backend.compare_and_swap(record))
            .await
            .unwrap_or(Err(WriteError::Unavailable))
    }

    /// Awaits one Lease read or write for at most [`Self::io_timeout`] (`None` after that),
    /// publishing `leader: false` at our renew deadline if it passes meanwhile.
    async fn bounded<T>(&self, io: impl Future<Output = T>) -> Option<T> {
        let give_up = Instant::now() + self.io_timeout;
        tokio::pin!(io);
        loop {
            let deadline = self
                .state
                .leader_until_ms()
                .map(|until| self.start + Duration::from_millis(until))
                .filter(|deadline| *deadline < give_up && *deadline > Instant::now());
            tokio::select! {
                result = &mut io => return Some(result),
                () = sleep_until(give_up) => return None,
                () = sleep_until(deadline.unwrap_or(give_up)), if deadline.is_some() => {
                    self.publish();
                }
            }
        }
    }

    fn feed(&mut self, result: Result<LeaseRecord, WriteError>) {
        if let Ok(stored) = &result {
            self.last_seen = Some(stored.clone());
        }
        debug!(identity = self.state.identity(), ?result, "lease write");
        let now_ms = self.now_ms();
        self.state.on_write_result(result, now_ms);
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn publish(&self) {
        let leader = self.state.is_leader(self.now_ms());
        let seen = self.last_seen.as_ref();
        let view = Leadership {
            leader,
            leader_until: self
                .state
                .leader_until_ms()
                .filter(|_| leader)
                .map(|until| self.start + Duration::from_millis(until)),
            holder: seen.and_then(|r| r.holder.clone()),
            expired_holder: self
                .state
                .expired_holder()
                .filter(|_| leader)
                .map(str::to_string),
            epoch: match (leader, self.state.epoch()) {
                (true, Some(epoch)) => epoch,
                _ => seen.map_or(0, |r| r.lease_transitions),
            },
        };
        crate::set_if_changed(&self.tx, view);
    }
}
