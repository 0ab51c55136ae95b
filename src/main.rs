//! `kaas`: the broker binary. Parses flags, starts the shards (one glommio executor per core)
//! and the control thread (tokio, health/metrics HTTP), and shuts everything down cleanly on
//! SIGTERM or SIGINT.

mod cluster;
mod health_view;
mod uring_check;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{ArgAction, CommandFactory, FromArgMatches, Parser};
use kaas_shard::config::BrokerConfig;

#[global_allocator]
static ALLOCATOR: kaas_wire::alloc::GuardedAlloc = kaas_wire::alloc::GuardedAlloc;

/// A Kafka-wire-compatible, thread-per-core message broker.
///
/// With no flags, kaas is a persisted single-node broker on 127.0.0.1:9092 storing data in
/// ./kaas-data. Every flag can also be set as an environment variable (KAAS_<FLAG>).
#[derive(Debug, Parser)]
#[command(name = "kaas", version, about, long_about = None)]
struct Args {
    /// Address the Kafka listener binds (every shard accepts on it through SO_REUSEPORT).
    #[arg(long, env = "KAAS_LISTEN", default_value = "127.0.0.1:9092", value_parser = parse_bind_addr)]
    listen: SocketAddr,
    /// HOST:PORT clients are told to connect to (Metadata). Defaults to the listen address.
    #[arg(long, env = "KAAS_ADVERTISED_LISTENER")]
    advertised_listener: Option<String>,
    /// Directory holding the topic catalog and partition logs.
    #[arg(long, env = "KAAS_DATA_DIR", default_value = "./kaas-data")]
    data_dir: PathBuf,
    /// Number of shards (glommio executors, each pinned to a core). Defaults to the core count.
    #[arg(long, env = "KAAS_SHARDS", value_parser = clap::value_parser!(u16).range(1..=1024))]
    shards: Option<u16>,
    /// Address of the HTTP endpoint serving /healthz, /readyz and /metrics (loopback unless
    /// told otherwise; the container image and the chart set 0.0.0.0:8080).
    #[arg(long, env = "KAAS_HEALTH_LISTEN", default_value = "127.0.0.1:8080", value_parser = parse_bind_addr)]
    health_listen: SocketAddr,
    /// A broker config under Kafka's name, as in server.properties (repeatable): the topic
    /// defaults (`log.retention.ms`, `log.segment.bytes`, `message.max.bytes`, ...) and
    /// `max.connections` / `max.connections.per.ip`. Checked as kafka-configs checks them;
    /// `kafka-configs --entity-type brokers --entity-default` overrides them at run time.
    #[arg(long = "broker-config", value_name = "KEY=VALUE", value_parser = parse_broker_config)]
    broker_config: Vec<(String, String)>,
    /// Create unknown topics on Metadata and Produce requests.
    #[arg(long, env = "KAAS_AUTO_CREATE_TOPICS", default_value_t = true, action = ArgAction::Set)]
    auto_create_topics: bool,
    /// Partition count of auto-created topics (and of CreateTopics asking for the default).
    #[arg(long, env = "KAAS_NUM_PARTITIONS", default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..=100_000))]
    num_partitions: i32,
    /// Largest request frame accepted, in bytes; larger ones close the connection.
    #[arg(long, env = "KAAS_MAX_FRAME_BYTES", default_value_t = 100 * 1024 * 1024, value_parser = clap::value_parser!(u64).range(1024..=(1u64 << 31)))]
    max_frame_bytes: u64,
    /// Bytes of request bodies being received or served at once, broker-wide (Kafka's
    /// queued.max.request.bytes): when used up, connections stop reading until requests finish.
    #[arg(long, env = "KAAS_QUEUED_MAX_REQUEST_BYTES", default_value_t = 256 << 20, value_parser = clap::value_parser!(u64).range(1 << 20..))]
    queued_max_request_bytes: u64,
    /// Open client connections, broker-wide; at the limit new ones wait (Kafka's max.connections).
    #[arg(long, env = "KAAS_MAX_CONNECTIONS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    max_connections: u64,
    /// Open client connections from one IP address; beyond it new ones are closed (Kafka's
    /// max.connections.per.ip).
    #[arg(long, env = "KAAS_MAX_CONNECTIONS_PER_IP", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    max_connections_per_ip: u64,
    /// Close a connection with no request for this long (Kafka's connections.max.idle.ms).
    #[arg(long, env = "KAAS_CONNECTIONS_MAX_IDLE_MS", default_value_t = 600_000, value_parser = clap::value_parser!(u64).range(1000..))]
    connections_max_idle_ms: u64,
    /// Close a connection whose request body stops arriving: each 64 KiB of it (or its rest)
    /// must arrive within this long.
    #[arg(long, env = "KAAS_REQUEST_PROGRESS_TIMEOUT_MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(100..))]
    request_progress_timeout_ms: u64,
    /// Segment files all partition logs keep open at most (0: half of the open-file limit,
    /// the rest left for connections). Past it, the least recently used idle logs are
    /// closed and reopened on their next use.
    #[arg(long, env = "KAAS_MAX_OPEN_LOG_FILES", default_value_t = 0)]
    max_open_log_files: u64,
    /// Produce is refused (KAFKA_STORAGE_ERROR) while the data volume has fewer free bytes
    /// than this, so that the broker's metadata (catalog, offsets, manifests) always has room
    /// and a full disk can be recovered from with DeleteTopics or DeleteRecords. Default: 5%
    /// of the volume, at most 1 GiB. 0 turns the floor off.
    #[arg(long, env = "KAAS_MIN_FREE_BYTES")]
    min_free_bytes: Option<u64>,
    /// io_uring buffer memory per shard, in bytes (counts against RLIMIT_MEMLOCK).
    #[arg(long, env = "KAAS_IO_MEMORY_BYTES", default_value_t = 2 << 20)]
    io_memory_bytes: usize,
    /// At most this many per-partition series on /metrics: each led partition's start and end
    /// offsets, and each group's committed offset per partition (consumer lag is their
    /// difference). Beyond it they are left out, counted in
    /// kaas_metrics_partition_series_omitted and logged once; 0 leaves them all out.
    #[arg(
        long,
        env = "KAAS_METRICS_PARTITION_SERIES_LIMIT",
        default_value_t = 10_000
    )]
    metrics_partition_series_limit: usize,
    /// How often retention (retention.ms, retention.bytes) is applied, in milliseconds.
    #[arg(long, env = "KAAS_RETENTION_CHECK_INTERVAL_MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(100..))]
    retention_check_interval_ms: u64,
    /// What one group-commit sync (acks=all, flush.ms, flush.messages) covers: `filesystem`
    /// runs one syncfs of the data directory's filesystem for every partition of a shard;
    /// `file` runs an fdatasync per partition. `filesystem` is several times faster with many
    /// partitions, but also writes out other programs' dirty data on that filesystem: give the
    /// data directory its own volume, or choose `file`.
    #[arg(long, env = "KAAS_SYNC_SCOPE", default_value = "filesystem")]
    sync_scope: kaas_storage::SyncScope,
    /// How a fetch reads history that is not in the page cache: `auto` reads it past the page
    /// cache (O_DIRECT) while the broker's memory cgroup is within a quarter of its limit, and
    /// through it otherwise, so that it stays cached for the next reader; `page-cache` always
    /// through it, as Kafka does; `direct` always past it.
    #[arg(long, env = "KAAS_COLD_READS", default_value = "auto")]
    cold_reads: kaas_storage::memory_limit::ColdReads,
    /// This broker's id (node id in Metadata). Defaults to 0; in cluster mode inside a pod, to
    /// the StatefulSet ordinal taken from the hostname (kaas-2 → 2).
    #[arg(long, env = "KAAS_BROKER_ID", value_parser = clap::value_parser!(i32).range(0..))]
    broker_id: Option<i32>,
    /// Cluster mode: the Lease backend that elects the controller (`kube`: the kaas-controller
    /// Lease in the pod's namespace; `file`: <data-dir>/__cluster/lease.json, for brokers sharing
    /// a directory on one host or NFS). Without it kaas is a single node. In cluster mode
    /// --data-dir is the volume every broker shares.
    #[arg(long, env = "KAAS_LEASE", value_enum)]
    lease: Option<cluster::LeaseKind>,
    /// Cluster mode: address the heartbeat gRPC server binds while this broker is controller
    /// (loopback unless told otherwise, as for the Kafka port; the chart sets the pod address).
    #[arg(long, env = "KAAS_HEARTBEAT_LISTEN", default_value = "127.0.0.1:9094", value_parser = parse_bind_addr)]
    heartbeat_listen: SocketAddr,
    /// Cluster mode: file holding the cluster key that signs heartbeat messages (at least 16
    /// bytes, e.g. a Kubernetes Secret). Default: `<data-dir>/__cluster/heartbeat.key`, created
    /// by the first broker on the shared volume.
    #[arg(long, env = "KAAS_CLUSTER_KEY_FILE")]
    cluster_key_file: Option<PathBuf>,
    /// Cluster mode: HOST:PORT other brokers dial for this broker's heartbeat server. Defaults
    /// to the advertised Kafka host with the heartbeat port (or the listen address if specific).
    #[arg(long, env = "KAAS_HEARTBEAT_ADVERTISED")]
    heartbeat_advertised: Option<String>,
    /// This broker's rack (zone). In cluster mode the balancer spreads each topic across racks;
    /// on a single node Metadata reports it. The rack-aware group assignor reads it either way.
    #[arg(long, env = "KAAS_RACK")]
    rack: Option<String>,
    /// Cluster mode: Lease duration in ms (a candidate takes over a Lease unchanged this long).
    #[arg(long, env = "KAAS_LEASE_DURATION_MS", default_value_t = 15_000)]
    lease_duration_ms: u64,
    /// Cluster mode: renew deadline in ms (a controller that could not renew for this long stops
    /// acting). Must be below the lease duration.
    #[arg(long, env = "KAAS_LEASE_RENEW_DEADLINE_MS", default_value_t = 10_000)]
    lease_renew_deadline_ms: u64,
    /// Cluster mode: Lease retry period in ms (renewal and candidate polling interval).
    #[arg(long, env = "KAAS_LEASE_RETRY_PERIOD_MS", default_value_t = 2_000)]
    lease_retry_period_ms: u64,
    /// Cluster mode: how long after its last acknowledged heartbeat a broker keeps
    /// acknowledging writes, in ms. The controller hands a silent broker's partitions over
    /// only after this plus --handover-margin-ms.
    #[arg(long, env = "KAAS_WRITE_FENCE_MS", default_value_t = 2_500, value_parser = clap::value_parser!(u64).range(500..))]
    write_fence_ms: u64,
    /// Cluster mode: safety margin added to the write fence before a silent broker's partitions
    /// move (clock drift, scheduling delay, a write in flight).
    #[arg(long, env = "KAAS_HANDOVER_MARGIN_MS", default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(200..))]
    handover_margin_ms: u64,
    /// Cluster mode: how long a SIGTERM waits for this broker's partitions to move away.
    #[arg(long, env = "KAAS_DRAIN_TIMEOUT_MS", default_value_t = 30_000)]
    drain_timeout_ms: u64,
    /// Cluster mode, read by the controller: for this long after a broker (re)starts, the
    /// balancer gives it no partition another alive broker leads (it may take those whose
    /// leader is gone), so clients that just lost it are not sent straight back; then it gets
    /// its even share. Kafka leaves this to its preferred-leader election, every 300 s. 0 (the
    /// default) evens out at once: with 30 s, one CI rolling upgrade ended with kcat giving up
    /// ("all brokers down"), which is not understood yet.
    #[arg(long, env = "KAAS_REBALANCE_HOLD_MS", default_value_t = 0)]
    rebalance_hold_ms: u64,
    /// Log filter (tracing-subscriber EnvFilter syntax), e.g. "info" or "kaas_shard=debug".
    #[arg(long, env = "KAAS_LOG", default_value = "info", value_parser = parse_log_filter)]
    log: String,
}

