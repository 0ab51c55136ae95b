//! The kaas data plane: one glommio executor ("shard") per core, each pinned to its core.
//!
//! Owns: the Kafka listener (every shard accepts on the same port through SO_REUSEPORT), the
//! connections accepted on each shard, the partitions each shard owns (a stable hash of topic
//! and partition, see [`shard::owner_shard`]) and the request handlers. Runs on the shard
//! threads; the only things shared between shards are the lock-free topic catalog snapshot and
//! the per-shard probes the control thread reads. Work for a partition on another shard moves
//! there explicitly through [`mesh::on_shard`].

pub mod admission;
pub mod catalog;
pub mod cluster;
pub mod config;
mod conn;
pub mod control_channel;
pub mod disk;
pub mod errors;
pub mod groups;
mod handlers;
pub mod kafka_static_broker_configs;
pub mod leader_claim;
pub mod mesh;
pub mod probe;
pub mod ratelog;
pub mod refused;
pub mod shard;
pub mod stopping;
pub mod topic_config;
pub mod turns;

use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use glommio::{CpuSet, Latency, LocalExecutorBuilder, Placement, PoolPlacement, Shares};

use crate::admission::Admission;
use crate::catalog::Catalog;
use crate::cluster::{ClusterView, ControlMsg};
use crate::config::BrokerConfig;
use crate::mesh::Mesh;
use crate::probe::ShardProbe;
use crate::shard::Shard;

/// How often a shard proves it is alive (and checks for shutdown).
const TICK: Duration = Duration::from_millis(100);
/// Partition offsets and groups are published for `/metrics` every this many ticks (1 s).
const PUBLISH_EVERY_TICKS: u64 = 10;
/// How many times (a second apart) a shard retries claiming a group that moved here while its
/// previous coordinator still holds it: that broker releases it once it applies the move
/// (within a second or two), or loses it with its process.
const GROUP_CLAIM_RETRIES: usize = 30;
/// Blocking threads per shard (glommio's pool; they take jobs from one queue). A shard's cold
/// reads (`conn::send_file`, `PartitionLog::read`), group-commit syncs and directory fsyncs run
/// there, so with more than one a sync is not held up behind a read from a slow disk.
const BLOCKING_THREADS: usize = 4;
// A sync must find a blocking thread free however many cold reads wait (`off_shard`), and
// one directory fsync may be running beside it.
const _: () = assert!(BLOCKING_THREADS >= kaas_storage::resident::COLD_READS_IN_FLIGHT + 2);

/// The CPUs this process may run on, in order: its affinity mask, which `taskset` and a
/// container's cpuset (Kubernetes' static CPU manager hands a pod, say, CPUs 5 and 6) set.
/// Shards are pinned to these; pinning shard 0 to CPU 0 whatever the mask made the start fail
/// in such a container (the kernel refuses an affinity outside the cpuset) and, under
/// `taskset`, took the broker off the cores it was given.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t of the size given; 0 names this thread, whose mask
    // is the process's (shards are started before any thread is pinned).
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    let cpus: Vec<usize> = if rc == 0 {
        // SAFETY: CPU_ISSET reads the set for an index below CPU_SETSIZE.
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
            .collect()
    } else {
        Vec::new()
    };
    if cpus.is_empty() {
        // Unknown: the shards go where the OS puts them.
        tracing::warn!(error = %std::io::Error::last_os_error(), "could not read this process's CPU affinity; shards are not pinned");
    }
    cpus
}

/// Where shard `id`'s blocking threads run, of `cpus` (the allowed CPUs; `online` is the
/// machine's, read once for all shards): with CPUs to spare beyond the pinned shards, on
/// those — a cold read's copy then takes no shard's time; with every allowed CPU a shard's, on
/// the shard's own, so that its disk work takes from no other shard; with shards not pinned,
/// where the OS puts them.
fn blocking_pool(
    online: Option<&CpuSet>,
    cpus: &[usize],
    nshards: usize,
    id: usize,
) -> PoolPlacement {
    let own: &[usize] = match nshards.cmp(&cpus.len()) {
        std::cmp::Ordering::Less => &cpus[nshards..],
        std::cmp::Ordering::Equal => &cpus[id..=id],
        std::cmp::Ordering::Greater => return PoolPlacement::Unbound(BLOCKING_THREADS),
    };
    match online.map(|set| set.clone().filter(|l| own.contains(&l.cpu))) {
        Some(set) if !set.is_empty() => PoolPlacement::Fenced(BLOCKING_THREADS, set),
        _ => PoolPlacement::Unbound(BLOCKING_THREADS),
    }
}

