//! The `kube` Lease backend against a **real kube-apiserver** (with etcd behind it), the same
//! scenarios as `lease_kube.rs` runs against the in-repo fake: acquiring on an empty namespace,
//! a stale resourceVersion being a conflict, a takeover raising `leaseTransitions` by exactly
//! one, a release keeping the count, and two candidates never leading at once.
//!
//! **Opt-in.** These tests need a running apiserver and the path of a kubeconfig for it in
//! `KAAS_KUBE_APISERVER_KUBECONFIG`. When that variable is unset each test passes without
//! checking anything, and the first to start prints
//! `SKIPPED (no real kube-apiserver): every test in lease_kube_real ...` to stderr (uncaptured,
//! so it shows in a plain `cargo test`). To run them:
//!
//! ```text
//! scripts/install-kube-apiserver.sh      # builds kube-apiserver from the Go module proxy, once
//! scripts/run-kube-apiserver.sh cargo test -p kaas-control --test lease_kube_real -- --nocapture
//! ```
//!
//! or `pytest tests/test_kube_lease.py`, which does the same whenever the binaries are installed
//! (KAAS_KUBE_TESTS=1 makes missing binaries a failure) and fails if any test here skipped. The kubeconfig's user must be allowed to create namespaces and Leases
//! (run-kube-apiserver.sh's token is in `system:masters`). Every test works in a namespace of its
//! own, `kaas-real-<test>-<random>`, created first and deleted (best effort) at the end; on an
//! apiserver without kube-controller-manager a deleted namespace stays `Terminating`, which is
//! harmless for a throwaway server.
//!
//! Two behaviours of the real server that the fake does not share are pinned here:
//! - [`identical_replace_is_a_no_op_that_keeps_the_resource_version`]: a `PUT` whose content
//!   equals the stored object is not written, so the resourceVersion does not change and a
//!   second writer holding the same version is not refused. The election never sends such a
//!   write (every acquire, renewal and release changes `renewTime` or `holderIdentity`), so its
//!   fencing is unaffected; the race below therefore has every writer write something new, as
//!   the election's writes do.
//! - [`fenced_write_never_recreates_a_deleted_lease`]: Leases allow create-on-update, so a
//!   `PUT` carrying the resourceVersion of a Lease deleted meanwhile (e.g. `kubectl delete
//!   lease`) would recreate it; the backend's merge patch does not.

// The harness's recording and checking helpers are used here, with drivers of our own (the
// harness's run at timings too short for a real apiserver on a busy machine).
#[allow(dead_code)]
#[path = "support/harness.rs"]
mod harness;

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use harness::{await_single_leader, check_history, leaders, terms, Cuttable, Events, Node};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kaas_control::election::{ElectionConfig, LeaseRecord, WriteError};
use kaas_control::lease::kube::KubeLease;
use kaas_control::lease::{ElectionDriver, Leadership, LeaseBackend, LEASE_NAME};
use kube::api::{DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use tokio::time::{sleep, Instant};

/// The kubeconfig of the real apiserver to test against; unset = skip.
const ENV: &str = "KAAS_KUBE_APISERVER_KUBECONFIG";

/// Timings for the election scenarios: the harness's `FAST` ordering (duration > deadline >
/// retry, fencing margin 40 % of the duration) at twice its length, and a 1 s bound on each
/// request, because the apiserver and etcd run niced on a shared 2-core machine and a real
/// request can take a few hundred milliseconds there.
const REAL: ElectionConfig = ElectionConfig {
    lease_duration_ms: 2_000,
    renew_deadline_ms: 1_200,
    retry_period_ms: 200,
};
const IO_TIMEOUT: Duration = Duration::from_millis(1_000);

/// A client for the apiserver named by [`ENV`], or `None` (after saying so) when unset.
async fn real_client(test: &str) -> Option<Client> {
    let Some(path) = std::env::var_os(ENV) else {
        // Once per process, straight to stderr (one write, past the test harness's capture), so
        // the skip shows in a plain `cargo test` without being repeated by every test.
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            let line = format!(
                "\nSKIPPED (no real kube-apiserver): every test in lease_kube_real (first: {test}): \
                 {ENV} is not set; run under scripts/run-kube-apiserver.sh to test against a \
                 real apiserver\n"
            );
            let _ = std::io::stderr().write_all(line.as_bytes());
        });
        return None;
    };
    let kubeconfig = Kubeconfig::read_from(&path)
        .unwrap_or_else(|e| panic!("{ENV}={}: {e}", path.to_string_lossy()));
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("kubeconfig");
    config.default_retry = false;
    println!(
        "{test}: against the real kube-apiserver at {}",
        config.cluster_url
    );
    Some(Client::try_from(config).expect("client"))
}