/// `KEY=VALUE` of `--broker-config`, checked as an AlterConfigs on the broker resource is.
fn parse_broker_config(s: &str) -> Result<(String, String), String> {
    let (key, value) = s.split_once('=').ok_or_else(|| {
        format!("expected KEY=VALUE with Kafka's broker config name, e.g. log.retention.ms=86400000, got {s:?}")
    })?;
    kaas_shard::topic_config::validate_broker(key.trim(), value.trim())?;
    Ok((key.trim().to_string(), value.trim().to_string()))
}

/// A bind address: `IP:PORT`, or `HOST:PORT` with a host name resolved once at start
/// (`localhost:9092`, as Kafka's `listeners` accepts). An IPv4 address is preferred when the
/// name has both, as `localhost` usually does: clients resolving it try IPv4 first too.
fn parse_bind_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let Some((host, port)) = s.rsplit_once(':') else {
        return Err(format!(
            "{s:?} is not HOST:PORT (e.g. 127.0.0.1:9092 or localhost:9092)"
        ));
    };
    port.parse::<u16>()
        .map_err(|_| format!("{s:?}: port {port:?} is not a number from 0 to 65535"))?;
    let addrs: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(s)
        .map_err(|e| format!("{s:?}: cannot resolve host {host:?}: {e}"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("{s:?}: host {host:?} resolves to no address"))
}

