//! The `file` Lease backend: `<shared>/__cluster/lease.json` with the Kubernetes Lease's
//! semantics, for several brokers on one host (our multi-broker tests) or on one NFS volume.
//!
//! # Why the compare-and-swap is atomic
//!
//! The record's versions are a [`Chain`]: version `n` is the file `lease.<n>.json`, created
//! exactly once by `link()`, and the `resource_version` is `n`. Of two candidates that read the
//! same version exactly one creates the next, and the other sees [`WriteError::Conflict`] — the
//! property the election's fencing argument needs from its store. No lock is taken, so a
//! candidate frozen in the middle of a write (SIGSTOP, a stalled VM) never stops the others
//! from electing a new holder; when it resumes, its write fails (see [`crate::chain`]).
//! `lease.json` is a copy of the newest version for people and scripts; the election never
//! reads it, except to start the chain from a Lease written by an older kaas.
//!
//! Every read reopens the file: NFS guarantees a fresh view only on `open()` (close-to-open
//! consistency), never through an old handle. All filesystem work runs on tokio's blocking
//! pool, not on the control thread.
//!
//! Deleting the `lease.*.json` files by hand restarts the counter (and the epoch); don't.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::warn;

use super::{BackendError, LeaseBackend};
use crate::chain::{AppendError, Chain};
use crate::election::{LeaseRecord, WriteError};

/// The directory under the shared data directory that holds cluster files.
pub const CLUSTER_DIR: &str = "__cluster";
/// The copy of the newest Lease version, `lease.json` (the versions are `lease.<n>.json`).
pub const LEASE_FILE: &str = "lease.json";
const STEM: &str = "lease";

/// The lease file in `<shared>/__cluster/`.
#[derive(Debug, Clone)]
pub struct FileLease {
    chain: Arc<Chain>,
    mirror: PathBuf,
}

impl FileLease {
    /// The lease of the cluster whose shared directory is `shared_dir` (the `--data-dir`).
    /// Nothing is touched until the first read or write.
    pub fn new(shared_dir: impl AsRef<Path>) -> Self {
        let chain = Chain::new(shared_dir.as_ref().join(CLUSTER_DIR), STEM);
        Self {
            mirror: chain.mirror_path(),
            chain: Arc::new(chain),
        }
    }

    /// Path of `lease.json`, the copy of the newest version.
    pub fn lease_path(&self) -> &Path {
        &self.mirror
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Chain) -> T + Send + 'static,
    ) -> Option<T> {
        let chain = Arc::clone(&self.chain);
        tokio::task::spawn_blocking(move || f(&chain)).await.ok()
    }
}

impl LeaseBackend for FileLease {
    async fn get(&self) -> Result<LeaseRecord, BackendError> {
        self.blocking(read_record)
            .await
            .unwrap_or_else(|| Err(BackendError("lease read task failed".into())))
    }

    async fn create(&self, record: &LeaseRecord) -> Result<LeaseRecord, WriteError> {
        self.replace(record, "").await
    }

    async fn replace(
        &self,
        record: &LeaseRecord,
        expected_resource_version: &str,
    ) -> Result<LeaseRecord, WriteError> {
        let record = record.clone();
        let expected = expected_resource_version.to_owned();
        self.blocking(move |chain| cas(chain, record, &expected))
            .await
            .unwrap_or(Err(WriteError::Unavailable))
    }
}

/// The version a record written by an older kaas (only `lease.json`, no versions) carries.
fn legacy_seq(bytes: &[u8]) -> Option<u64> {
    let record: LeaseRecord = serde_json::from_slice(bytes).ok()?;
    record.resource_version.parse().ok()
}

/// The newest version; nothing written yet is the never-written Lease.
fn read_record(chain: &Chain) -> Result<LeaseRecord, BackendError> {
    let where_ = || chain.mirror_path().display().to_string();
    let Some(head) = chain
        .read_head(legacy_seq)
        .map_err(|e| BackendError(format!("{}: {e}", where_())))?
    else {
        return Ok(LeaseRecord::default());
    };
    let record: LeaseRecord = serde_json::from_slice(&head.bytes)
        .map_err(|e| BackendError(format!("lease version {} ({}): {e}", head.seq, where_())))?;
    Ok(LeaseRecord {
        resource_version: head.seq.to_string(),
        ..record
    })
}

/// The compare-and-swap: the version after `expected`, created exactly once.
fn cas(chain: &Chain, record: LeaseRecord, expected: &str) -> Result<LeaseRecord, WriteError> {
    let base = if expected.is_empty() {
        None
    } else {
        // A version this store never handed out cannot be current.
        Some(expected.parse::<u64>().map_err(|_| WriteError::Conflict)?)
    };
    let stored = LeaseRecord {
        resource_version: String::new(),
        ..record
    };
    let bytes = serde_json::to_vec_pretty(&stored).map_err(|e| {
        warn!("lease record does not serialize: {e}");
        WriteError::Unavailable
    })?;
    match chain.append(base, &bytes) {
        Ok(seq) => Ok(LeaseRecord {
            resource_version: seq.to_string(),
            ..stored
        }),
        Err(AppendError::Conflict) => Err(WriteError::Conflict),
        Err(AppendError::Io(e)) => {
            warn!(path = %chain.mirror_path().display(), "lease file write failed: {e}");
            Err(WriteError::Unavailable)
        }
    }
}
