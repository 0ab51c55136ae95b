//! Cluster mode on the control thread: the glue between `kaas_control` (election, heartbeat,
//! balancer, handover, assignment file) and the shards (`kaas_shard::cluster`).
//!
//! Every broker runs, as tasks of the control thread's tokio runtime:
//!
//! - a **candidate** in the `kaas-controller` Lease election ([`ElectionDriver`]). The Lease
//!   holder's identity is `<broker id>@<heartbeat address>`, which is how the others find the
//!   controller to dial;
//! - the **heartbeat client**, which reports this broker's status and turns the controller's
//!   acknowledgements into the write fence ([`ClusterView::extend_fence`]);
//! - the **assignment watcher** and the **applier**: every accepted `assignment.json` is diffed
//!   against the last applied one, and the shards relinquish, then the new view is published,
//!   then the shards take over — in that order, so a partition is never served by this broker
//!   under an assignment that gives it to someone else;
//! - a **catalog reload** every second, so topics created on other brokers appear here.
//!
//! The broker holding the Lease also runs the **controller**: the heartbeat server and a loop
//! that recomputes the assignment (balancer, then the handover rules of
//! [`kaas_control::handover`]) and writes `assignment.json` when it changed.
//!
//! Nothing here decides anything subtle: the decisions are the pure functions of `kaas_control`
//! (`election`, `balancer`, `handover`, `assignment::accept`/`diff`), tested on their own.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use kaas_control::assignment::{
    assignment_chain, diff, Assignment, AssignmentWatcher, DEFAULT_POLL_INTERVAL,
};
use kaas_control::balancer::{BrokerId, TopicPartition};
use kaas_control::election::ElectionConfig;
use kaas_control::handover::Timing;
use kaas_control::heartbeat::{ClientConfig, ControllerEvent, HeartbeatClient, LocalStatus};
use kaas_control::lease::file::FileLease;
use kaas_control::lease::kube::KubeLease;
use kaas_control::lease::{ElectionDriver, Leadership, LeaseBackend};
use kaas_control::set_if_changed;
use kaas_shard::catalog::Catalog;
use kaas_shard::cluster::{ClusterState, ClusterView, ControlMsg};
use kaas_shard::shard::owner_shard;
use tokio::sync::watch;
use tokio::time::Instant;

mod controller;
mod drain;
mod stream_report;

use controller::controller_loop;

/// Which Lease backend elects the controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LeaseKind {
    /// The Kubernetes Lease `kaas-controller` in the pod's namespace.
    Kube,
    /// `<data-dir>/__cluster/lease.json`, for several brokers sharing a directory.
    File,
}

/// Everything cluster mode needs from the command line.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub lease: LeaseKind,
    pub broker_id: i32,
    pub rack: Option<String>,
    pub heartbeat_listen: SocketAddr,
    /// `host:port` other brokers dial to reach this broker's heartbeat server.
    pub heartbeat_advertised: String,
    pub election: ElectionConfig,
    pub timing: Timing,
    /// How often a broker sends its status.
    pub status_interval: Duration,
    /// Controller: how long a (re)started broker is given no partition another alive broker
    /// leads (`--rebalance-hold-ms`).
    pub rebalance_hold: Duration,
    pub data_dir: PathBuf,
    pub advertised: (String, u16),
    /// Signs and checks heartbeat messages.
    pub key: kaas_control::heartbeat::auth::ClusterKey,
}

impl ClusterConfig {
    /// The Lease holder identity: `<id>@<heartbeat address>`.
    fn identity(&self) -> String {
        format!("{}@{}", self.broker_id, self.heartbeat_advertised)
    }

    /// The election's guaranteed gap between a holder's deadline and a successor's start.
    fn election_gap(&self) -> Duration {
        Duration::from_millis(
            self.election
                .lease_duration_ms
                .saturating_sub(self.election.renew_deadline_ms),
        )
    }
}

/// Splits a Lease holder identity into broker id and heartbeat address.
pub fn parse_identity(identity: &str) -> Option<(i32, String)> {
    let (id, addr) = identity.split_once('@')?;
    Some((id.parse().ok()?, addr.to_string()))
}

/// What the shards expose to the control thread.
pub struct Shards {
    pub view: Arc<ClusterView>,
    pub control: Vec<kaas_shard::control_channel::ControlSender>,
    pub catalog: Arc<Catalog>,
}