/// `--log` must be a filter tracing can use: a typo would otherwise silently log at `info`.
fn parse_log_filter(s: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::builder()
        .parse(s)
        .map(|_| s.to_string())
        .map_err(|e| {
            format!("{s:?} is not a log filter ({e}); e.g. \"info\" or \"info,kaas_shard=debug\"")
        })
}

fn parse_advertised(s: &str) -> anyhow::Result<(String, u16)> {
    let (host, port) = s
        .rsplit_once(':')
        .with_context(|| format!("--advertised-listener {s:?} is not HOST:PORT"))?;
    let port: u16 = port
        .parse()
        .with_context(|| format!("--advertised-listener {s:?}: port is not a number"))?;
    if host.is_empty() {
        bail!("--advertised-listener {s:?}: host is empty");
    }
    Ok((
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
        port,
    ))
}

/// Holds an exclusive lock on the data directory for the life of the process, so two brokers
/// can never write the same logs.
fn lock_data_dir(dir: &std::path::Path, name: &str) -> anyhow::Result<std::fs::File> {
    kaas_durable::create_dir_all(dir)
        .with_context(|| format!("creating data directory {}", dir.display()))?;
    let path = dir.join(name);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    // An flock: released by the kernel if the process dies.
    if file.try_lock().is_err() {
        bail!("data directory {} is in use by another kaas process (lock {} is held); stop it, choose another --data-dir, or (cluster mode) another --broker-id", dir.display(), path.display());
    }
    Ok(file)
}

