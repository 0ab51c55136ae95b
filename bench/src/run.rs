//! Orchestration of one run: discover the cluster, start the tasks of the mode, keep the clock,
//! collect and merge what the tasks measured, and build the report.
//!
//! Timeline (bench clock): connections are opened first; then `start` (first message due),
//! `window.start = start + warm-up`, `window.end = window.start + duration`. Producers stop
//! generating at `window.end` and drain; consumers are stopped by the run through a watch
//! channel.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::sync::watch;

use crate::args::{Mode, Opts, StartFrom};
use crate::cluster::{Cluster, EARLIEST_TIMESTAMP, LATEST_TIMESTAMP};
use crate::consume::{run_consumer, ConsumeUntil, ConsumerOutcome, ConsumerSetup};
use crate::pacer;
use crate::produce::{run_producer, ProducerOutcome, ProducerSetup};
use crate::stats::{progress_loop, LiveCounters, Report, SideStats, Window};

/// How long e2e consumers may take, after the producers finished, to read the last messages.
const E2E_CATCH_UP: Duration = Duration::from_secs(10);

/// The outcome of a run: the report, and whether it completed without a fatal error.
pub struct RunResult {
    pub report: Report,
    pub ok: bool,
}

#[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
pub async fn run(mode: &Mode) -> Result<RunResult> {
    let opts = Arc::new(mode.opts().clone());
    let is_consume = matches!(mode, Mode::Consume(_));
    let warmup = opts.warmup_for(is_consume);
    let cluster = Cluster::discover(
        &opts.bootstrap,
        &opts.client_id,
        &opts.topic,
        Some((
            opts.partitions,
            opts.replication_factor,
            &opts.topic_configs[..],
        )),
    )
    .await?;
    let mut report = Report {
        tool: "kaas-bench",
        mode: mode.name(),
        options: (*opts).clone(),
        topic_partitions: cluster.partition_count(),
        warmup_s: warmup.as_secs_f64(),
        duration_s: opts.duration.as_secs_f64(),
        api_versions: BTreeMap::new(),
        produce: None,
        consume: None,
        notes: Vec::new(),
    };
    let mut ok = true;
    match mode {
        Mode::Produce(_) => {
            let live = Arc::new(LiveCounters::default());
            let (tasks, window) = start_producers(&cluster, &opts, warmup, live.clone()).await?;
            let progress = start_progress(&opts, vec![("produce", live)], window);
            let (stats, version, fatal) = join_producers(tasks).await?;
            progress.store(true, Ordering::Relaxed);
            report.api_versions.insert("Produce".into(), version);
            report.produce = Some(stats.report(window.seconds()));
            note_producer(&mut report, &stats, &fatal, &mut ok);
        }
        Mode::Consume(_) => {
            let earliest = cluster.list_offsets(EARLIEST_TIMESTAMP).await?;
            let latest = cluster.list_offsets(LATEST_TIMESTAMP).await?;
            let start = match opts.from {
                StartFrom::Earliest => earliest,
                StartFrom::Latest => latest.clone(),
            };
            let expected: i64 = latest.iter().map(|(p, end)| end - start[p]).sum();
            let initial = match opts.from {
                StartFrom::Earliest => ConsumeUntil::Offsets(Arc::new(latest)),
                StartFrom::Latest => ConsumeUntil::Running,
            };
            let (until_tx, until_rx) = watch::channel(initial);
            let live = Arc::new(LiveCounters::default());
            let (tasks, window) =
                start_consumers(&cluster, &opts, None, &start, until_rx, false, live.clone())
                    .await?;
            let progress = start_progress(&opts, vec![("consume", live)], window);
            let stopper = tokio::spawn(async move {
                tokio::time::sleep_until(pacer::instant_of(window.end_ns).into()).await;
                let _ = until_tx.send(ConsumeUntil::Stop);
                until_tx
            });
            let outcomes = join_consumers(tasks).await?;
            stopper.abort();
            progress.store(true, Ordering::Relaxed);
            let (stats, version, caught_up, finished_ns, fatal) = merge_consumers(outcomes);
            report.api_versions.insert("Fetch".into(), version);
            // A consume of stored data ends when it has read everything; measure up to then.
            let end = finished_ns.min(window.end_ns);
            let seconds = end.saturating_sub(window.start_ns) as f64 / 1e9;
            let mut side = stats.report(seconds);
            side.expected_messages = Some(expected.max(0) as u64);
            side.caught_up = Some(caught_up);
            if opts.from == StartFrom::Earliest && !caught_up {
                report.notes.push(format!(
                    "consume stopped before reading everything: {} of {} messages",
                    stats.total_messages, expected
                ));
            }
            if finished_ns <= window.start_ns {
                report.notes.push(
                    "everything was read during the warm-up; nothing was measured".to_string(),
                );
            }
            if let Some(f) = fatal {
                report.notes.push(format!("consumer failed: {f}"));
                ok = false;
            }
            report.consume = Some(side);
        }
        Mode::E2e(_) => {
            let start = cluster.list_offsets(LATEST_TIMESTAMP).await?;
            let (until_tx, until_rx) = watch::channel(ConsumeUntil::Running);
            let consume_live = Arc::new(LiveCounters::default());
            let produce_live = Arc::new(LiveCounters::default());
            let (ptasks, window) =
                start_producers(&cluster, &opts, warmup, produce_live.clone()).await?;
            // Consumers share the producers' window; they are connected before the first
            // message is due because start_producers leaves a short lead time.
            let (ctasks, _) = start_consumers(
                &cluster,
                &opts,
                Some(window),
                &start,
                until_rx,
                true,
                consume_live.clone(),
            )
            .await?;
            let progress = start_progress(
                &opts,
                vec![("produce", produce_live), ("e2e", consume_live)],
                window,
            );
            let (pstats, pversion, pfatal) = join_producers(ptasks).await?;
            let end = cluster
                .list_offsets(LATEST_TIMESTAMP)
                .await
                .context("high watermarks after producing")?;
            let _ = until_tx.send(ConsumeUntil::Offsets(Arc::new(end)));
            let stopper = tokio::spawn(async move {
                tokio::time::sleep(E2E_CATCH_UP).await;
                let _ = until_tx.send(ConsumeUntil::Stop);
                until_tx
            });
            let outcomes = join_consumers(ctasks).await?;
            stopper.abort();
            progress.store(true, Ordering::Relaxed);
            let (cstats, cversion, caught_up, _, cfatal) = merge_consumers(outcomes);
            report.api_versions.insert("Produce".into(), pversion);
            report.api_versions.insert("Fetch".into(), cversion);
            report.produce = Some(pstats.report(window.seconds()));
            note_producer(&mut report, &pstats, &pfatal, &mut ok);
            let mut side = cstats.report(window.seconds());
            side.expected_messages = Some(pstats.total_messages);
            side.caught_up = Some(caught_up);
            if cstats.total_messages != pstats.total_messages {
                report.notes.push(format!(
                    "consumers received {} messages, producers had {} acknowledged",
                    cstats.total_messages, pstats.total_messages
                ));
            }
            if let Some(f) = cfatal {
                report.notes.push(format!("consumer failed: {f}"));
                ok = false;
            }
            report.consume = Some(side);
        }
    }
    Ok(RunResult { report, ok })
}