/// Handles the binary keeps to drive a drain and read the state.
pub struct ClusterHandle {
    /// Set to true on SIGTERM: the broker reports draining and stops being a candidate.
    pub drain: watch::Sender<bool>,
    /// The applier's view of what this broker serves.
    pub status: watch::Receiver<LocalStatus>,
    /// The last accepted assignment.
    pub assignment: watch::Receiver<Option<Arc<Assignment>>>,
    /// The election as this broker sees it.
    pub leadership: watch::Receiver<Leadership>,
    /// The shared data directory, where draining brokers leave their markers.
    data_dir: PathBuf,
}

impl ClusterHandle {
    /// Waits (at most `timeout`) until the accepted assignment gives this broker no partition,
    /// holds none in handover from it, and it serves none — or no other broker is left to
    /// take them (see [`drain::may_stop`]).
    pub async fn drained(&mut self, me: i32, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let dir = self.data_dir.clone();
            let draining = tokio::task::spawn_blocking(move || drain::draining(&dir))
                .await
                .unwrap_or_default();
            let done = drain::may_stop(
                self.assignment.borrow().as_deref(),
                me,
                self.status.borrow().partitions.is_empty(),
                &draining,
            );
            if done {
                return true;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return false,
                _ = self.status.changed() => {}
                _ = self.assignment.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
    }
}

/// Starts cluster mode on the current (control thread) runtime.
#[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
pub async fn start(config: ClusterConfig, shards: Shards) -> anyhow::Result<ClusterHandle> {
    let config = Arc::new(config);
    let shards = Arc::new(shards);
    // Before anything else: a marker left by an earlier drain of this broker would let the
    // others stop as if it could not take their partitions.
    drain::unmark(&config.data_dir, config.broker_id).with_context(|| {
        format!(
            "removing this broker's drain marker in {}",
            config.data_dir.join("__cluster/draining").display()
        )
    })?;
    let (drain_tx, drain_rx) = watch::channel(false);
    // Notified when the controller closes this broker's heartbeat stream: the Lease is read
    // again at once instead of at the next retry period (see ElectionDriver::with_nudge).
    let nudge = Arc::new(tokio::sync::Notify::new());
    let leadership = match config.lease {
        LeaseKind::File => start_election(
            &config,
            FileLease::new(&config.data_dir),
            drain_rx.clone(),
            nudge.clone(),
        )?,
        LeaseKind::Kube => {
            let backend = KubeLease::in_pod()
                .await
                .context("connecting to the Kubernetes API for the kaas-controller Lease (run in a pod with a service account allowed to get/create/update leases, or use --lease file)")?;
            start_election(&config, backend, drain_rx.clone(), nudge.clone())?
        }
    };

    let watcher = AssignmentWatcher::new(assignment_chain(&config.data_dir), DEFAULT_POLL_INTERVAL);
    let notifier = watcher.notifier();
    shards.view.set_refresh({
        let notifier = notifier.clone();
        move || notifier.notify()
    });
    let lease_epoch = watcher.lease_epoch();
    let assignment_rx = watcher.subscribe();
    // The watcher starts only once the Lease has been read: before that the epoch fence would
    // compare against 0 and accept a file left by a deposed controller.
    {
        let mut first = leadership.clone();
        let epoch = lease_epoch.clone();
        tokio::spawn(async move {
            // Wait for a Lease read that shows a holder (there is one within a retry period
            // of any broker starting).
            if first
                .wait_for(|l| l.holder.is_some() || l.epoch > 0)
                .await
                .is_err()
            {
                return;
            }
            epoch.observe(first.borrow().epoch);
            watcher.run().await;
        });
    }

    // The controller's address follows the Lease holder. Only a controller's acknowledgement
    // opens this broker's write fence: a Lease read never does (see kaas_control::handover).
    let (controller_tx, controller_rx) = watch::channel::<Option<String>>(None);
    {
        let mut leadership = leadership.clone();
        let lease_epoch = lease_epoch.clone();
        let view = shards.view.clone();
        tokio::spawn(async move {
            loop {
                let l = leadership.borrow_and_update().clone();
                lease_epoch.observe(l.epoch);
                let holder = l.holder.as_deref().and_then(parse_identity);
                view.set_lease_holder(holder.as_ref().map(|(id, _)| *id));
                // The heartbeat client re-dials on every notification: only real changes.
                set_if_changed(&controller_tx, holder.map(|(_, addr)| addr));
                if leadership.changed().await.is_err() {
                    return;
                }
            }
        });
    }

    let mut local = LocalStatus::new(
        BrokerId(config.broker_id),
        config.advertised.0.clone(),
        config.advertised.1,
    );
    local.rack = config.rack.clone();
    let (status_tx, status_rx) = watch::channel(local);
    let client_config = ClientConfig {
        status_interval: config.status_interval,
        silence_timeout: config.timing.broker_fence.max(Duration::from_secs(2)),
        key: Some(config.key.clone()),
        ..ClientConfig::default()
    };
    let (_client, mut events) =
        HeartbeatClient::spawn(client_config, controller_rx, status_rx.clone());
    {
        let shards = shards.clone();
        let fence = config.timing.broker_fence;
        let lease_epoch = lease_epoch.clone();
        tokio::spawn(async move {
            let mut report = stream_report::StreamReport::new(Instant::now(), fence);
            while let Some(event) = events.recv().await {
                match event {
                    ControllerEvent::Ping {
                        controller_epoch,
                        acked_sent_at,
                    } => {
                        lease_epoch.observe(controller_epoch);
                        if let Some(sent) = acked_sent_at {
                            shards.view.extend_fence((sent + fence).into_std());
                        }
                    }
                    ControllerEvent::AssignmentChanged {
                        controller_epoch, ..
                    } => {
                        lease_epoch.observe(controller_epoch);
                        notifier.notify();
                    }
                    ControllerEvent::Connected { addr } => match report.connected(Instant::now()) {
                        stream_report::Report::Open { down_for: Some(d) } => tracing::info!(
                            controller = %addr,
                            down_ms = d.as_millis() as u64,
                            "heartbeat stream to the controller open again"
                        ),
                        _ => {
                            tracing::info!(controller = %addr, "heartbeat stream to the controller open")
                        }
                    },
                    ControllerEvent::Disconnected { addr, reason } => {
                        // A controller that stepped down or released the Lease closes the
                        // stream first: learn its successor now, not a retry period later,
                        // so that a successor acknowledges this broker within its fence.
                        nudge.notify_one();
                        match report.disconnected(Instant::now()) {
                            stream_report::Report::Lost => {
                                tracing::warn!(controller = %addr, %reason, "heartbeat stream to the controller lost; writes stop being acknowledged if it is not back within the write fence (re-dialling; the next message is when it is back)")
                            }
                            stream_report::Report::Unreachable { down_for } => tracing::warn!(
                                controller = %addr,
                                %reason,
                                down_ms = down_for.as_millis() as u64,
                                "cannot open the heartbeat stream to the controller: this broker acknowledges no writes until it opens; check that the controller's heartbeat address is reachable from here (re-dialling; the next message is when it opens)"
                            ),
                            _ => {
                                tracing::debug!(controller = %addr, %reason, "heartbeat stream to the controller still down")
                            }
                        }
                    }
                }
            }
        });
    }

    // Draining is reported in the status.
    {
        let status_tx = status_tx.clone();
        let mut drain = drain_rx.clone();
        let view = shards.view.clone();
        let (data_dir, me) = (config.data_dir.clone(), config.broker_id);
        tokio::spawn(async move {
            while drain.changed().await.is_ok() {
                if *drain.borrow() {
                    view.set_draining();
                    status_tx.send_modify(|s| s.draining = true);
                    let marked =
                        tokio::task::spawn_blocking(move || drain::mark(&data_dir, me)).await;
                    if let Ok(Err(e)) = marked {
                        tracing::warn!(error = %e, "could not leave a drain marker; if every broker stops at once, this one waits the drain timeout");
                    }
                    return;
                }
            }
        });
    }

    tokio::spawn(apply_loop(
        config.clone(),
        shards.clone(),
        assignment_rx.clone(),
        status_tx,
    ));
    tokio::spawn(catalog_reload_loop(shards.clone()));
    tokio::spawn(controller_loop(
        config.clone(),
        shards.clone(),
        leadership.clone(),
        assignment_rx.clone(),
    ));

    Ok(ClusterHandle {
        drain: drain_tx,
        status: status_rx,
        assignment: assignment_rx,
        leadership,
        data_dir: config.data_dir.clone(),
    })
}

/// Runs this broker's candidate; it releases the Lease (if held) and stops competing when a
/// drain begins.
fn start_election<B: LeaseBackend + 'static>(
    config: &ClusterConfig,
    backend: B,
    mut drain: watch::Receiver<bool>,
    nudge: Arc<tokio::sync::Notify>,
) -> anyhow::Result<watch::Receiver<Leadership>> {
    let driver = ElectionDriver::new(backend, config.identity(), config.election)
        .context("invalid lease timings")?
        .with_nudge(nudge.clone());
    // Our own channel, alive for the whole process: a draining broker stops competing but must
    // keep following the Lease holder, to heartbeat to whoever moves its partitions.
    let (tx, rx) = watch::channel(Leadership::default());
    let forward = |mut inner: watch::Receiver<Leadership>, tx: watch::Sender<Leadership>| async move {
        loop {
            let view = inner.borrow_and_update().clone();
            set_if_changed(&tx, view);
            if inner.changed().await.is_err() {
                return;
            }
        }
    };
    let (identity, election) = (config.identity(), config.election);
    tokio::spawn(async move {
        let candidate = tokio::spawn(forward(driver.subscribe(), tx.clone()));
        let backend = driver
            .run(async move {
                while !*drain.borrow_and_update() {
                    if drain.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
            })
            .await;
        candidate.abort();
        // Drained: the Lease was released if held. Observe only from now on — a released
        // candidate never acquires again.
        let Ok(observer) = ElectionDriver::new(backend, identity, election) else {
            return;
        };
        let mut observer = observer.with_nudge(nudge);
        observer.release().await;
        tokio::spawn(forward(observer.subscribe(), tx));
        observer.run(std::future::pending::<()>()).await;
    });
    Ok(rx)
}

/// Follows the catalog files on the shared volume every second.
async fn catalog_reload_loop(shards: Arc<Shards>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        reload_catalog(&shards).await;
    }
}