/// A running set of shards.
pub struct BrokerRuntime {
    pub config: Arc<BrokerConfig>,
    pub catalog: Arc<Catalog>,
    pub probes: Vec<Arc<ShardProbe>>,
    /// The cluster view every shard reads (fixed in single-node mode).
    pub cluster: Arc<ClusterView>,
    /// Connection and request-memory admission, shared by every shard.
    pub admission: Arc<Admission>,
    /// One sender per shard for [`ControlMsg`]s (cluster mode: take over, relinquish).
    pub control: Vec<control_channel::ControlSender>,
    shutdown: Arc<AtomicBool>,
    handles: Vec<glommio::ExecutorJoinHandle<()>>,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("opening the topic catalog: {0}")]
    Catalog(#[from] catalog::CatalogError),
    #[error("shard {shard} failed to start: {reason}")]
    Shard { shard: usize, reason: String },
}

impl BrokerRuntime {
    /// Asks every shard to stop: each stops accepting, fsyncs and closes its partitions.
    pub fn shutdown(&self) {
        self.shutdown.store(true, Ordering::SeqCst);
    }

    /// Waits for every shard to finish.
    pub fn join(self) {
        for (i, h) in self.handles.into_iter().enumerate() {
            if let Err(e) = h.join() {
                tracing::error!(shard = i, error = %e, "shard ended with an error");
            }
        }
    }
}

