//! Lease backends and the driver that runs the election on one of them (cluster mode).
//!
//! Runs on the control thread (its tokio current-thread runtime). [`crate::election`] decides;
//! this module only stores and times: a [`LeaseBackend`] reads and compare-and-swaps the one
//! `kaas-controller` Lease, and [`ElectionDriver`] steps the pure [`ElectionState`] against it
//! with a monotonic clock and publishes the outcome as a [`Leadership`] on a
//! [`tokio::sync::watch`] channel.
//!
//! Two backends share one contract, so the election (and its fencing argument, written in
//! [`crate::election`]) does not care which is in use:
//!
//! - [`file::FileLease`]: `<shared>/__cluster/lease.json`, for several brokers on one host or on
//!   one NFS volume without Kubernetes;
//! - [`kube::KubeLease`]: the `coordination.k8s.io/v1` Lease `kaas-controller` in the pod's
//!   namespace.
//!
//! [`ElectionState`]: crate::election::ElectionState

use std::future::Future;

use thiserror::Error;

use crate::election::{LeaseRecord, WriteError};

pub mod driver;
pub mod file;
pub mod kube;

pub use driver::{ElectionDriver, Leadership};

/// The Lease's name, in Kubernetes and in log lines.
pub const LEASE_NAME: &str = "kaas-controller";

/// A store holding one Lease record with compare-and-swap on its `resource_version`.
///
/// The contract every backend keeps, because the election's fencing rests on it: a write
/// succeeds only if the stored `resource_version` still equals the one the write was based on,
/// and every successful write gives the record a version never handed out before, so a
/// candidate that read an old record can never overwrite a newer one. A missing Lease reads as
/// [`LeaseRecord::default()`] (empty `resource_version`, no holder, zero transitions), and is
/// written with [`LeaseBackend::create`], which fails with [`WriteError::Conflict`] when
/// someone created it first.
///
/// The futures are `Send` so a driver can run in a spawned task.
pub trait LeaseBackend: Send + Sync {
    /// Reads the Lease as stored now (no cache: the election needs a fresh read every step).
    fn get(&self) -> impl Future<Output = Result<LeaseRecord, BackendError>> + Send;

    /// Creates the Lease with `record`'s fields; [`WriteError::Conflict`] if it already exists.
    /// Returns the stored record with its first version.
    fn create(
        &self,
        record: &LeaseRecord,
    ) -> impl Future<Output = Result<LeaseRecord, WriteError>> + Send;

    /// Replaces the Lease with `record`'s fields if its version is still
    /// `expected_resource_version`; [`WriteError::Conflict`] otherwise. Returns the stored
    /// record with its new version.
    fn replace(
        &self,
        record: &LeaseRecord,
        expected_resource_version: &str,
    ) -> impl Future<Output = Result<LeaseRecord, WriteError>> + Send;

    /// Writes a record produced by the election: its `resource_version` is the version it was
    /// based on, empty when the Lease did not exist.
    fn compare_and_swap(
        &self,
        record: &LeaseRecord,
    ) -> impl Future<Output = Result<LeaseRecord, WriteError>> + Send {
        async move {
            if record.resource_version.is_empty() {
                self.create(record).await
            } else {
                self.replace(record, &record.resource_version).await
            }
        }
    }
}

/// A Lease read that failed: the store is unreachable, or what it holds cannot be parsed.
/// The driver skips that step; the renew deadline keeps running meanwhile, so a holder that
/// cannot read its Lease stops acting as controller on time.
#[derive(Debug, Clone, Error)]
#[error("lease read failed: {0}")]
pub struct BackendError(pub String);