fn note_producer(report: &mut Report, stats: &SideStats, fatal: &Option<String>, ok: &mut bool) {
    if stats.unacknowledged > 0 {
        report.notes.push(format!(
            "{} messages meant for the window were never acknowledged",
            stats.unacknowledged
        ));
    }
    if report.options.acks.wire_value() == 0 {
        report
            .notes
            .push("acks=0: the broker does not answer, so no produce latency".into());
    }
    if let Some(f) = fatal {
        report.notes.push(format!("producer failed: {f}"));
        *ok = false;
    }
}

fn start_progress(
    opts: &Opts,
    sides: Vec<(&'static str, Arc<LiveCounters>)>,
    window: Window,
) -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    if !opts.quiet {
        tokio::spawn(progress_loop(sides, window, stop.clone()));
    }
    stop
}

type ProducerTasks = Vec<tokio::task::JoinHandle<Result<ProducerOutcome>>>;
type ConsumerTasks = Vec<tokio::task::JoinHandle<Result<ConsumerOutcome>>>;

/// Connects every producer, then starts them all with a common clock.
async fn start_producers(
    cluster: &Cluster,
    opts: &Arc<Opts>,
    warmup: Duration,
    live: Arc<LiveCounters>,
) -> Result<(ProducerTasks, Window)> {
    let all: Vec<i32> = (0..cluster.partition_count() as i32).collect();
    let leaders: Vec<i32> = all.iter().map(|&p| cluster.leader_of(p)).collect();
    let mut conns = Vec::new();
    for _ in 0..opts.producers {
        conns.push(
            cluster
                .connect_leaders(&all, opts.max_in_flight as usize)
                .await?,
        );
    }
    // A short lead so consumers started right after are connected before the first message.
    let start_ns = pacer::now_ns() + 200_000_000;
    let window = Window {
        start_ns: start_ns + warmup.as_nanos() as u64,
        end_ns: start_ns + (warmup + opts.duration).as_nanos() as u64,
    };
    let tasks = conns
        .into_iter()
        .enumerate()
        .map(|(i, conns)| {
            tokio::spawn(run_producer(ProducerSetup {
                index: i as u32,
                producers: opts.producers,
                opts: opts.clone(),
                topic: cluster.topic.name.clone(),
                topic_id: cluster.topic.id,
                leaders: leaders.clone(),
                conns,
                start_ns,
                window,
                live: live.clone(),
            }))
        })
        .collect();
    Ok((tasks, window))
}