/// Starts `config.shards` executors and returns once every one has bound its listener (or
/// reports the first failure, e.g. io_uring unavailable or the port taken). `cluster` is the
/// view the control thread keeps up to date ([`ClusterView::single`] for a single node).
#[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
pub fn start(config: BrokerConfig, cluster: Arc<ClusterView>) -> Result<BrokerRuntime, StartError> {
    kaas_durable::create_dir_all(&config.data_dir).map_err(|e| StartError::Shard {
        shard: 0,
        reason: format!("creating data directory {}: {e}", config.data_dir.display()),
    })?;
    let catalog = Arc::new(Catalog::open(&config.data_dir)?);
    if cluster.enabled() {
        // Three catalog reloads (src/cluster: one a second) on every other broker.
        catalog.set_name_reuse_delay(Duration::from_secs(3));
    }
    // Checked with the same rules when the flags were parsed; set before any shard reads it.
    catalog.set_static_broker_configs(config.static_broker_configs.clone())?;
    catalog.set_broker_id(config.broker_id)?;
    let config = Arc::new(config);
    let disk = disk::DiskSpace::new(&config.data_dir, config.min_free_bytes).map_err(|e| {
        StartError::Shard {
            shard: 0,
            reason: format!(
                "reading the free space of data directory {}: {e}",
                config.data_dir.display()
            ),
        }
    })?;
    // Space held back for metadata writes on a volume someone else filled (kaas_storage::ballast).
    // In cluster mode every broker on the shared volume keeps its own: one file shared by all
    // would be written by brokers starting together (racing on its temporary file) and released
    // by one broker while the others still count it as theirs.
    let ballast = config.data_dir.join("__meta").join(if cluster.enabled() {
        format!("ballast-broker-{}", config.broker_id)
    } else {
        "ballast".to_string()
    });
    if let Err(e) = kaas_storage::ballast::install(
        &ballast,
        kaas_storage::ballast::size_for(disk.total()),
        disk.free().saturating_sub(disk.min_free()),
    ) {
        tracing::warn!(path = %ballast.display(), error = %e, "could not write the emergency ballast; a volume filled by another process could block metadata writes");
    }
    let admission = Admission::new(config.limits, disk);
    let (connections, per_ip) =
        topic_config::connection_limits(&catalog.effective_broker_configs());
    admission.set_connection_limits(connections, per_ip);
    let nshards = config.shards.max(1);
    let probes: Vec<Arc<ShardProbe>> = (0..nshards)
        .map(|_| Arc::new(ShardProbe::default()))
        .collect();
    let shutdown = Arc::new(AtomicBool::new(false));
    // Shards still answering the requests their connections took (see `run_shard`).
    let answering = Arc::new(AtomicUsize::new(nshards));
    let mut mesh: Mesh<Shard> = Mesh::new(nshards);
    let cpus = allowed_cpus();
    let online = CpuSet::online().ok();
    let (ready_tx, ready_rx) = mpsc::channel::<(usize, Result<(), String>)>();
    let mut handles = Vec::new();
    let mut control = Vec::new();
    for (id, probe) in probes.iter().enumerate() {
        let (control_tx, control_rx) = control_channel::control_channel();
        control.push(control_tx);
        let cluster = cluster.clone();
        let admission = admission.clone();
        // Pin to a core while there are enough cores; beyond that let the OS place them.
        let placement = if nshards <= cpus.len() {
            Placement::Fixed(cpus[id])
        } else {
            Placement::Unbound
        };
        let answering = answering.clone();
        let (config, catalog, probe, shutdown, mesh, ready) = (
            config.clone(),
            catalog.clone(),
            probe.clone(),
            shutdown.clone(),
            mesh.take(id),
            StartReport {
                id,
                tx: Some(ready_tx.clone()),
            },
        );
        let pool = blocking_pool(online.as_ref(), &cpus, nshards, id);
        let builder = LocalExecutorBuilder::new(placement)
            .blocking_thread_pool_placement(pool)
            .name(&format!("kaas-shard-{id}"))
            .io_memory(config.io_memory_bytes)
            // Small preemption period: cross-shard jobs and long-poll wakeups must not wait
            // behind a busy task queue for the default 100 ms.
            .preempt_timer(Duration::from_millis(5));
        let handle = builder
            .spawn(move || async move {
                let shard = Rc::new(Shard::new(
                    id,
                    config.clone(),
                    catalog,
                    probe.clone(),
                    mesh.1,
                    cluster,
                    admission,
                ));
                // Latency-sensitive, like the mesh: an accepted assignment must not wait behind
                // a shard's produce traffic.
                let control_queue = glommio::executor().create_task_queue(
                    Shares::default(),
                    Latency::Matters(Duration::from_millis(1)),
                    "control",
                );
                glommio::spawn_local_into(serve_control(shard.clone(), control_rx), control_queue)
                    .expect("control task queue exists")
                    .detach();
                let stop = Stop {
                    requested: shutdown,
                    answering,
                };
                run_shard(shard, config, probe, stop, mesh.0, ready).await
            })
            .map_err(|e| StartError::Shard {
                shard: id,
                reason: explain_start_error(&e.to_string()),
            })?;
        handles.push(handle);
    }
    drop(ready_tx);
    for _ in 0..nshards {
        match ready_rx.recv_timeout(Duration::from_secs(30)) {
            Ok((_, Ok(()))) => {}
            Ok((shard, Err(mut reason))) => {
                shutdown.store(true, Ordering::SeqCst);
                if reason == EXECUTOR_FAILED {
                    // The executor never ran our code; its own error is in the join result.
                    if let Err(e) = handles.swap_remove(shard).join() {
                        reason = explain_start_error(&e.to_string());
                    }
                }
                return Err(StartError::Shard { shard, reason });
            }
            Err(_) => {
                shutdown.store(true, Ordering::SeqCst);
                return Err(StartError::Shard { shard: usize::MAX, reason: "a shard did not start within 30 s (see earlier errors; io_uring or memlock limits are the usual cause)".into() });
            }
        }
    }
    Ok(BrokerRuntime {
        config,
        catalog,
        probes,
        cluster,
        admission,
        control,
        shutdown,
        handles,
    })
}

const EXECUTOR_FAILED: &str = "the shard's executor failed to start";

/// Reports one shard's start to `start`. If the executor fails before our code runs (io_uring
/// setup, memlock), the closure holding this is dropped unrun and the drop reports the failure,
/// so `start` never waits out its timeout on a shard that is already gone.
struct StartReport {
    id: usize,
    tx: Option<mpsc::Sender<(usize, Result<(), String>)>>,
}

impl StartReport {
    fn send(&mut self, report: (usize, Result<(), String>)) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(report);
        }
    }
}

impl Drop for StartReport {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send((self.id, Err(EXECUTOR_FAILED.to_string())));
        }
    }
}

