//! The `file` Lease backend: `<shared>/__cluster/lease.json` with the Kubernetes Lease's
//! semantics, for several brokers on one host (our multi-broker tests) or on one NFS volume.
//!
//! # Why the compare-and-swap is atomic
//!
//! Every write runs under an exclusive `flock` on the separate file `__cluster/lease.lock`:
//! lock, read `lease.json` afresh, compare its `resource_version` with the expected one, write
//! a temporary file, fsync it, rename it over `lease.json`, fsync the directory, unlock. Two
//! writers never interleave between the compare and the rename, so of two candidates that read
//! the same version exactly one succeeds, and the other sees [`WriteError::Conflict`] — the
//! property the election's fencing argument needs from its store. The version is a counter
//! kept in the file and raised by one on each write, so a version is never reused while the
//! file exists.
//!
//! The lock is a separate file because `lease.json` itself is replaced by rename: a lock on
//! the old inode would not exclude a writer that opened the new one. Readers take no lock: the
//! rename is atomic, so they see the whole old record or the whole new one.
//!
//! On Linux `flock` is released by the kernel when the holder dies, and on NFS the client turns
//! it into a POSIX lock that the server reclaims when the client's state expires; so a crashed
//! broker never leaves a stale lock behind, at worst a delay of the NFS lease time. Taking the
//! lock is bounded ([`LOCK_WAIT`]): a stuck lock makes the write [`WriteError::Unavailable`],
//! which the election treats as "not written".
//!
//! A process *frozen* (SIGSTOP, a stalled VM) during its few milliseconds under the lock keeps
//! it, and no candidate can write until that process resumes or dies. We accept that stall
//! rather than break the lock after a timeout: a breakable lock would let the frozen writer
//! resume and rename a record computed from a version that is no longer current, which is the
//! very overwrite the compare-and-swap exists to prevent.
//!
//! Every read reopens the file: NFS guarantees a fresh view only on `open()` (close-to-open
//! consistency), never through an old handle. All filesystem work runs on tokio's blocking
//! pool, not on the control thread.
//!
//! Deleting `lease.json` by hand restarts the counter (and the epoch); don't, while brokers run.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::warn;

use super::{BackendError, LeaseBackend};
use crate::election::{LeaseRecord, WriteError};

/// The directory under the shared data directory that holds cluster files.
pub const CLUSTER_DIR: &str = "__cluster";
/// The Lease record, replaced whole by rename on each write.
pub const LEASE_FILE: &str = "lease.json";
/// The lock file writers `flock`; never replaced, never holds data.
pub const LOCK_FILE: &str = "lease.lock";
/// How long a writer waits for the lock before giving up this step.
pub const LOCK_WAIT: Duration = Duration::from_secs(1);

/// The lease file in `<shared>/__cluster/`.
#[derive(Debug, Clone)]
pub struct FileLease {
    paths: Arc<Paths>,
}

#[derive(Debug)]
struct Paths {
    dir: PathBuf,
    lease: PathBuf,
    lock: PathBuf,
}

impl FileLease {
    /// The lease of the cluster whose shared directory is `shared_dir` (the `--data-dir`).
    /// Nothing is touched until the first read or write.
    pub fn new(shared_dir: impl AsRef<Path>) -> Self {
        let dir = shared_dir.as_ref().join(CLUSTER_DIR);
        Self {
            paths: Arc::new(Paths {
                lease: dir.join(LEASE_FILE),
                lock: dir.join(LOCK_FILE),
                dir,
            }),
        }
    }

    /// Path of `lease.json`.
    pub fn lease_path(&self) -> &Path {
        &self.paths.lease
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Paths) -> T + Send + 'static,
    ) -> Option<T> {
        let paths = Arc::clone(&self.paths);
        tokio::task::spawn_blocking(move || f(&paths)).await.ok()
    }
}

impl LeaseBackend for FileLease {
    async fn get(&self) -> Result<LeaseRecord, BackendError> {
        self.blocking(|p| read_record(&p.lease))
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
        self.blocking(move |p| cas(p, record, &expected))
            .await
            .unwrap_or(Err(WriteError::Unavailable))
    }
}

/// Reads `lease.json` through a fresh `open()`; a missing file is the never-written Lease.
fn read_record(path: &Path) -> Result<LeaseRecord, BackendError> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| BackendError(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(LeaseRecord::default()),
        Err(e) => Err(BackendError(format!("{}: {e}", path.display()))),
    }
}

/// The compare-and-swap, under the lock; see the module docs for why it is atomic.
fn cas(p: &Paths, record: LeaseRecord, expected: &str) -> Result<LeaseRecord, WriteError> {
    let unavailable = |what: &str, e: &dyn std::fmt::Display| {
        warn!(path = %p.lease.display(), "lease file {what}: {e}");
        WriteError::Unavailable
    };
    fs::create_dir_all(&p.dir).map_err(|e| unavailable("mkdir", &e))?;
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&p.lock)
        .map_err(|e| unavailable("open lock", &e))?;
    lock_bounded(&lock).map_err(|e| unavailable("lock", &e))?;

    let current = read_record(&p.lease).map_err(|e| unavailable("read", &e))?;
    if current.resource_version != expected {
        return Err(WriteError::Conflict);
    }
    let version = if current.resource_version.is_empty() {
        0
    } else {
        current
            .resource_version
            .parse::<u64>()
            .map_err(|e| unavailable("version", &e))?
    };
    let stored = LeaseRecord {
        resource_version: (version + 1).to_string(),
        ..record
    };
    write_durably(p, &stored).map_err(|e| unavailable("write", &e))?;
    // Unlocks on drop, after the rename and the directory fsync.
    drop(lock);
    Ok(stored)
}

/// Takes the exclusive lock, polling so a stuck lock costs at most [`LOCK_WAIT`].
fn lock_bounded(lock: &File) -> std::io::Result<()> {
    let give_up = Instant::now() + LOCK_WAIT;
    loop {
        match lock.try_lock() {
            Ok(()) => return Ok(()),
            Err(TryLockError::Error(e)) => return Err(e),
            Err(TryLockError::WouldBlock) if Instant::now() >= give_up => {
                return Err(std::io::Error::new(
                    ErrorKind::TimedOut,
                    "lease.lock held too long",
                ))
            }
            Err(TryLockError::WouldBlock) => std::thread::sleep(Duration::from_millis(2)),
        }
    }
}

/// tmp + fsync + rename + fsync(dir): after this returns, the new record survives a crash and
/// no reader ever sees a partial one.
fn write_durably(p: &Paths, record: &LeaseRecord) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(record)?;
    let tmp = p.dir.join(format!(
        "{LEASE_FILE}.tmp.{}.{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, &p.lease)?;
        File::open(&p.dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}