/// A fresh namespace of the test's own; deleted when dropped (best effort, in the background).
struct TestNamespace {
    client: Client,
    name: String,
}

impl TestNamespace {
    async fn create(client: &Client, test: &str) -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_nanos();
        let name = format!(
            "kaas-real-{test}-{:x}",
            nanos ^ u128::from(std::process::id())
        );
        let name = name[..name.len().min(63)].trim_end_matches('-').to_owned();
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
        Self {
            client: client.clone(),
            name,
        }
    }

    fn lease(&self) -> KubeLease {
        KubeLease::new(self.client.clone(), &self.name, LEASE_NAME)
    }

    /// The Lease as the apiserver stores it (for fields the record does not carry).
    async fn raw(&self) -> Lease {
        Api::<Lease>::namespaced(self.client.clone(), &self.name)
            .get(LEASE_NAME)
            .await
            .expect("raw lease")
    }

    async fn delete(self) {
        let _ = Api::<Namespace>::all(self.client.clone())
            .delete(&self.name, &DeleteParams::default())
            .await;
    }
}

fn record(holder: &str, transitions: u64, resource_version: &str) -> LeaseRecord {
    LeaseRecord {
        holder: Some(holder.into()),
        acquire_time: Some("12".into()),
        renew_time: Some("12".into()),
        lease_duration_ms: 15_000,
        lease_transitions: transitions,
        resource_version: resource_version.into(),
    }
}

// Proves: on an empty namespace the Lease reads as free, the first compare-and-swap creates it
// with the fields kubectl reads (holderIdentity, leaseDurationSeconds, leaseTransitions, RFC 3339
// MicroTimes), a second handle reads the same record, and a second create is a conflict
// (AlreadyExists) that changes nothing.
#[tokio::test]
async fn acquire_on_an_empty_namespace() {
    let Some(client) = real_client("acquire_on_an_empty_namespace").await else {
        return;
    };
    let ns = TestNamespace::create(&client, "acquire").await;
    let lease = ns.lease();
    assert_eq!(lease.get().await.unwrap(), LeaseRecord::default());

    let stored = lease
        .compare_and_swap(&record("kaas-0", 1, ""))
        .await
        .unwrap();
    assert_eq!(stored.holder.as_deref(), Some("kaas-0"));
    assert_eq!(stored.lease_transitions, 1);
    assert_eq!(stored.lease_duration_ms, 15_000);
    assert!(!stored.resource_version.is_empty());

    let raw = ns.raw().await;
    let spec = raw.spec.clone().expect("spec");
    assert_eq!(spec.holder_identity.as_deref(), Some("kaas-0"));
    assert_eq!(spec.lease_duration_seconds, Some(15));
    assert_eq!(spec.lease_transitions, Some(1));
    let json = serde_json::to_value(&raw).unwrap();
    for field in ["acquireTime", "renewTime"] {
        let t = json["spec"][field].as_str().unwrap_or_default();
        assert!(t.ends_with('Z') && t.contains('T'), "{field}: {t:?}");
    }

    assert_eq!(ns.lease().get().await.unwrap(), stored, "another handle");
    assert_eq!(
        lease.create(&record("kaas-1", 1, "")).await,
        Err(WriteError::Conflict)
    );
    assert_eq!(
        lease.get().await.unwrap(),
        stored,
        "a lost create changes nothing"
    );
    ns.delete().await;
}