/// Cluster mode's settings from the flags, checked.
fn cluster_config(
    args: &Args,
    lease: cluster::LeaseKind,
    broker_id: i32,
    config: &BrokerConfig,
) -> anyhow::Result<cluster::ClusterConfig> {
    let election = kaas_control::election::ElectionConfig {
        lease_duration_ms: args.lease_duration_ms,
        renew_deadline_ms: args.lease_renew_deadline_ms,
        retry_period_ms: args.lease_retry_period_ms,
    };
    election.validate().context("lease timings")?;
    let heartbeat_advertised = match &args.heartbeat_advertised {
        Some(a) => a.clone(),
        None if args.heartbeat_listen.ip().is_unspecified() => {
            format!(
                "{}:{}",
                config.advertised_host,
                args.heartbeat_listen.port()
            )
        }
        None => args.heartbeat_listen.to_string(),
    };
    let fence = Duration::from_millis(args.write_fence_ms);
    Ok(cluster::ClusterConfig {
        lease,
        broker_id,
        rack: args.rack.clone(),
        heartbeat_listen: args.heartbeat_listen,
        heartbeat_advertised,
        election,
        timing: kaas_control::handover::Timing {
            broker_fence: fence,
            release_after: fence + Duration::from_millis(args.handover_margin_ms),
        },
        // Five statuses per fence: a few may be lost or late before writes stop.
        status_interval: fence / 5,
        rebalance_hold: Duration::from_millis(args.rebalance_hold_ms),
        data_dir: args.data_dir.clone(),
        advertised: (config.advertised_host.clone(), config.advertised_port),
        key: kaas_control::heartbeat::auth::ClusterKey::load(
            &args.data_dir,
            args.cluster_key_file.as_deref(),
        )
        .context("loading the cluster key that signs heartbeats (--cluster-key-file)")?,
    })
}

