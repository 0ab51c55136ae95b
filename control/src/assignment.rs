//! `assignment.json`: the one published answer to "who leads what", its writer and its watcher.
//!
//! The controller writes `<shared>/__cluster/assignment.json` after every recompute; every
//! broker (the controller included) follows it. Metadata, the Produce/Fetch ownership check,
//! FindCoordinator and `/healthz` all read the view accepted here, so there is no second
//! authority to disagree with.
//!
//! - [`Assignment`] is the file's model (docs/DESIGN.md fields: `controller_epoch`,
//!   `assignment_version`, `brokers` with health `alive | draining | dead` — dead rows are kept
//!   because the group-coordinator hash divides by the full registered list — `partitions` →
//!   leader and `consumer_groups` → coordinator).
//! - Its versions are a [`Chain`]: `assignment.<n>.json`, each created exactly once with
//!   compare-and-swap semantics and no lock (see [`crate::chain`]); `assignment.json` is a copy
//!   of the newest for operators. [`claim_epoch`] and [`write_fenced`] are the controller's
//!   two writes; readers take the newest version ([`read_published`]).
//! - [`AssignmentWatcher`] re-reads the newest version every second and whenever
//!   [`AssignmentNotifier::notify`] is called (the heartbeat's ASSIGNMENT_CHANGED push). It
//!   re-opens rather than watching with inotify because the shared volume is NFS in production:
//!   inotify does not see other hosts' writes there, and a renamed file is only seen on the next
//!   `open()`.
//! - [`accept`] is the epoch fence and [`diff`] the takeover plan; both are pure.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::sync::{watch, Notify};

use crate::chain::{AppendError, Chain};

/// Directory under the shared volume that holds cluster-wide files.
pub const CLUSTER_DIR: &str = "__cluster";

pub use kaas_model::{
    accept, diff, Assignment, BrokerEntry, Decision, Diff, Health, LeaderEpochs, PendingMove,
};

/// The versions of `assignment.json` in `<shared>/__cluster/`.
pub fn assignment_chain(shared_dir: &Path) -> Chain {
    Chain::new(shared_dir.join(CLUSTER_DIR), CHAIN_STEM)
}

const CHAIN_STEM: &str = "assignment";

/// The newest published assignment and its place in the chain.
#[derive(Debug, Clone, PartialEq)]
pub struct Published {
    /// Its version in the [`Chain`] (not the `assignment_version`: a deposed controller and
    /// its successor can write the same `assignment_version`, never the same `seq`).
    pub seq: u64,
    /// The file.
    pub assignment: Assignment,
}

/// The newest version: `Ok(None)` when no controller has written one yet. An `assignment.json`
/// left by an older kaas (no versions beside it) is read as version 0.
pub fn read_published(chain: &Chain) -> Result<Option<Published>, ReadError> {
    let head = chain
        .read_head(|_| Some(0))
        .map_err(|source| ReadError::Io {
            path: chain.mirror_path(),
            source,
        })?;
    head.map(|h| {
        Assignment::from_json(&h.bytes)
            .map(|assignment| Published {
                seq: h.seq,
                assignment,
            })
            .map_err(|source| ReadError::Corrupt {
                path: chain.entry_path(h.seq),
                source,
            })
    })
    .transpose()
}

/// Why a controller's write did not happen.
#[derive(Debug, Error)]
pub enum FenceError {
    /// A controller with a higher epoch has written: this one is deposed.
    #[error("assignment.json was written by controller epoch {claimed}, above ours ({ours})")]
    Deposed { claimed: u64, ours: u64 },
    /// Someone wrote since the version this write was decided from: claim again.
    #[error("assignment.json changed since it was read (written by another controller)")]
    Conflict,
    /// The files could not be used, or the newest is not a valid assignment.
    #[error("{0}")]
    Io(String),
}

impl From<AppendError> for FenceError {
    fn from(e: AppendError) -> Self {
        match e {
            AppendError::Conflict => FenceError::Conflict,
            AppendError::Io(e) => FenceError::Io(e.to_string()),
        }
    }
}

