//! The controller half of cluster mode: while this broker holds the Lease it serves the
//! heartbeat stream and runs controller rounds (`kaas_control::round`), writing
//! `assignment.json` when a round says so. Runs on the control thread's tokio runtime.
//!
//! What a round decides is pure and tested in `kaas_control`; this file is the IO around it:
//! binding the heartbeat port, claiming the controller epoch in the assignment file, checking
//! that the file this controller builds on is still the newest, and writing the result.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use kaas_control::assignment::{
    assignment_chain, claim_epoch, write_fenced, Assignment, FenceError, Health,
};
use kaas_control::balancer::{BrokerId, LeaderMap, TopicCounts, TopicPartition};
use kaas_control::heartbeat::{HeartbeatServer, ServerConfig};
use kaas_control::lease::Leadership;
use kaas_control::round;
use kaas_control::{epochs, handover};
use tokio::sync::watch;
use tokio::time::Instant;

use super::{ClusterConfig, Shards};

/// While this broker holds the Lease: serve heartbeats and keep `assignment.json` current.
#[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
pub(super) async fn controller_loop(
    config: Arc<ClusterConfig>,
    shards: Arc<Shards>,
    mut leadership: watch::Receiver<Leadership>,
    accepted: watch::Receiver<Option<Arc<Assignment>>>,
) {
    loop {
        // Wait to become controller.
        let (epoch, prev_holder) = loop {
            {
                let l = leadership.borrow_and_update();
                if l.leads_now() {
                    // The holder whose Lease ran out when we took it over: its own fence
                    // closed an election gap before our start. A released Lease gives no such
                    // gap (see kaas_control::handover).
                    let expired = l.expired_holder.as_deref().and_then(super::parse_identity);
                    break (l.epoch, expired.map(|(id, _)| BrokerId(id)));
                }
            }
            if leadership.changed().await.is_err() {
                return;
            }
        };
        tracing::info!(
            epoch,
            broker = config.broker_id,
            "this broker is the controller"
        );
        let listener = match bind_heartbeat(config.heartbeat_listen).await {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(listen = %config.heartbeat_listen, "cannot bind the heartbeat listener: {e}; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let server = HeartbeatServer::new(
            ServerConfig {
                ping_interval: Duration::from_secs(1),
                alive_timeout: config.timing.release_after,
                pinned: Some((BrokerId(config.broker_id), config.rack.clone())),
                leadership: Some(leadership.clone()),
                key: Some(config.key.clone()),
            },
            epoch,
        );
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(server.clone().serve(listener, async move {
            let _ = stop_rx.await;
        }));
        let lead_start = Instant::now();
        let mut alive = server.alive();
        // Rounds are cheap (the last file written is kept in memory; the file is read once per
        // claim), so they run often: a handover completes one round after it may.
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Claim assignment.json for this epoch before deciding anything from it, and again
        // whenever someone else wrote since (a write of ours was refused, or the periodic check
        // below saw a newer version): see kaas_control::assignment::claim_epoch.
        'claim: loop {
            let Some(claimed) = claim(&config, &server, epoch, &accepted).await else {
                break 'claim;
            };
            let mut seq = claimed.as_ref().map(|p| p.seq);
            let mut last: Option<Arc<Assignment>> = claimed.map(|p| Arc::new(p.assignment));
            let mut rounds = 0u64;
            loop {
                if !leadership.borrow().leads_now() || leadership.borrow().epoch != epoch {
                    break 'claim;
                }
                rounds += 1;
                if rounds.is_multiple_of(10) && !still_head(&config, seq, last.clone()).await {
                    continue 'claim;
                }
                // Topics created on other brokers since the last round: placed in this one,
                // not a catalog reload (a second) later, as clients wait on their leaders.
                super::reload_catalog(&shards).await;
                let round = recompute(
                    &config,
                    &shards,
                    &server,
                    (epoch, lead_start, prev_holder),
                    &leadership,
                    Bases {
                        last: last.clone(),
                        accepted: accepted.borrow().clone(),
                        seq,
                    },
                );
                match round.await {
                    Ok((written, written_seq)) => {
                        last = Some(written);
                        seq = written_seq;
                    }
                    Err(e)
                        if matches!(e.downcast_ref::<FenceError>(), Some(FenceError::Conflict)) =>
                    {
                        tracing::warn!(epoch, "{e:#}; claiming it again");
                        continue 'claim;
                    }
                    Err(e) => tracing::error!("writing assignment.json failed: {e:#}; retrying"),
                }
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = alive.changed() => {}
                    r = leadership.changed() => if r.is_err() { return },
                }
            }
        }
        tracing::info!(
            epoch,
            "no longer the controller; closing the heartbeat server"
        );
        let _ = stop_tx.send(());
        let _ = serving.await;
        if leadership.borrow().leads_now() && leadership.borrow().epoch == epoch {
            // Deposed by a newer controller's file before our Lease driver noticed: give it
            // time to, rather than claiming again at once.
            let _ = tokio::time::timeout(Duration::from_millis(500), leadership.changed()).await;
        }
    }
}