/// The shards' listeners use SO_REUSEPORT, which would let a second broker share this port
/// silently and split the traffic; a plain bind first proves the port is free. After a crash
/// the previous process's listener can outlive it by a moment (the kernel tears io_uring down
/// asynchronously), and a connection routed to that dead socket would hang, so a busy port is
/// retried for a few seconds before giving up.
fn wait_for_free_port(addr: SocketAddr) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match std::net::TcpListener::bind(addr) {
            Ok(probe) => {
                drop(probe);
                return Ok(());
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("the Kafka port {addr} is in use (another kaas or Kafka broker?)")
                })
            }
        }
    }
}

/// `kaas --help` ends with the consumer-group settings, which are read from the environment
/// (`KAAS_GROUP_*`, one table in `kaas_shard::groups::config`) rather than taken as flags.
/// The group coordinator's settings as flags, one per entry of `groups::config::SETTINGS`
/// (its Kafka name with dashes, its `KAAS_GROUP_*` variable, its range checked at start), plus
/// the default server assignor. A bad value stops the broker with clap's message, as any flag.
fn with_group_flags(cmd: clap::Command) -> clap::Command {
    use clap::{value_parser, Arg};
    let mut cmd = cmd.next_help_heading("Consumer groups (Kafka's broker config names)");
    for s in kaas_shard::groups::config::SETTINGS {
        // clap keeps &'static names: these few strings live for the process anyway.
        let long: &'static str = Box::leak(s.kafka_name.replace('.', "-").into_boxed_str());
        cmd = cmd.arg(
            Arg::new(s.kafka_name)
                .long(long)
                .env(s.env)
                .value_parser(value_parser!(i64).range(s.min..=s.max))
                .default_value(&*Box::leak(s.default.to_string().into_boxed_str()))
                .help(format!("{} [{}]", s.doc, s.kafka_name)),
        );
    }
    cmd.arg(
        Arg::new("group.consumer.assignors")
            .long("group-consumer-assignor")
            .env("KAAS_GROUP_CONSUMER_ASSIGNOR")
            .value_parser(kaas_shard::groups::assignor::NAMES)
            .default_value("uniform")
            .help(
                "The server assignor of KIP-848 members that name none [group.consumer.assignors]",
            ),
    )
}

/// The group settings the flags of [`with_group_flags`] chose.
fn group_config(matches: &clap::ArgMatches) -> kaas_shard::groups::config::GroupConfig {
    let values: Vec<(&'static str, i64)> = kaas_shard::groups::config::SETTINGS
        .iter()
        .map(|s| {
            (
                s.kafka_name,
                *matches.get_one::<i64>(s.kafka_name).expect("has a default"),
            )
        })
        .collect();
    let assignor = matches
        .get_one::<String>("group.consumer.assignors")
        .expect("has a default")
        .clone();
    kaas_shard::groups::config::GroupConfig::from_values(&values, assignor)
}

fn main() {
    // Large buffers (record copies on append, the zeros written ahead of active segments) are
    // allocated and freed all the time. glibc raises its mmap threshold after the first large
    // free, after which such buffers come from the heap and their memory is kept: measured here,
    // resident memory grew from ~60 MB to ~490 MB under a 1,000-partition load. A fixed
    // threshold keeps them as mappings that are returned on free (and zero pages that are only
    // read never become resident).
    // SAFETY: mallopt only tunes glibc's allocator; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 * 1024);
    }
    let matches = with_group_flags(Args::command()).get_matches();
    let args = Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    kaas_storage::memory_limit::set_cold_reads(args.cold_reads);
    let group = group_config(&matches);
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&args.log)
                .expect("--log was validated when the flags were parsed"),
        )
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal: logs redirected to files or collected by
        // Kubernetes must stay greppable.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if let Err(e) = run(args, group) {
        // Once: through the log when it shows errors (both go to stderr), else plainly.
        if tracing::enabled!(tracing::Level::ERROR) {
            tracing::error!("kaas failed to start: {e:#}");
        } else {
            eprintln!("kaas failed to start: {e:#}");
        }
        std::process::exit(1);
    }
}