/// A new controller at `epoch` takes `assignment.json` over: it republishes the newest file it
/// knows — the chain's head, or `known` (what its own watcher accepted) if that is newer by
/// (epoch, version) — under its own epoch, as the next version of the chain.
///
/// The claim is a write, not a read, because the write is what fences: a deposed controller
/// frozen with a file it computed earlier finishes its append after that file's base, which
/// now exists, so its write is refused ([`FenceError::Conflict`], then [`FenceError::Deposed`]
/// when it claims again). A deposed write that landed first is the head, and is read and
/// carried forward here. Either way this term's first file is based on every file that ever
/// took effect, which is what [`crate::heartbeat::AckFloor`]'s term floor relies on.
/// The republished file moves nothing: it differs from its base only in epoch and version.
///
/// Returns the file now in force (`None` when nothing was ever written: there is then nothing
/// to carry forward, and the term's first real write is the claim).
pub fn claim_epoch(
    chain: &Chain,
    epoch: u64,
    known: Option<&Assignment>,
) -> Result<Option<Published>, FenceError> {
    for _ in 0..16 {
        let (head_seq, head) = match read_published(chain) {
            Ok(Some(p)) => (Some(p.seq), Some(p.assignment)),
            Ok(None) => (None, None),
            // A garbage head is skipped over when something newer is known (a torn or forged
            // file must not stop the cluster); with nothing to carry forward it is an error.
            Err(ReadError::Corrupt { .. }) if known.is_some() => (
                chain
                    .versions()
                    .map_err(|e| FenceError::Io(e.to_string()))?
                    .last()
                    .copied(),
                None,
            ),
            Err(e) => return Err(FenceError::Io(e.to_string())),
        };
        if let Some(h) = &head {
            if h.controller_epoch > epoch {
                return Err(FenceError::Deposed {
                    claimed: h.controller_epoch,
                    ours: epoch,
                });
            }
        }
        let Some(base) = [head.as_ref(), known]
            .into_iter()
            .flatten()
            .max_by_key(|a| a.order_key())
        else {
            return Ok(None);
        };
        if base.controller_epoch == epoch && head.as_ref() == Some(base) {
            // Already ours (a claim again after our own write).
            return Ok(Some(Published {
                seq: head_seq.expect("a head was read"),
                assignment: base.clone(),
            }));
        }
        let mut next = base.clone();
        next.controller_epoch = epoch;
        next.assignment_version = base.assignment_version + 1;
        match chain.append(head_seq, &next.to_json()) {
            Ok(seq) => {
                return Ok(Some(Published {
                    seq,
                    assignment: next,
                }))
            }
            Err(AppendError::Conflict) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(FenceError::Io(
        "assignment.json keeps changing under the claim".into(),
    ))
}

/// Publishes `assignment` as the version after `base` (the `seq` of the file it was computed
/// from, as returned by [`claim_epoch`] or the previous write). [`FenceError::Conflict`] if
/// anyone wrote in between: the caller claims again. Durable when it returns.
pub fn write_fenced(
    chain: &Chain,
    base: Option<u64>,
    assignment: &Assignment,
) -> Result<u64, FenceError> {
    Ok(chain.append(base, &assignment.to_json())?)
}

/// Appends `assignment` after whatever is newest, unconditionally (retrying conflicts): for
/// tests and tools standing in for a controller, never for a controller.
pub fn publish(chain: &Chain, assignment: &Assignment) -> io::Result<u64> {
    loop {
        let head = chain.versions()?.last().copied();
        match chain.append(head, &assignment.to_json()) {
            Ok(seq) => return Ok(seq),
            Err(AppendError::Conflict) => continue,
            Err(AppendError::Io(e)) => return Err(e),
        }
    }
}

/// Why a read of `assignment.json` produced no assignment.
#[derive(Debug, Error)]
pub enum ReadError {
    /// Opening or reading failed (other than the file not existing yet).
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The bytes are not a valid assignment: torn, truncated or foreign. The caller keeps its
    /// last good assignment.
    #[error("{path} is not a valid assignment: {source}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The parse error.
        source: serde_json::Error,
    },
}

/// Wakes an [`AssignmentWatcher`] for an immediate re-read. Cheap to clone; the heartbeat client
/// calls it on ASSIGNMENT_CHANGED.
#[derive(Debug, Clone)]
pub struct AssignmentNotifier(Arc<Notify>);

impl AssignmentNotifier {
    /// Re-read the file now instead of at the next poll. Calls made while a read is in progress
    /// cause one more read afterwards, so a push is never lost.
    pub fn notify(&self) {
        self.0.notify_one();
    }
}

/// Follows `assignment.json`: polls every `poll_interval` (1 s by default) and on
/// [`AssignmentNotifier::notify`], fences each candidate with [`accept`], and publishes every
/// accepted assignment through a `watch` channel.
///
/// A missing, unreadable, torn or stale file never replaces the last accepted assignment.
#[derive(Debug)]
pub struct AssignmentWatcher {
    chain: Chain,
    poll_interval: Duration,
    notify: Arc<Notify>,
    lease_epoch: Arc<AtomicU64>,
    tx: watch::Sender<Option<Arc<Assignment>>>,
    /// The bytes of the last read, so an unchanged file is not parsed again every second.
    last_bytes: Option<Vec<u8>>,
}

/// The default poll period (docs/DESIGN.md: 1 s; the heartbeat push is the fast path).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);

impl AssignmentWatcher {
    /// A watcher of `chain` (see [`assignment_chain`]); nothing is read until
    /// [`Self::poll_once`] or [`Self::run`].
    pub fn new(chain: Chain, poll_interval: Duration) -> Self {
        Self {
            chain,
            poll_interval,
            notify: Arc::new(Notify::new()),
            lease_epoch: Arc::new(AtomicU64::new(0)),
            tx: watch::channel(None).0,
            last_bytes: None,
        }
    }

    /// A handle that triggers an immediate re-read.
    pub fn notifier(&self) -> AssignmentNotifier {
        AssignmentNotifier(self.notify.clone())
    }

    /// A handle to raise the Lease epoch the fence compares against.
    pub fn lease_epoch(&self) -> LeaseEpoch {
        LeaseEpoch(self.lease_epoch.clone())
    }

    /// Every accepted assignment (`None` until the first one).
    pub fn subscribe(&self) -> watch::Receiver<Option<Arc<Assignment>>> {
        self.tx.subscribe()
    }

    /// The last accepted assignment.
    pub fn current(&self) -> Option<Arc<Assignment>> {
        self.tx.borrow().clone()
    }

    /// Reads the file once and applies the fence. Returns the decision for the file read, or
    /// `None` when there was nothing to decide (no file, unchanged bytes, unreadable or corrupt
    /// — the latter two are logged).
    pub fn poll_once(&mut self) -> Option<Decision> {
        match read_head_bytes(&self.chain) {
            Ok(Some(bytes)) => self.consider(bytes),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!("assignment watcher: {e}");
                None
            }
        }
    }

    /// Applies the fence to freshly read bytes.
    fn consider(&mut self, bytes: Vec<u8>) -> Option<Decision> {
        if self.last_bytes.as_deref() == Some(bytes.as_slice()) {
            return None;
        }
        let candidate = match Assignment::from_json(&bytes) {
            Ok(a) => a,
            Err(e) => {
                // Torn or foreign bytes: keep the last good assignment. Do not remember these
                // bytes, so the same garbage is logged again rather than silently skipped.
                tracing::warn!(path = %self.chain.mirror_path().display(), "ignoring invalid assignment: {e}");
                return None;
            }
        };
        self.last_bytes = Some(bytes);
        let lease_epoch = self.lease_epoch.load(Ordering::Acquire);
        let current = self.current();
        let decision = accept(current.as_deref(), &candidate, lease_epoch);
        match decision {
            Decision::Accept => {
                let _ = self.tx.send_replace(Some(Arc::new(candidate)));
            }
            Decision::Unchanged => {}
            Decision::StaleEpoch { .. } | Decision::Older { .. } => {
                tracing::warn!(?decision, "rejecting assignment.json");
            }
        }
        Some(decision)
    }

    /// Polls forever: every `poll_interval`, and at once when notified. File IO runs on the
    /// blocking pool, so a slow NFS server never stalls the control thread's other tasks.
    pub async fn run(mut self) {
        let mut tick = tokio::time::interval(self.poll_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.notify.notified() => {}
            }
            let chain = self.chain.clone();
            let read = tokio::task::spawn_blocking(move || read_head_bytes(&chain)).await;
            match read {
                Ok(Ok(Some(bytes))) => {
                    self.consider(bytes);
                }
                Ok(Ok(None)) => {}
                Ok(Err(e)) => tracing::warn!("assignment watcher: {e}"),
                Err(e) => tracing::warn!("assignment watcher read task failed: {e}"),
            }
        }
    }
}