// Proves: a replace carrying a resourceVersion that is no longer current is a 409 mapped to
// Conflict and leaves the Lease unchanged; a renewal gets a new version and keeps a stamp read
// from the Lease unchanged.
#[tokio::test]
async fn stale_resource_version_is_a_conflict() {
    let Some(client) = real_client("stale_resource_version_is_a_conflict").await else {
        return;
    };
    let ns = TestNamespace::create(&client, "stale").await;
    let lease = ns.lease();
    let stored = lease
        .compare_and_swap(&record("kaas-0", 1, ""))
        .await
        .unwrap();

    let renewed = lease
        .compare_and_swap(&LeaseRecord {
            renew_time: Some("99".into()),
            ..stored.clone()
        })
        .await
        .unwrap();
    assert_eq!(renewed.acquire_time, stored.acquire_time, "kept stamp");
    assert_ne!(renewed.renew_time, stored.renew_time, "fresh stamp");
    assert_ne!(renewed.resource_version, stored.resource_version);

    // A takeover based on the old observation loses.
    let takeover = LeaseRecord {
        holder: Some("kaas-1".into()),
        lease_transitions: 2,
        ..stored.clone()
    };
    assert_eq!(
        lease.replace(&takeover, &stored.resource_version).await,
        Err(WriteError::Conflict)
    );
    assert_eq!(
        lease.compare_and_swap(&takeover).await,
        Err(WriteError::Conflict)
    );
    assert_eq!(
        lease.get().await.unwrap(),
        renewed,
        "a lost write changes nothing"
    );
    ns.delete().await;
}

// Leases allow create-on-update: a plain `PUT` carrying the resourceVersion of a Lease that
// was deleted meanwhile would recreate it (measured on this server), so a takeover based on a
// stale read could succeed. `KubeLease::replace` therefore sends a merge patch carrying
// `metadata.resourceVersion`: a patch never creates, so the write fails (404 → not written) and
// the candidate re-reads a free Lease and creates it with POST, which is fenced by name.
#[tokio::test]
async fn fenced_write_never_recreates_a_deleted_lease() {
    let Some(client) = real_client("fenced_write_never_recreates_a_deleted_lease").await else {
        return;
    };
    let ns = TestNamespace::create(&client, "deleted").await;
    let lease = ns.lease();
    let stored = lease
        .compare_and_swap(&record("kaas-0", 7, ""))
        .await
        .unwrap();
    Api::<Lease>::namespaced(client.clone(), &ns.name)
        .delete(LEASE_NAME, &DeleteParams::default())
        .await
        .expect("delete lease");
    assert_eq!(
        lease.get().await.unwrap(),
        LeaseRecord::default(),
        "reads as free"
    );
    let renewal = LeaseRecord {
        renew_time: Some("13".into()),
        ..stored.clone()
    };
    assert_eq!(
        lease.replace(&renewal, &stored.resource_version).await,
        Err(WriteError::Unavailable),
        "a fenced write must not recreate a deleted Lease"
    );
    assert_eq!(lease.get().await.unwrap(), LeaseRecord::default());
    // A release (holder cleared) through the same patch really clears the field.
    let created = lease
        .compare_and_swap(&record("kaas-1", 8, ""))
        .await
        .unwrap();
    let released = lease
        .replace(
            &LeaseRecord {
                holder: None,
                ..created.clone()
            },
            &created.resource_version,
        )
        .await
        .unwrap();
    assert_eq!(released.holder, None);
    assert_eq!(released.lease_transitions, 8);
    assert_eq!(lease.get().await.unwrap().holder, None);
    ns.delete().await;
}

// Proves (a real-server behaviour the fake does not model): a replace whose content equals the
// stored Lease is accepted without a write — same resourceVersion — so a second identical
// replace from the same version is accepted too; a replace that changes anything gets a new
// version and fences the rest. The election's writes always change renewTime or the holder.
#[tokio::test]
async fn identical_replace_is_a_no_op_that_keeps_the_resource_version() {
    let Some(client) = real_client("identical_replace_is_a_no_op").await else {
        return;
    };
    let ns = TestNamespace::create(&client, "noop").await;
    let lease = ns.lease();
    let stored = lease
        .compare_and_swap(&record("kaas-0", 1, ""))
        .await
        .unwrap();
    let same = lease.compare_and_swap(&stored).await.unwrap();
    assert_eq!(same, stored, "no-op: same record, same resourceVersion");
    let same_again = lease.compare_and_swap(&stored).await.unwrap();
    assert_eq!(same_again, stored);

    let changed = lease
        .compare_and_swap(&LeaseRecord {
            renew_time: Some("13".into()),
            ..stored.clone()
        })
        .await
        .unwrap();
    assert_ne!(changed.resource_version, stored.resource_version);
    assert_eq!(
        lease.compare_and_swap(&stored).await,
        Err(WriteError::Conflict),
        "the identical write from the old version is fenced once anything changed"
    );
    ns.delete().await;
}