/// Turns a low-level start failure into advice for the person running the broker.
fn explain_start_error(e: &str) -> String {
    let hint = if e.contains("Cannot allocate memory") || e.contains("ENOMEM") {
        " (io_uring buffers count against RLIMIT_MEMLOCK: raise `ulimit -l`, give the container CAP_IPC_LOCK, or lower --io-memory-bytes)"
    } else if e.contains("Operation not permitted")
        || e.contains("EPERM")
        || e.contains("Function not implemented")
    {
        " (io_uring is blocked: allow the io_uring_* syscalls in the seccomp profile and check that sysctl kernel.io_uring_disabled is 0)"
    } else {
        ""
    };
    format!("{e}{hint}")
}

/// Carries out the control thread's take-overs and relinquishes for this shard, one message at
/// a time and in order (a relinquish must finish before the next assignment's take-overs).
async fn serve_control(shard: Rc<Shard>, inbox: control_channel::ControlReceiver) {
    while let Some((msg, waited)) = inbox.recv().await {
        if waited > Duration::from_millis(50) {
            tracing::debug!(
                shard = shard.id,
                waited_ms = waited.as_millis() as u64,
                "a control message waited in the shard's queue"
            );
        }
        match msg {
            ControlMsg::Relinquish { partitions, done } => {
                let closes = partitions
                    .iter()
                    .map(|(topic, p)| shard.relinquish(topic, *p));
                futures::future::join_all(closes).await;
                // A close that fails is logged by the shard; the partition is out of the
                // serving set either way, which is what the handover needs.
                let _ = done.send(Vec::new());
            }
            ControlMsg::ConfigsChanged => {
                shard.apply_dynamic_configs();
                shard.close_deleted_topics().await;
            }
            ControlMsg::ReleaseGroups { done } => {
                let view = shard.cluster.clone();
                let me = view.me();
                shard
                    .groups
                    .release_unless(|g| view.coordinator(g) == Some(me))
                    .await;
                let _ = done.send(());
                // The groups that moved here are loaded now, not on their first request (see
                // `GroupManager::claim_coordinated`); one still locked by its previous
                // coordinator is retried each second for as long as it stays ours.
                let shard = shard.clone();
                glommio::spawn_local(async move {
                    for _ in 0..GROUP_CLAIM_RETRIES {
                        let view = shard.cluster.clone();
                        let held = shard
                            .groups
                            .claim_coordinated(|g| view.coordinator(g) == Some(me))
                            .await;
                        if held == 0 {
                            break;
                        }
                        glommio::timer::sleep(Duration::from_secs(1)).await;
                    }
                })
                .detach();
            }
            ControlMsg::Revalidate { partitions, done } => {
                let mut failed = Vec::new();
                for (topic, p) in partitions {
                    if let Err(e) = shard.revalidate(&topic, p).await {
                        failed.push(((topic, p), e));
                    }
                }
                let _ = done.send(failed);
            }
            ControlMsg::TakeOver { partitions, done } => {
                let opens = partitions.into_iter().map(|(topic, p)| {
                    let shard = shard.clone();
                    async move {
                        let r = shard.take_over(&topic, p).await;
                        r.err().map(|e| ((topic, p), e))
                    }
                });
                let failed: Vec<_> = futures::future::join_all(opens)
                    .await
                    .into_iter()
                    .flatten()
                    .collect();
                let _ = done.send(failed);
            }
        }
    }
}

/// The per-shard group coordinator task: loads this shard's groups from disk, then runs their
/// timeouts for as long as the shard lives.
async fn run_group_coordinator(shard: Rc<Shard>) {
    shard.groups.load().await;
    // The catalog the offsets were last checked against: checked again whenever it changes
    // (a topic deleted here or by another broker), and once after loading.
    let mut checked: Option<Arc<catalog::TopicTable>> = None;
    loop {
        glommio::timer::sleep(groups::TICK).await;
        let catalog = shard.catalog.snapshot();
        if !checked.as_ref().is_some_and(|c| Arc::ptr_eq(c, &catalog)) {
            shard.groups.forget_deleted_topics(&catalog).await;
            checked = Some(catalog.clone());
        }
        for group in shard.groups.tick(std::time::Instant::now(), &catalog) {
            // A member may have joined since the tick: then the group is not empty and stays.
            match shard.groups.delete_group(&group).await {
                Ok(()) => tracing::info!(
                    group = %group,
                    after_ms = shard.groups.config.empty_group_retention_ms,
                    "deleted a consumer group that had no members and no committed offsets (offsets.retention.check.interval.ms)"
                ),
                Err(e) => tracing::debug!(group = %group, error = %e, "empty group not deleted"),
            }
        }
    }
}