/// The newest version's bytes (the watcher parses them only when they changed).
fn read_head_bytes(chain: &Chain) -> io::Result<Option<Vec<u8>>> {
    Ok(chain.read_head(|_| Some(0))?.map(|h| h.bytes))
}

/// The Lease epoch known to a broker, shared with its [`AssignmentWatcher`].
#[derive(Debug, Clone)]
pub struct LeaseEpoch(Arc<AtomicU64>);

impl LeaseEpoch {
    /// Raises the known epoch to `epoch` (never lowers it: epochs never go backwards, so a lower
    /// report is an old observation). Feed it every Lease read and every controller PING.
    pub fn observe(&self, epoch: u64) {
        self.0.fetch_max(epoch, Ordering::AcqRel);
    }

    /// The highest epoch observed so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balancer::{BrokerId, TopicPartition};

    fn broker(id: i32, health: Health) -> BrokerEntry {
        BrokerEntry {
            id: BrokerId(id),
            host: format!("kaas-{id}"),
            port: 9092,
            rack: None,
            health,
        }
    }

    fn assignment(epoch: u64, version: u64, leaders: &[(&str, i32, i32)]) -> Assignment {
        let partitions = leaders
            .iter()
            .map(|(t, p, l)| (TopicPartition::new(*t, *p), BrokerId(*l)))
            .collect();
        Assignment::new(
            epoch,
            version,
            vec![broker(0, Health::Alive), broker(1, Health::Dead)],
            partitions,
            ["g".to_string()],
        )
    }