// Proves: of 8 candidates creating the missing Lease at once exactly one wins, and of 8
// candidates taking it over from one observed version (each writing a new holder, as a takeover
// does) exactly one wins, for several rounds; the losers get Conflict and the winner's record is
// the stored one.
#[tokio::test]
async fn concurrent_writers_have_one_winner() {
    let Some(client) = real_client("concurrent_writers_have_one_winner").await else {
        return;
    };
    let ns = TestNamespace::create(&client, "race").await;
    for round in 0..4u64 {
        let base = ns.lease().get().await.expect("read");
        let tasks: Vec<_> = (0..8)
            .map(|i| {
                let backend = ns.lease();
                let attempt = LeaseRecord {
                    holder: Some(format!("r{round}c{i}")),
                    lease_duration_ms: 1_000,
                    lease_transitions: base.lease_transitions + 1,
                    resource_version: base.resource_version.clone(),
                    ..LeaseRecord::default()
                };
                tokio::spawn(async move { backend.compare_and_swap(&attempt).await })
            })
            .collect();
        let mut won = Vec::new();
        for task in tasks {
            match task.await.expect("task") {
                Ok(stored) => won.push(stored),
                Err(e) => assert_eq!(e, WriteError::Conflict, "round {round}"),
            }
        }
        assert_eq!(won.len(), 1, "round {round}: {won:?}");
        let now = ns.lease().get().await.expect("read");
        assert_eq!(now, won[0], "the winner's record is the stored one");
        assert_ne!(now.resource_version, base.resource_version, "a new version");
        assert_eq!(now.lease_transitions, round + 1);
    }
    ns.delete().await;
}

/// Starts candidate `index` (identity `b{index}`) with the [`REAL`] timings and records what it
/// publishes into `events` (the harness's `spawn_node`, with other timings).
fn spawn_node<B: LeaseBackend + 'static>(index: usize, backend: B, events: &Events) -> Node<B> {
    let driver = ElectionDriver::new(backend, format!("b{index}"), REAL)
        .expect("config")
        .with_io_timeout(IO_TIMEOUT);
    harness::spawn_driver(index, driver, events)
}

// Proves: a Lease left by a holder that stopped renewing (here one written by a stranger, with
// leaseTransitions 41) is taken over only after the lease duration, with leaseTransitions raised
// by exactly one (42) and a fresh acquireTime; a release writes holderIdentity null and keeps
// 42; the next holder raises it to exactly 43.
#[tokio::test]
async fn takeover_raises_transitions_by_one_and_release_keeps_them() {
    let Some(client) = real_client("takeover_raises_transitions_by_one").await else {
        return;
    };
    let ns = TestNamespace::create(&client, "takeover").await;
    let stranger = LeaseRecord {
        lease_duration_ms: REAL.lease_duration_ms,
        ..record("gone", 41, "")
    };
    let left = ns.lease().compare_and_swap(&stranger).await.unwrap();
    let left_at = Instant::now();

    let events = Events::default();
    let node = spawn_node(0, ns.lease(), &events);
    let (_, epoch) = await_single_leader(&events, 2, &[0], Duration::from_secs(10)).await;
    let took_over = terms(&events)[0].start;
    assert_eq!(
        epoch, 42,
        "a takeover raises leaseTransitions by exactly one"
    );
    assert!(
        took_over >= left_at + Duration::from_millis(REAL.lease_duration_ms),
        "taken over {:?} after the stranger's last write",
        took_over - left_at
    );
    let raw = ns.raw().await.spec.expect("spec");
    assert_eq!(raw.holder_identity.as_deref(), Some("b0"));
    assert_eq!(raw.lease_transitions, Some(42));
    let held = ns.lease().get().await.unwrap();
    assert_ne!(held.acquire_time, left.acquire_time, "a fresh acquireTime");

    node.shutdown().await;
    let released = ns.raw().await.spec.expect("spec");
    assert_eq!(released.holder_identity, None, "released");
    assert_eq!(
        released.lease_transitions,
        Some(42),
        "a release keeps the count"
    );

    let next = spawn_node(1, ns.lease(), &events);
    let (leader, epoch) = await_single_leader(&events, 2, &[1], Duration::from_secs(10)).await;
    assert_eq!((leader, epoch), (1, 43));
    next.shutdown().await;
    assert_eq!(
        ns.raw().await.spec.expect("spec").lease_transitions,
        Some(43)
    );
    check_history(&terms(&events));
    ns.delete().await;
}