/// How the shards stop together.
struct Stop {
    /// Set by [`BrokerRuntime::shutdown`].
    requested: Arc<AtomicBool>,
    /// Shards whose connections still answer requests they read. A shard closes its
    /// partitions only once this is zero (or [`ANSWER_BEFORE_CLOSE`] passed): a request read
    /// on one shard may be writing to another shard's partition.
    answering: Arc<AtomicUsize>,
}

/// How long a stopping broker waits for its connections to answer the requests they read
/// (acks=all writes wait for their sync; long polls end at once) before it closes its
/// partitions regardless.
const ANSWER_BEFORE_CLOSE: Duration = Duration::from_secs(5);

async fn run_shard(
    shard: Rc<Shard>,
    config: Arc<BrokerConfig>,
    probe: Arc<ShardProbe>,
    stop: Stop,
    inbox: futures::channel::mpsc::Receiver<mesh::Job<Shard>>,
    mut ready: StartReport,
) {
    let id = shard.id;
    // Jobs from other shards run in a latency-sensitive queue so they are picked up promptly
    // even when this shard is busy.
    let mesh_queue = glommio::executor().create_task_queue(
        Shares::default(),
        Latency::Matters(Duration::from_millis(1)),
        "mesh",
    );
    glommio::spawn_local_into(mesh::serve_inbox(shard.clone(), inbox), mesh_queue)
        .expect("mesh task queue exists")
        .detach();
    let listener = match bind_listener(config.listen) {
        Ok(l) => l,
        Err(e) => {
            ready.send((
                id,
                Err(format!(
                    "binding the Kafka listener on {}: {e}",
                    config.listen
                )),
            ));
            return;
        }
    };
    probe.listener_bound.store(true, Ordering::SeqCst);
    let acceptor = {
        let shard = shard.clone();
        glommio::spawn_local(accept_loop(shard, listener))
    };
    glommio::spawn_local(retention_loop(shard.clone())).detach();
    glommio::spawn_local(run_group_coordinator(shard.clone())).detach();
    ready.send((id, Ok(())));
    tracing::info!(shard = id, listen = %config.listen, "shard serving");
    while !stop.requested.load(Ordering::SeqCst) {
        glommio::timer::sleep(TICK).await;
        let ticks = probe.alive_ticks.fetch_add(1, Ordering::Relaxed) + 1;
        if ticks.is_multiple_of(PUBLISH_EVERY_TICKS) {
            shard.publish_for_metrics();
        }
        // Deleted segments whose file a send was still reading at their revocation.
        kaas_storage::resident::release_revoked();
    }
    drop(acceptor);
    probe.listener_bound.store(false, Ordering::SeqCst);
    // Connections stop reading requests and answer those they read; then the partitions close.
    // Closing first stored writes whose answers never left (REQUEST_TIMED_OUT, or the process
    // exited under them), and a producer without idempotence stored them again after the
    // restart (tests/test_clean_stop.py).
    shard.stopping.begin();
    let deadline = std::time::Instant::now() + ANSWER_BEFORE_CLOSE;
    let open = || probe.connections_open.load(Ordering::Relaxed);
    while open() > 0 && std::time::Instant::now() < deadline {
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
    stop.answering.fetch_sub(1, Ordering::SeqCst);
    while stop.answering.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < deadline {
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
    if open() > 0 {
        tracing::warn!(shard = id, connections = open(), waited = ?ANSWER_BEFORE_CLOSE,
            "closing partitions with requests still unanswered; their clients retry them");
    }
    shard.close_all().await;
    shard.groups.close_all().await;
    probe.stopped.store(true, Ordering::SeqCst);
    tracing::info!(shard = id, "shard stopped; partitions closed cleanly");
}

/// Accepts connections while the broker-wide limit has room (at the limit, new connections
/// wait in the kernel's accept queue, as Kafka's `max.connections` makes them), closes those
/// from an address over `--max-connections-per-ip`, and backs off when accept itself fails
/// (EMFILE: out of file descriptors) instead of spinning on it.
async fn accept_loop(shard: Rc<Shard>, listener: glommio::net::TcpListener) {
    let admission = shard.admission.clone();
    let mut backoff = Duration::from_millis(10);
    loop {
        if !admission.has_room() {
            admission.accept_paused.fetch_add(1, Ordering::Relaxed);
            ratelog::limited("max-connections", |suppressed| {
                tracing::warn!(
                    shard = shard.id,
                    limit = admission.limits().connections,
                    suppressed,
                    "--max-connections reached: new connections wait until others close"
                );
            });
            while !admission.has_room() {
                glommio::timer::sleep(Duration::from_millis(20)).await;
            }
        }
        let stream = match listener.accept().await {
            Ok(stream) => {
                backoff = Duration::from_millis(10);
                stream
            }
            Err(e) => {
                ratelog::limited("accept", |suppressed| {
                    tracing::warn!(shard = shard.id, error = %e, suppressed, retry_in = ?backoff,
                        "accepting a connection failed (EMFILE means the broker is out of file descriptors: raise `ulimit -n`)");
                });
                glommio::timer::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let ip = match stream.peer_addr() {
            Ok(addr) => addr.ip(),
            Err(_) => continue, // already gone
        };
        let permit = loop {
            match admission.admit(ip) {
                Ok(permit) => break Some(permit),
                Err(admission::Refusal::PerIp) => {
                    ratelog::limited("max-connections-per-ip", |suppressed| {
                        tracing::warn!(shard = shard.id, %ip, limit = admission.limits().connections_per_ip, suppressed,
                            "closing a new connection: its address has --max-connections-per-ip open");
                    });
                    break None;
                }
                // Another shard took the last slot meanwhile: this one waits its turn.
                Err(admission::Refusal::Full) => {
                    glommio::timer::sleep(Duration::from_millis(20)).await
                }
            }
        };
        if let Some(permit) = permit {
            let shard = shard.clone();
            glommio::spawn_local(async move { conn::serve(shard, stream, permit).await }).detach();
        }
    }
}

/// Applies compaction and retention (`cleanup.policy`, `retention.ms`, `retention.bytes`) to
/// every partition this shard owns,
/// every `--retention-check-interval-ms`. Partitions not yet opened are opened for it, so idle
/// partitions age out too.
async fn retention_loop(shard: Rc<Shard>) {
    let interval = Duration::from_millis(shard.config.retention_check_interval_ms.max(100));
    loop {
        glommio::timer::sleep(interval).await;
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        let snapshot = shard.catalog.snapshot();
        for topic in snapshot.topics.values() {
            for p in 0..topic.partitions {
                // In cluster mode other brokers' partitions share this volume: never touch them.
                if shard.owner_of(&topic.name, p) != shard.id || !shard.serves(&topic.name, p) {
                    continue;
                }
                // Logs this opens count against the open-file budget like any other: idle
                // after the pass, they are the first closed when room is needed.
                match shard.partition(topic, p).await {
                    Ok(log) => {
                        if let Err(e) = log.compact(now_ms).await {
                            tracing::error!(topic = %topic.name, partition = p, error = %e, "compaction failed");
                        }
                        if let Err(e) = log.enforce_retention(now_ms).await {
                            tracing::error!(topic = %topic.name, partition = p, error = %e, "retention failed");
                        }
                    }
                    // Cluster mode with the write fence closed: nothing is served, and the
                    // pass comes back later.
                    Err(kaas_storage::StorageError::Closed) => {}
                    Err(e) => {
                        tracing::error!(topic = %topic.name, partition = p, error = %e, "cannot open partition for retention")
                    }
                }
                glommio::yield_if_needed().await;
            }
        }
        // Opening makes room only for what it opens: logs that grew by rolling since (up to
        // `LogConfig::max_segments` each) are brought back within the budget here, once idle.
        shard.stay_within_open_file_budget().await;
    }
}

/// Binds the Kafka listener for one shard: SO_REUSEPORT so every shard accepts on the same
/// port (the kernel spreads connections), and SO_REUSEADDR so a restart right after a crash is
/// not refused by the previous process's connections lingering in TIME_WAIT.
fn bind_listener(addr: std::net::SocketAddr) -> std::io::Result<glommio::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    use std::os::fd::{FromRawFd, IntoRawFd};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_cloexec(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    // SAFETY: the descriptor is a listening TCP socket we own; ownership moves to glommio.
    Ok(unsafe { glommio::net::TcpListener::from_raw_fd(socket.into_raw_fd()) })
}