/// Re-reads the catalog (topics created, grown, deleted or reconfigured by other brokers);
/// when configs changed, the shards re-apply them to their open logs. Returns whether the
/// catalog was read (the snapshot is then current).
pub(super) async fn reload_catalog(shards: &Shards) -> bool {
    let c = shards.catalog.clone();
    match tokio::task::spawn_blocking(move || c.reload()).await {
        Ok(Ok(true)) => {
            for tx in &shards.control {
                let _ = tx.send(ControlMsg::ConfigsChanged);
            }
            true
        }
        Ok(Ok(false)) => true,
        Ok(Err(e)) => {
            tracing::warn!("re-reading the topic catalog: {e}");
            false
        }
        Err(e) => {
            tracing::warn!("catalog reload task failed: {e}");
            false
        }
    }
}

/// Applies every accepted assignment to the shards, in order. Take-overs that fail (a topic
/// not yet visible, an IO error) are retried every second.
async fn apply_loop(
    config: Arc<ClusterConfig>,
    shards: Arc<Shards>,
    mut assignments: watch::Receiver<Option<Arc<Assignment>>>,
    status: watch::Sender<LocalStatus>,
) {
    let me = BrokerId(config.broker_id);
    let mut applied: Option<Arc<Assignment>> = None;
    let mut retry: BTreeSet<TopicPartition> = BTreeSet::new();
    loop {
        let next = assignments.borrow_and_update().clone();
        if let Some(next) = next {
            if applied.as_ref().map(|a| a.order_key()) != Some(next.order_key()) {
                reload_catalog(&shards).await;
                let d = diff(applied.as_deref(), &next, me);
                retry.retain(|tp| next.leader(tp) == Some(me));
                let started = std::time::Instant::now();
                if !d.relinquish.is_empty() {
                    send_to_shards(&shards, &d.relinquish, Apply::Relinquish).await;
                }
                // Published before the revalidation below, whose take-overs run at the leader
                // epochs of this file.
                shards.view.publish(ClusterState::new(Some(next.clone())));
                let kept = kept_to_revalidate(applied.as_deref(), &next, me);
                if !kept.is_empty() {
                    retry.extend(send_to_shards(&shards, &kept, Apply::Revalidate).await);
                }
                release_groups(&shards).await;
                let failed = send_to_shards(&shards, &d.take_over, Apply::TakeOver).await;
                retry.extend(failed);
                tracing::info!(
                    epoch = next.controller_epoch,
                    version = next.assignment_version,
                    took_over = d.take_over.len(),
                    relinquished = d.relinquish.len(),
                    failed = retry.len(),
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "applied assignment"
                );
                applied = Some(next);
                report(&status, applied.as_deref(), me, &retry);
            }
        }
        tokio::select! {
            r = assignments.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(Duration::from_secs(1)), if !retry.is_empty() => {
                let again: Vec<TopicPartition> = retry.iter().cloned().collect();
                reload_catalog(&shards).await;
                retry = send_to_shards(&shards, &again, Apply::TakeOver).await.into_iter().collect();
                report(&status, applied.as_deref(), me, &retry);
            }
        }
    }
}