// Proves, with the election driver on the real server (the harness's failover story, at the
// REAL timings): one leader at epoch 1 that keeps the Lease by renewing; killed, it is replaced
// only after the lease duration at epoch 2; a holder cut off from the apiserver stops leading
// before its successor starts at epoch 3 and does not come back; a release keeps the count and
// the next holder gets epoch 4; terms never overlap (two candidates never both lead) and every
// change of holder raised the epoch by exactly one.
#[tokio::test]
async fn failover_keeps_one_leader_and_a_rising_epoch() {
    let Some(client) = real_client("failover_keeps_one_leader_and_a_rising_epoch").await else {
        return;
    };
    let ns = TestNamespace::create(&client, "failover").await;
    const N: usize = 4;
    let events = Events::default();
    let mut nodes = Vec::new();
    let mut cuts = Vec::new();
    for i in 0..3 {
        let backend = Cuttable::new(ns.lease());
        cuts.push(std::sync::Arc::clone(&backend.cut));
        nodes.push(Some(spawn_node(i, backend, &events)));
    }
    let within = Duration::from_secs(10);

    let (first, epoch) = await_single_leader(&events, N, &[0, 1, 2], within).await;
    assert_eq!(epoch, 1, "the first holder opens epoch 1");
    sleep(Duration::from_millis(3 * REAL.lease_duration_ms)).await;
    assert_eq!(
        leaders(&events, N),
        vec![(first, 1)],
        "renewals keep the holder"
    );

    let killed_at = Instant::now();
    nodes[first].take().unwrap().task.abort();
    events
        .lock()
        .unwrap()
        .push((killed_at, first, Leadership::default()));
    let rest: Vec<usize> = (0..3).filter(|i| *i != first).collect();
    let (second, epoch) = await_single_leader(&events, N, &rest, within).await;
    assert_eq!(epoch, 2, "a change of holder raises the epoch by one");
    let took_over = terms(&events)
        .iter()
        .find(|t| t.node == second)
        .expect("second term")
        .start;
    // The victim's last renewal was at most one retry period before the kill.
    let min_gap = REAL.lease_duration_ms - REAL.retry_period_ms;
    assert!(
        took_over >= killed_at + Duration::from_millis(min_gap),
        "taken over {:?} after the kill, before the lease duration",
        took_over - killed_at
    );

    cuts[second].store(true, std::sync::atomic::Ordering::SeqCst);
    let third = rest.iter().copied().find(|i| *i != second).unwrap();
    let (_, epoch) = await_single_leader(&events, N, &[third], within).await;
    assert_eq!(epoch, 3);
    assert!(
        !leaders(&events, N).iter().any(|(i, _)| *i == second),
        "the cut-off holder still claims to lead"
    );
    cuts[second].store(false, std::sync::atomic::Ordering::SeqCst);
    sleep(Duration::from_millis(REAL.lease_duration_ms)).await;
    assert_eq!(
        leaders(&events, N),
        vec![(third, 3)],
        "the old holder came back"
    );

    nodes[second].take().unwrap().shutdown().await;
    nodes[third].take().unwrap().shutdown().await;
    let stored = ns.lease().get().await.expect("read");
    assert_eq!(stored.holder, None, "released");
    assert_eq!(stored.lease_transitions, 3, "a release keeps the count");

    let late = spawn_node(3, Cuttable::new(ns.lease()), &events);
    let (_, epoch) = await_single_leader(&events, N, &[3], within).await;
    assert_eq!(epoch, 4, "the epoch continues past a release");
    late.shutdown().await;

    let history = terms(&events);
    assert_eq!(history.len(), 4, "{history:?}");
    check_history(&history);
    let raw = ns.raw().await.spec.expect("spec");
    assert_eq!(raw.lease_transitions, Some(4));
    assert_eq!(raw.holder_identity, None);
    ns.delete().await;
}