/// Raises the soft limit on open files to the hard limit (shells default to 1,024, far below
/// what partitions and connections need), and returns the limit now in force.
fn raise_fd_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write the struct we pass; no other memory is touched.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 0;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    lim.rlim_cur
}

/// Each shard's share of the open-file budget for partition logs (`--max-open-log-files`, or
/// half the descriptor limit), never below 16 so that a shard can always serve something.
fn open_log_files_per_shard(flag: u64, fd_limit: u64, shards: usize) -> usize {
    let total = if flag > 0 { flag } else { fd_limit / 2 };
    ((total / shards.max(1) as u64) as usize).max(16)
}

#[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
fn run(args: Args, group: kaas_shard::groups::config::GroupConfig) -> anyhow::Result<()> {
    let fd_limit = raise_fd_limit();
    if fd_limit < 4096 {
        tracing::warn!(
            fd_limit,
            "the open-file limit is low: each connection and each open partition log takes a descriptor; raise `ulimit -n` (hard limit) if clients see refused connections"
        );
    }
    let (advertised_host, advertised_port) = match &args.advertised_listener {
        Some(a) => parse_advertised(a)?,
        None => {
            if args.listen.ip().is_unspecified() {
                bail!("--listen {} is a wildcard address; set --advertised-listener HOST:PORT so clients know where to connect", args.listen);
            }
            (args.listen.ip().to_string(), args.listen.port())
        }
    };
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let shards = args.shards.map_or(cores, usize::from);
    if shards > cores {
        tracing::warn!(
            shards,
            cores,
            "more shards than cores: each shard is pinned to a core and polls it, so shards share cores and each gets a fraction of one; drop --shards to at most {cores} unless this is a test"
        );
    }
    let broker_id = match (args.broker_id, args.lease) {
        (Some(id), _) => id,
        (None, None) => 0,
        (None, Some(_)) => cluster::ordinal_from_hostname().context(
            "cluster mode needs --broker-id (or a StatefulSet pod hostname ending in -N)",
        )?,
    };
    let config = BrokerConfig {
        broker_id,
        listen: args.listen,
        advertised_host,
        advertised_port,
        data_dir: args.data_dir.clone(),
        shards,
        auto_create_topics: args.auto_create_topics,
        num_partitions: args.num_partitions,
        max_frame_bytes: args.max_frame_bytes as usize,
        io_memory_bytes: args.io_memory_bytes,
        retention_check_interval_ms: args.retention_check_interval_ms,
        sync_scope: args.sync_scope,
        limits: kaas_shard::admission::Limits {
            request_bytes: args.queued_max_request_bytes as usize,
            connections: args.max_connections as usize,
            connections_per_ip: args.max_connections_per_ip as usize,
        },
        connections_max_idle_ms: args.connections_max_idle_ms,
        request_progress_timeout_ms: args.request_progress_timeout_ms,
        open_log_files_per_shard: open_log_files_per_shard(
            args.max_open_log_files,
            fd_limit,
            shards,
        ),
        min_free_bytes: args.min_free_bytes,
        group,
        static_broker_configs: args.broker_config.iter().cloned().collect(),
        metrics_partition_series_limit: args.metrics_partition_series_limit,
    };
    anyhow::ensure!(
        args.max_frame_bytes <= args.queued_max_request_bytes,
        "--max-frame-bytes ({}) is larger than --queued-max-request-bytes ({}): a request that large could never be read",
        args.max_frame_bytes,
        args.queued_max_request_bytes
    );
    uring_check::check(args.io_memory_bytes, shards)?;
    // Brokers of a cluster share the data directory: each locks its own id there instead.
    let lock_name = match args.lease {
        Some(_) => format!(".lock-broker-{broker_id}"),
        None => ".lock".to_string(),
    };
    let _lock = lock_data_dir(&args.data_dir, &lock_name)?;
    let cluster_config = match args.lease {
        Some(lease) => Some(cluster_config(&args, lease, broker_id, &config)?),
        None => None,
    };
    let view = Arc::new(
        match &cluster_config {
            Some(_) => kaas_shard::cluster::ClusterView::cluster(
                broker_id,
                config.advertised_host.clone(),
                config.advertised_port,
            ),
            None => kaas_shard::cluster::ClusterView::single(
                broker_id,
                config.advertised_host.clone(),
                config.advertised_port,
            ),
        }
        .with_rack(args.rack.clone()),
    );
    wait_for_free_port(args.listen)?;
    // Bind the health endpoint first so a port clash fails before any data is touched.
    let health = std::net::TcpListener::bind(args.health_listen)
        .with_context(|| format!("binding the health endpoint on {}", args.health_listen))?;
    health.set_nonblocking(true)?;

    let runtime = kaas_shard::start(config, view.clone()).context("starting the shards")?;
    tracing::info!(
        listen = %runtime.config.listen,
        advertised = %format!("{}:{}", runtime.config.advertised_host, runtime.config.advertised_port),
        data_dir = %runtime.config.data_dir.display(),
        shards,
        health = %args.health_listen,
        cluster_id = runtime.catalog.cluster_id(),
        "kaas is serving"
    );

    let health_view = Arc::new(health_view::HealthView::new(
        runtime.config.clone(),
        runtime.catalog.clone(),
        runtime.probes.clone(),
        runtime.admission.clone(),
    ));
    let shards_for_cluster = cluster::Shards {
        view: view.clone(),
        control: runtime.control.clone(),
        catalog: runtime.catalog.clone(),
    };
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<&'static str>();
    let drain_timeout_ms = args.drain_timeout_ms;
    std::thread::Builder::new()
        .name("kaas-control".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("control runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(health).expect("health listener");
                tokio::spawn(kaas_control::health::serve(
                    listener,
                    health_view.clone(),
                    kaas_control::health::Limits::default(),
                ));
                let mut cluster_handle = None;
                if let Some(cc) = cluster_config {
                    match cluster::start(cc, shards_for_cluster).await {
                        Ok(handle) => {
                            let _ = health_view.cluster.set(health_view::ClusterHealth {
                                view: view.clone(),
                                status: handle.status.clone(),
                                assignment: handle.assignment.clone(),
                                leadership: handle.leadership.clone(),
                            });
                            cluster_handle = Some(handle);
                        }
                        Err(e) => {
                            tracing::error!("cluster mode failed to start: {e:#}");
                            let _ = stop_tx.send("cluster mode failed to start");
                            std::future::pending::<()>().await;
                        }
                    }
                }
                let mut term =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                        .expect("SIGTERM handler");
                let mut int =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
                        .expect("SIGINT handler");
                let which = tokio::select! {
                    _ = term.recv() => "SIGTERM",
                    _ = int.recv() => "SIGINT",
                };
                if let Some(handle) = cluster_handle.as_mut() {
                    // Drain: report draining (and give the Lease up), let the controller move
                    // our partitions while we can still hand them over, then stop.
                    tracing::info!(signal = which, "draining: waiting for this broker's partitions to move");
                    let _ = handle.drain.send(true);
                    let drained = handle
                        .drained(broker_id, Duration::from_millis(drain_timeout_ms))
                        .await;
                    if drained {
                        tracing::info!("drained: no partition is assigned to this broker any more");
                    } else {
                        tracing::warn!(timeout_ms = drain_timeout_ms, "drain timed out; stopping with partitions still assigned (they move once this broker is seen gone)");
                    }
                }
                let _ = stop_tx.send(which);
                // Keep answering probes while the shards drain.
                std::future::pending::<()>().await;
            });
        })
        .context("starting the control thread")?;

    let signal = stop_rx.recv().unwrap_or("control thread exit");
    tracing::info!(signal, "shutting down: closing partitions");
    runtime.shutdown();
    runtime.join();
    tracing::info!("kaas stopped cleanly");
    Ok(())
}