/// The partitions `me` leads in both `applied` and `next` that its shards must check, and
/// reopen if the check fails (`Shard::revalidate`):
/// - every one, when `next` does not follow `applied` (versions skipped while paused, or a new
///   controller): skipped files may have moved a partition away and back, another broker then
///   led it and wrote, and this broker's open log no longer knows the partition's end;
/// - those whose leader epoch `next` changed: files this broker did not see in between moved
///   it to none and back, and the leader must run at the epoch the file gives, which every
///   broker reports (`kaas_control::epochs`). Files in sequence never change a kept
///   partition's epoch; this only makes the rule independent of how the files were based.
fn kept_to_revalidate(
    applied: Option<&Assignment>,
    next: &Assignment,
    me: BrokerId,
) -> Vec<TopicPartition> {
    let Some(applied) = applied else {
        return Vec::new();
    };
    let consecutive =
        (applied.controller_epoch, applied.assignment_version + 1) == next.order_key();
    next.led_by(me)
        .filter(|tp| applied.leader(tp) == Some(me))
        .filter(|tp| {
            !consecutive
                || applied.leader_epoch(&tp.topic, tp.partition)
                    != next.leader_epoch(&tp.topic, tp.partition)
        })
        .cloned()
        .collect()
}

/// Asks every shard to close the consumer groups this broker no longer coordinates.
async fn release_groups(shards: &Shards) {
    let waits = shards.control.iter().filter_map(|tx| {
        let (done, wait) = futures::channel::oneshot::channel();
        tx.send(ControlMsg::ReleaseGroups { done })
            .ok()
            .map(|_| wait)
    });
    futures::future::join_all(waits).await;
}

