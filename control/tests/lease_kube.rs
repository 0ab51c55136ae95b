//! The `kube` Lease backend through the real kube client, against an in-repo stand-in for
//! kube-apiserver (`support/fake_apiserver.rs`) that implements the Lease endpoints with the
//! real API's resourceVersion conflicts, so these run in every `cargo test`. The same scenarios
//! run against a real kube-apiserver in `lease_kube_real.rs` (`tests/test_kube_lease.py`).

#[path = "support/fake_apiserver.rs"]
mod fake_apiserver;
#[path = "support/harness.rs"]
mod harness;

use fake_apiserver::FakeApiserver;
use kaas_control::election::{LeaseRecord, WriteError};
use kaas_control::lease::kube::KubeLease;
use kaas_control::lease::{LeaseBackend, LEASE_NAME};

const NS: &str = "kaas-test";

/// A client for the fake server: plain HTTP on loopback, no credentials.
fn backend(server: &FakeApiserver) -> KubeLease {
    let mut config = kube::Config::new(server.url().parse().expect("url"));
    config.default_namespace = NS.into();
    config.default_retry = false;
    let client = kube::Client::try_from(config).expect("client");
    KubeLease::new(client, NS, LEASE_NAME)
}

// Proves: one leader at a time, epoch +1 per change of holder, killed and cut-off holders
// replaced only after they stopped, a release keeps leaseTransitions — and every write was
// conditional on a resourceVersion.
#[tokio::test]
async fn failover_keeps_one_leader_and_a_rising_epoch() {
    let server = FakeApiserver::start().await;
    harness::failover_scenario(|| backend(&server)).await;
    let lease = server.lease(NS, LEASE_NAME).expect("lease exists");
    assert_eq!(lease["spec"]["leaseTransitions"], 4);
    assert_eq!(lease["spec"]["holderIdentity"], serde_json::Value::Null);
    let store = server.store.lock().unwrap();
    assert_eq!(store.unconditional_puts, 0, "an unfenced write was sent");
    assert!(
        store.conflicts > 0,
        "candidates should have raced at least once"
    );
}

// Proves: concurrent replaces (and creates) from one observed version have exactly one
// winner; the losers get 409, mapped to Conflict.
#[tokio::test]
async fn concurrent_writers_have_one_winner() {
    let server = FakeApiserver::start().await;
    harness::compare_and_swap_race(|| backend(&server)).await;
}

// Proves: the record maps onto the Lease fields the way kubectl and other tools read them,
// and a stale resourceVersion is a conflict.
#[tokio::test]
async fn lease_fields_and_conflicts() {
    let server = FakeApiserver::start().await;
    let lease = backend(&server);
    assert_eq!(lease.get().await.unwrap(), LeaseRecord::default());
    let record = LeaseRecord {
        holder: Some("kaas-0".into()),
        acquire_time: Some("12".into()),
        renew_time: Some("12".into()),
        lease_duration_ms: 15_000,
        lease_transitions: 1,
        resource_version: String::new(),
    };
    let stored = lease.compare_and_swap(&record).await.unwrap();
    let raw = server.lease(NS, LEASE_NAME).unwrap();
    assert_eq!(raw["spec"]["holderIdentity"], "kaas-0");
    assert_eq!(raw["spec"]["leaseDurationSeconds"], 15);
    assert_eq!(raw["spec"]["leaseTransitions"], 1);
    let renew_time = raw["spec"]["renewTime"].as_str().unwrap();
    assert!(
        renew_time.ends_with('Z') && renew_time.contains('T'),
        "{renew_time}"
    );
    assert_eq!(lease.get().await.unwrap(), stored);
    assert_eq!(lease.create(&record).await, Err(WriteError::Conflict));

    // Keeping a stamp read from the Lease keeps the field unchanged.
    let renewed = lease
        .compare_and_swap(&LeaseRecord {
            renew_time: Some("99".into()),
            ..stored.clone()
        })
        .await
        .unwrap();
    assert_eq!(renewed.acquire_time, stored.acquire_time);
    assert_ne!(renewed.resource_version, stored.resource_version);
    assert_eq!(
        lease.replace(&stored, &stored.resource_version).await,
        Err(WriteError::Conflict)
    );
}

// Proves: a client for an https apiserver (the in-pod case) can be built, i.e. a TLS crypto
// provider is compiled in; the fake server above only exercises plain HTTP.
#[tokio::test]
async fn https_client_builds() {
    let config = kube::Config::new("https://127.0.0.1:1".parse().expect("url"));
    let client = kube::Client::try_from(config).expect("https client");
    let lease = KubeLease::new(client, NS, LEASE_NAME);
    // Nothing listens there: the read fails as unavailable, it does not panic.
    assert!(lease.get().await.is_err());
}