    // The fence rejects epochs below the Lease, never goes back, and lets a new epoch win with a
    // lower version.
    #[test]
    fn accept_fences_by_epoch_then_version() {
        let cur = assignment(3, 10, &[]);
        assert_eq!(accept(None, &cur, 3), Decision::Accept);
        assert!(matches!(
            accept(None, &assignment(2, 99, &[]), 3),
            Decision::StaleEpoch { .. }
        ));
        assert!(matches!(
            accept(Some(&cur), &assignment(3, 9, &[]), 0),
            Decision::Older { .. }
        ));
        assert_eq!(
            accept(Some(&cur), &assignment(3, 10, &[]), 3),
            Decision::Unchanged
        );
        assert_eq!(
            accept(Some(&cur), &assignment(3, 11, &[]), 3),
            Decision::Accept
        );
        assert_eq!(
            accept(Some(&cur), &assignment(4, 1, &[]), 4),
            Decision::Accept
        );
    }

    // Coordinators skip dead rows but keep them in the hash's modulus.
    #[test]
    fn coordinators_use_only_alive_brokers() {
        let a = assignment(1, 1, &[]);
        assert_eq!(a.consumer_groups.get("g"), Some(&BrokerId(0)));
        assert_eq!(a.coordinator("another-group"), Some(BrokerId(0)));
    }
}