/// Publishes what this broker has applied and serves, for the next heartbeat.
fn report(
    status: &watch::Sender<LocalStatus>,
    applied: Option<&Assignment>,
    me: BrokerId,
    failed: &BTreeSet<TopicPartition>,
) {
    let Some(a) = applied else { return };
    let partitions: Vec<TopicPartition> = a
        .led_by(me)
        .filter(|tp| !failed.contains(*tp))
        .cloned()
        .collect();
    status.send_modify(|s| {
        s.applied_controller_epoch = a.controller_epoch;
        s.applied_assignment_version = a.assignment_version;
        s.partitions = partitions;
    });
}

/// What [`send_to_shards`] asks the shards to do with partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Apply {
    Relinquish,
    TakeOver,
    /// Reopen those another broker took over since this one opened them (see `apply_loop`).
    Revalidate,
}

/// Sends take-overs (or relinquishes, or revalidations) to the shards owning each partition
/// and waits for all. Returns the partitions whose take-over failed.
async fn send_to_shards(
    shards: &Shards,
    partitions: &[TopicPartition],
    kind: Apply,
) -> Vec<TopicPartition> {
    let n = shards.control.len();
    let mut per_shard: Vec<Vec<(String, i32)>> = vec![Vec::new(); n];
    for tp in partitions {
        per_shard[owner_shard(&tp.topic, tp.partition, n)].push((tp.topic.clone(), tp.partition));
    }
    let mut waits = Vec::new();
    let mut failed = Vec::new();
    for (shard, list) in per_shard.into_iter().enumerate() {
        if list.is_empty() {
            continue;
        }
        let copy = list.clone();
        let (done, wait) = futures::channel::oneshot::channel();
        let msg = match kind {
            Apply::Relinquish => ControlMsg::Relinquish {
                partitions: list,
                done,
            },
            Apply::TakeOver => ControlMsg::TakeOver {
                partitions: list,
                done,
            },
            Apply::Revalidate => ControlMsg::Revalidate {
                partitions: list,
                done,
            },
        };
        let gone = |list: Vec<(String, i32)>| -> Vec<((String, i32), String)> {
            list.into_iter()
                .map(|tp| (tp, "shard stopped".to_string()))
                .collect()
        };
        // A send to a stopped shard drops `done`, so the wait below reports it as failed.
        let _ = shards.control[shard].send(msg);
        waits.push(async move { wait.await.unwrap_or_else(|_| gone(copy)) });
    }
    let what = match kind {
        Apply::Relinquish => "relinquish",
        Apply::TakeOver => "take-over",
        Apply::Revalidate => "revalidation",
    };
    let mut failures: Vec<_> = futures::future::join_all(waits)
        .await
        .into_iter()
        .flatten()
        .collect();
    // A topic deleted while its partitions were being opened (moments after its creation,
    // as KafkaJS's suite does) failed to open, here or because another broker removed its
    // directory first: nothing is left to serve or to retry, and the next assignment drops
    // it. Each used to be a WARN, then a retry and another WARN every second until then.
    // Only a catalog read now can tell: the assignment named the topic, so it existed.
    if kind != Apply::Relinquish && !failures.is_empty() && reload_catalog(shards).await {
        let catalog = shards.catalog.snapshot();
        failures.retain(|((topic, partition), why)| {
            let deleted = catalog.get(topic).is_none();
            if deleted {
                tracing::debug!(%topic, partition, reason = %why, "{what} dropped: the topic was deleted meanwhile");
            }
            !deleted
        });
    }
    for ((topic, partition), why) in failures {
        tracing::warn!(%topic, partition, reason = %why, "{what} failed");
        failed.push(TopicPartition::new(topic, partition));
    }
    failed
}