/// Connects every consumer and starts it. Without a given window (consume mode) the window is
/// computed here, after connecting, from the warm-up and duration options.
async fn start_consumers(
    cluster: &Cluster,
    opts: &Arc<Opts>,
    window: Option<Window>,
    start: &BTreeMap<i32, i64>,
    until: watch::Receiver<ConsumeUntil>,
    e2e: bool,
    live: Arc<LiveCounters>,
) -> Result<(ConsumerTasks, Window)> {
    let n = opts.consumers.min(cluster.partition_count() as u32).max(1);
    let leaders: Vec<i32> = (0..cluster.partition_count() as i32)
        .map(|p| cluster.leader_of(p))
        .collect();
    let mut setups = Vec::new();
    for i in 0..n {
        let mine: BTreeMap<i32, i64> = start
            .iter()
            .filter(|(p, _)| **p as u32 % n == i)
            .map(|(p, o)| (*p, *o))
            .collect();
        let parts: Vec<i32> = mine.keys().copied().collect();
        let conns = cluster.connect_leaders(&parts, 1).await?;
        setups.push((mine, conns));
    }
    let window = window.unwrap_or_else(|| {
        let s = pacer::now_ns() + opts.warmup_for(true).as_nanos() as u64;
        Window {
            start_ns: s,
            end_ns: s + opts.duration.as_nanos() as u64,
        }
    });
    if n < opts.consumers {
        eprintln!(
            "note: {} consumers asked for, but only {} partitions: using {n}",
            opts.consumers,
            cluster.partition_count()
        );
    }
    let tasks = setups
        .into_iter()
        .map(|(mine, conns)| {
            tokio::spawn(run_consumer(ConsumerSetup {
                opts: opts.clone(),
                topic: cluster.topic.name.clone(),
                topic_id: cluster.topic.id,
                start: mine,
                leaders: leaders.clone(),
                conns,
                until: until.clone(),
                e2e,
                window,
                live: live.clone(),
            }))
        })
        .collect();
    Ok((tasks, window))
}

async fn join_producers(tasks: ProducerTasks) -> Result<(SideStats, i16, Option<String>)> {
    let mut stats = SideStats::default();
    let mut version = 0;
    let mut fatal = None;
    for t in tasks {
        let o = t.await.context("producer task panicked")??;
        stats.merge(&o.stats);
        version = o.version;
        if fatal.is_none() {
            fatal = o.fatal;
        }
    }
    Ok((stats, version, fatal))
}

async fn join_consumers(tasks: ConsumerTasks) -> Result<Vec<ConsumerOutcome>> {
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.context("consumer task panicked")??);
    }
    if out.is_empty() {
        bail!("no consumer ran");
    }
    Ok(out)
}

fn merge_consumers(outcomes: Vec<ConsumerOutcome>) -> (SideStats, i16, bool, u64, Option<String>) {
    let mut stats = SideStats::default();
    let mut version = 0;
    let mut caught_up = true;
    let mut finished = 0;
    let mut fatal = None;
    for o in outcomes {
        stats.merge(&o.stats);
        version = o.version;
        caught_up &= o.caught_up;
        finished = finished.max(o.finished_ns);
        if fatal.is_none() {
            fatal = o.fatal;
        }
    }
    (stats, version, caught_up, finished, fatal)
}