/// Claims `assignment.json` for `epoch` (retrying while this broker still leads in it) and
/// sets the term's acknowledgement floor to the file claimed. `None`: no longer the controller.
async fn claim(
    config: &ClusterConfig,
    server: &HeartbeatServer,
    epoch: u64,
    accepted: &watch::Receiver<Option<Arc<Assignment>>>,
) -> Option<Option<kaas_control::assignment::Published>> {
    loop {
        let chain = assignment_chain(&config.data_dir);
        let known = accepted.borrow().clone();
        let claimed =
            tokio::task::spawn_blocking(move || claim_epoch(&chain, epoch, known.as_deref())).await;
        match claimed {
            Ok(Ok(published)) => {
                // Files before this term may have moved partitions by time; this term's floors
                // only know the files it writes (see kaas_control::heartbeat::AckFloor).
                if let Some(p) = &published {
                    server.require_applied_by_all(p.assignment.order_key());
                }
                return Some(published);
            }
            Ok(Err(e @ FenceError::Deposed { .. })) => {
                tracing::warn!(epoch, "cannot claim assignment.json: {e}; stepping back");
                return None;
            }
            Ok(Err(e)) => tracing::warn!(epoch, "cannot claim assignment.json: {e}; retrying"),
            Err(e) => tracing::error!("assignment claim task failed: {e}; retrying"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether the chain's newest version is still the one this controller wrote last (`seq`);
/// if so, also puts back a stale `assignment.json` copy (a deposed controller frozen between
/// its write and its copy can leave an older one there, and operators read that file).
async fn still_head(
    config: &ClusterConfig,
    seq: Option<u64>,
    last: Option<Arc<Assignment>>,
) -> bool {
    let chain = assignment_chain(&config.data_dir);
    tokio::task::spawn_blocking(move || {
        let head = match chain.versions() {
            Ok(v) => v.last().copied(),
            Err(e) => {
                tracing::warn!("listing assignment versions failed: {e}");
                return true;
            }
        };
        if head != seq {
            return false;
        }
        if let Some(last) = last {
            let bytes = last.to_json();
            if kaas_control::chain::read_optional(&chain.mirror_path())
                .ok()
                .flatten()
                .as_deref()
                != Some(bytes.as_slice())
            {
                let _ = chain.mirror(&bytes);
            }
        }
        true
    })
    .await
    .unwrap_or(true)
}

async fn bind_heartbeat(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(128)
}

/// What a controller round may start from.
struct Bases {
    /// The file this controller wrote last (`None` right after the election).
    last: Option<Arc<Assignment>>,
    /// The file this broker's watcher accepted (fenced by epoch).
    accepted: Option<Arc<Assignment>>,
    /// The chain version `last` was written as (or claimed from): the base of the next write.
    seq: Option<u64>,
}

/// The catalog's topics and partition counts, and the partitions operators reassigned (their
/// pins), as the balancer takes them.
fn planner_topics(shards: &Shards) -> (TopicCounts, LeaderMap) {
    let catalog = shards.catalog.snapshot();
    let topics: TopicCounts = catalog
        .topics
        .values()
        .map(|t| (t.name.clone(), t.partitions))
        .collect();
    let pinned: LeaderMap = catalog
        .topics
        .values()
        .flat_map(|t| {
            t.pinned_leaders
                .iter()
                .map(|(&p, &b)| (TopicPartition::new(t.name.clone(), p), BrokerId(b)))
        })
        .collect();
    (topics, pinned)
}

/// Raises the epochs `next` gave moved partitions past their published claims
/// (`kaas_control::epochs::raise_past_claims`) and writes the file over `base_seq`, off this
/// thread: the claims are a few small files, read only for partitions whose leader changed.
/// Returns the file as written, how many epochs were raised, and its chain sequence.
async fn raise_epochs_and_write(
    config: &ClusterConfig,
    shards: &Shards,
    previous: Option<Arc<Assignment>>,
    mut next: Assignment,
    base_seq: Option<u64>,
) -> anyhow::Result<(Assignment, usize, u64)> {
    let chain = assignment_chain(&config.data_dir);
    let catalog = shards.catalog.snapshot();
    let data_dir = config.data_dir.clone();
    tokio::task::spawn_blocking(move || {
        let raised = epochs::raise_past_claims(previous.as_deref(), &mut next, |tp| {
            let topic = catalog.get(&tp.topic)?;
            kaas_shard::leader_claim::read(&topic.partition_dir(&data_dir, tp.partition))
                .map(|c| c.epoch)
        });
        write_fenced(&chain, base_seq, &next).map(|seq| (next, raised, seq))
    })
    .await
    .context("assignment write task")?
    .context("writing assignment.json")
}

/// One controller round: plan, apply the handover rules, write the file if anything changed.
/// Returns the file now in force and its chain version.
async fn recompute(
    config: &ClusterConfig,
    shards: &Shards,
    server: &HeartbeatServer,
    (epoch, lead_start, prev_holder): (u64, Instant, Option<BrokerId>),
    leadership: &watch::Receiver<Leadership>,
    bases: Bases,
) -> anyhow::Result<(Arc<Assignment>, Option<u64>)> {
    // Age silent brokers out now rather than at the server's next 1 s refresh.
    server.refresh();
    // Brokers get this long to connect to a new controller before being counted as gone (they
    // see the new holder within a Lease retry period and dial at once). One that misses it
    // loses its partitions through the normal, safe handover.
    let grace =
        (config.status_interval * 2).max(Duration::from_millis(config.election.retry_period_ms));
    let registry = server.registry();
    let (topics, pinned) = planner_topics(shards);
    // Shared, not copied: this runs five times a second over every partition.
    let candidates = [bases.last.as_ref(), bases.accepted.as_ref()];
    let previous: Option<Arc<Assignment>> = round::newest_base(candidates).cloned();
    let leading_for = lead_start.elapsed();
    let now = std::time::Instant::now();
    let decided = round::controller_round(&round::RoundInputs {
        epoch,
        leading_for,
        grace,
        previous_holder: prev_holder,
        gap: config.election_gap(),
        bases: candidates,
        registry: &registry,
        alive_timeout: config.timing.release_after,
        topics: &topics,
        pinned: &pinned,
        hold: config.rebalance_hold,
        timing: &config.timing,
        now,
    });
    let next = match decided {
        round::Round::Unchanged => {
            return Ok((
                previous.expect("unchanged implies a previous file"),
                bases.seq,
            ))
        }
        round::Round::Write(next) => next,
    };
    let version = next.assignment_version;
    // The exact gate, right before acting: a controller paused past its deadline must not
    // write (and if the write itself is what got paused, followers fence it by epoch).
    if !leadership.borrow().leads_now() {
        anyhow::bail!("lost the Lease before writing");
    }
    // A broker that loses a partition in this file is not acknowledged again until it has
    // applied it: an acknowledgement would otherwise reopen its write fence for partitions it
    // still serves from an older file (see kaas_control::heartbeat::AckFloor).
    if let Some(prev) = &previous {
        for broker in handover::lost_leadership(prev, &next) {
            server.require_applied(broker, (epoch, version));
        }
    }
    let moved: usize = next
        .partitions
        .iter()
        .filter(|(tp, l)| previous.as_ref().and_then(|p| p.leader(tp)) != Some(**l))
        .count();
    let pending_n = next.pending.len();
    let (next, raised, written_seq) =
        raise_epochs_and_write(config, shards, previous.clone(), next, bases.seq).await?;
    server.assignment_changed(version);
    let written = Arc::new(next);
    tracing::info!(
        epoch,
        version,
        partitions = written.partitions.len(),
        newly_led = moved,
        pending = pending_n,
        // Leader epochs raised past a claim the controller had not counted (a broker that
        // restarted and took its partitions over again under an unchanged file).
        epochs_raised = raised,
        alive = ?written.brokers.iter().filter(|b| b.health == Health::Alive).map(|b| b.id.0).collect::<Vec<_>>(),
        // Restarted brokers given no partition another broker leads yet (--rebalance-hold-ms).
        settling = ?registry.settling(now, config.rebalance_hold).iter().map(|b| b.0).collect::<Vec<_>>(),
        seq = written_seq,
        ms_since_elected = leading_for.as_millis() as u64,
        "wrote assignment.json"
    );
    Ok((written, Some(written_seq)))
}
