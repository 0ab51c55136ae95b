//! The `kube` Lease backend: the `coordination.k8s.io/v1` Lease `kaas-controller` in the pod's
//! namespace, through the kube crate's `Api<Lease>`.
//!
//! # Why a resourceVersion-conditional replace, not server-side apply
//!
//! docs/DESIGN.md says "acquired and renewed by server-side apply". Apply merges fields by owner and
//! does not by itself compare against what the writer last saw, so two candidates applying a
//! takeover from the same observation could both succeed. What the fencing argument in
//! [`crate::election`] needs is a compare-and-swap: a write that succeeds only if the Lease is
//! still the version the writer observed. A `PUT` carrying the observed
//! `metadata.resourceVersion` is exactly that — the apiserver answers 409 Conflict when the
//! stored version differs — so a takeover is one such replace that sets `holderIdentity`,
//! `acquireTime`, `renewTime`, `leaseDurationSeconds` and `leaseTransitions + 1` together,
//! renewals are guarded the same way, and a release writes `holderIdentity: null` keeping
//! `leaseTransitions`. A create of an existing Lease is also 409 (AlreadyExists). This gives
//! the same fencing that apply was meant to give, and is what our field notes recommend.
//!
//! The fenced write is sent as a JSON merge patch carrying `metadata.resourceVersion`, not as
//! a `PUT`: Leases allow create-on-update, so a `PUT` based on the version of a Lease deleted
//! meanwhile (`kubectl delete lease`) would *recreate* it instead of conflicting — measured
//! against a real kube-apiserver (`control/tests/lease_kube_real.rs`). A patch never creates:
//! a deleted Lease answers 404 (not written), a changed one 409. Absent fields are written as
//! explicit `null`s, so a release really clears `holderIdentity`.
//!
//! The times written are wall-clock `MicroTime`s for humans and `kubectl`; candidates never
//! compare them with a clock, only notice that the record changed (see [`crate::election`]).

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tracing::warn;

use super::{BackendError, LeaseBackend, LEASE_NAME};
use crate::election::{LeaseRecord, WriteError};

/// The Lease object in one namespace.
#[derive(Clone)]
pub struct KubeLease {
    api: Api<Lease>,
    name: String,
}

impl std::fmt::Debug for KubeLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeLease")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl KubeLease {
    /// The Lease `name` in `namespace`, through `client`.
    pub fn new(client: Client, namespace: &str, name: impl Into<String>) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.into(),
        }
    }

    /// `kaas-controller` in the pod's own namespace, with the in-cluster (or kubeconfig)
    /// credentials the environment provides.
    pub async fn in_pod() -> Result<Self, kube::Error> {
        let client = Client::try_default().await?;
        let namespace = client.default_namespace().to_owned();
        Ok(Self::new(client, &namespace, LEASE_NAME))
    }

    fn to_lease(&self, record: &LeaseRecord, resource_version: Option<&str>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                resource_version: resource_version.map(str::to_owned),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: record.holder.clone(),
                acquire_time: record.acquire_time.as_deref().map(micro_time),
                renew_time: record.renew_time.as_deref().map(micro_time),
                lease_duration_seconds: Some(
                    i32::try_from(record.lease_duration_ms.div_ceil(1000)).unwrap_or(i32::MAX),
                ),
                lease_transitions: Some(
                    i32::try_from(record.lease_transitions).unwrap_or(i32::MAX),
                ),
                ..LeaseSpec::default()
            }),
        }
    }
}

/// The election hands us either a stamp it read from the Lease (an RFC 3339 time: kept as is,
/// so an unchanged field stays unchanged) or its own fresh monotonic stamp (not a time: the
/// moment of this write, as a wall-clock `MicroTime`).
fn micro_time(stamp: &str) -> MicroTime {
    MicroTime(
        stamp
            .parse::<Timestamp>()
            .unwrap_or_else(|_| Timestamp::now()),
    )
}

/// The Lease as the election sees it. A Lease with no spec reads as free, like a missing one.
fn to_record(lease: Lease) -> LeaseRecord {
    let spec = lease.spec.unwrap_or_default();
    LeaseRecord {
        holder: spec.holder_identity.filter(|h| !h.is_empty()),
        acquire_time: spec.acquire_time.map(|t| t.0.to_string()),
        renew_time: spec.renew_time.map(|t| t.0.to_string()),
        lease_duration_ms: spec
            .lease_duration_seconds
            .map_or(0, |s| u64::try_from(s).unwrap_or(0) * 1000),
        lease_transitions: spec
            .lease_transitions
            .map_or(0, |t| u64::try_from(t).unwrap_or(0)),
        resource_version: lease.metadata.resource_version.unwrap_or_default(),
    }
}

/// 409 (Conflict on replace, AlreadyExists on create) is a lost compare-and-swap; anything else
/// leaves the outcome unknown, which the election treats as not written.
fn write_error(name: &str, e: kube::Error) -> WriteError {
    match e {
        kube::Error::Api(status) if status.is_conflict() || status.is_already_exists() => {
            WriteError::Conflict
        }
        e => {
            warn!(lease = name, "lease write failed: {e}");
            WriteError::Unavailable
        }
    }
}

impl LeaseBackend for KubeLease {
    async fn get(&self) -> Result<LeaseRecord, BackendError> {
        match self.api.get_opt(&self.name).await {
            Ok(Some(lease)) => Ok(to_record(lease)),
            Ok(None) => Ok(LeaseRecord::default()),
            Err(e) => Err(BackendError(format!("lease {}: {e}", self.name))),
        }
    }

    async fn create(&self, record: &LeaseRecord) -> Result<LeaseRecord, WriteError> {
        let lease = self.to_lease(record, None);
        self.api
            .create(&PostParams::default(), &lease)
            .await
            .map(to_record)
            .map_err(|e| write_error(&self.name, e))
    }

    /// The fenced write: the apiserver applies the merge patch only if the Lease's
    /// `resourceVersion` is still `expected_resource_version`, and never creates a deleted
    /// Lease (see the module docs).
    async fn replace(
        &self,
        record: &LeaseRecord,
        expected_resource_version: &str,
    ) -> Result<LeaseRecord, WriteError> {
        let stamp = |t: &Option<String>| {
            t.as_deref()
                .map(|t| serde_json::to_value(micro_time(t)).expect("MicroTime serializes"))
                .unwrap_or(serde_json::Value::Null)
        };
        let lease = self.to_lease(record, None);
        let spec = lease.spec.unwrap_or_default();
        let body = serde_json::json!({
            "metadata": { "resourceVersion": expected_resource_version },
            "spec": {
                "holderIdentity": record.holder,
                "acquireTime": stamp(&record.acquire_time),
                "renewTime": stamp(&record.renew_time),
                "leaseDurationSeconds": spec.lease_duration_seconds,
                "leaseTransitions": spec.lease_transitions,
            },
        });
        self.api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .map(to_record)
            .map_err(|e| write_error(&self.name, e))
    }
}