/// `/healthz` fields of cluster mode.
pub fn health_json(
    view: &ClusterView,
    assignment: Option<&Assignment>,
    status: &LocalStatus,
    leadership: &Leadership,
) -> serde_json::Value {
    let me = BrokerId(view.me());
    let assigned = assignment.map_or(0, |a| a.led_by(me).count());
    let fence = view.fence_remaining();
    serde_json::json!({
        "broker_id": view.me(),
        "controller_id": view.controller(),
        "is_controller": leadership.leads_now(),
        "controller_epoch": assignment.map(|a| a.controller_epoch),
        "lease_epoch": leadership.epoch,
        "assignment_version": assignment.map(|a| a.assignment_version),
        "partitions_assigned": assigned,
        "partitions_led": status.partitions.len(),
        "partitions_pending_handover": assignment.map_or(0, |a| a.pending.len()),
        "draining": view.draining(),
        "write_fence_open": view.may_acknowledge(),
        "write_fence_remaining_ms": if fence == Duration::MAX { None } else { Some(fence.as_millis() as u64) },
        "brokers": assignment.map(|a| a.brokers.iter().map(|b| serde_json::json!({
            "id": b.id.0, "host": b.host, "port": b.port, "rack": b.rack, "health": b.health,
        })).collect::<Vec<_>>()),
    })
}

/// Whether every partition the accepted assignment gives this broker is served (for /readyz).
pub fn serving_all_assigned(
    assignment: Option<&Assignment>,
    status: &LocalStatus,
    me: i32,
) -> bool {
    let Some(a) = assignment else { return false };
    if (a.controller_epoch, a.assignment_version)
        != (
            status.applied_controller_epoch,
            status.applied_assignment_version,
        )
    {
        return false;
    }
    let served: BTreeSet<&TopicPartition> = status.partitions.iter().collect();
    a.led_by(BrokerId(me)).all(|tp| served.contains(tp))
}

/// The StatefulSet ordinal from the pod's hostname (`kaas-2` → 2), for `--broker-id` in a pod.
pub fn ordinal_from_hostname() -> Option<i32> {
    let host = std::env::var("HOSTNAME").ok()?;
    host.rsplit_once('-')?.1.parse().ok()
}
