//! Shared by the Lease backend tests: candidates run as tokio tasks with short timings, every
//! change of their published [`Leadership`] is recorded with the instant it was seen, and the
//! recorded history is checked for the election's global invariants.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kaas_control::election::{ElectionConfig, LeaseRecord, WriteError};
use kaas_control::lease::{BackendError, ElectionDriver, Leadership, LeaseBackend};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{sleep, Instant};

/// Timings 15× shorter than the design's, keeping its ordering (fencing margin 400 ms).
pub const FAST: ElectionConfig = ElectionConfig {
    lease_duration_ms: 1_000,
    renew_deadline_ms: 600,
    retry_period_ms: 100,
};

/// Bound on each Lease read and write in tests: generous, because tests share two cores with
/// other builds; the driver still publishes `leader: false` at the deadline mid-I/O.
pub const IO_TIMEOUT: Duration = Duration::from_millis(300);

/// A driver with the test timings.
pub fn driver<B: LeaseBackend>(backend: B, identity: String) -> ElectionDriver<B> {
    ElectionDriver::new(backend, identity, FAST)
        .expect("config")
        .with_io_timeout(IO_TIMEOUT)
}

/// (when seen, candidate index, what it published).
pub type Events = Arc<Mutex<Vec<(Instant, usize, Leadership)>>>;

/// A backend that can be cut off from its store: while `cut` is set every call hangs (and the
/// driver's I/O timeout turns it into a failure), as under a network partition.
#[derive(Clone)]
pub struct Cuttable<B> {
    pub inner: B,
    pub cut: Arc<AtomicBool>,
}

impl<B> Cuttable<B> {
    pub fn new(inner: B) -> Self {
        Self {
            inner,
            cut: Arc::new(AtomicBool::new(false)),
        }
    }

    async fn wait_connected(&self) {
        while self.cut.load(Ordering::SeqCst) {
            sleep(Duration::from_millis(5)).await;
        }
    }
}

impl<B: LeaseBackend> LeaseBackend for Cuttable<B> {
    async fn get(&self) -> Result<LeaseRecord, BackendError> {
        self.wait_connected().await;
        self.inner.get().await
    }

    async fn create(&self, record: &LeaseRecord) -> Result<LeaseRecord, WriteError> {
        self.wait_connected().await;
        self.inner.create(record).await
    }

    async fn replace(
        &self,
        record: &LeaseRecord,
        expected: &str,
    ) -> Result<LeaseRecord, WriteError> {
        self.wait_connected().await;
        self.inner.replace(record, expected).await
    }
}

/// One running candidate.
pub struct Node<B> {
    pub stop: Option<oneshot::Sender<()>>,
    pub task: JoinHandle<B>,
}

/// Starts candidate `index` (identity `b{index}`) and records what it publishes into `events`.
pub fn spawn_node<B: LeaseBackend + 'static>(index: usize, backend: B, events: &Events) -> Node<B> {
    spawn_driver(index, driver(backend, format!("b{index}")), events)
}

/// Runs an already built candidate `index` and records what it publishes into `events`.
pub fn spawn_driver<B: LeaseBackend + 'static>(
    index: usize,
    driver: ElectionDriver<B>,
    events: &Events,
) -> Node<B> {
    let mut rx = driver.subscribe();
    let events = Arc::clone(events);
    tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            let seen = rx.borrow_and_update().clone();
            events.lock().unwrap().push((Instant::now(), index, seen));
        }
    });
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(driver.run(async move {
        let _ = stopped.await;
    }));
    Node {
        stop: Some(stop),
        task,
    }
}

impl<B> Node<B> {
    /// Clean shutdown: the driver releases the Lease and hands back its backend.
    pub async fn shutdown(mut self) -> B {
        let _ = self.stop.take().expect("running").send(());
        self.task.await.expect("driver task")
    }
}

/// Candidates currently publishing `leader: true`.
pub fn leaders(events: &Events, n: usize) -> Vec<(usize, u64)> {
    let mut last = vec![None; n];
    for (_, i, l) in events.lock().unwrap().iter() {
        last[*i] = Some(l.clone());
    }
    last.iter()
        .enumerate()
        .filter_map(|(i, l)| l.as_ref().filter(|l| l.leader).map(|l| (i, l.epoch)))
        .collect()
}

/// Waits (bounded) until exactly one of `among` publishes `leader: true`; returns it and its
/// epoch.
pub async fn await_single_leader(
    events: &Events,
    n: usize,
    among: &[usize],
    within: Duration,
) -> (usize, u64) {
    let give_up = Instant::now() + within;
    loop {
        let ls: Vec<_> = leaders(events, n)
            .into_iter()
            .filter(|(i, _)| among.contains(i))
            .collect();
        if ls.len() == 1 {
            return ls[0];
        }
        assert!(
            Instant::now() < give_up,
            "no single leader among {among:?}: {ls:?}"
        );
        sleep(Duration::from_millis(10)).await;
    }
}

/// One candidate's term as published: [start, end) and its epoch.
#[derive(Debug, Clone)]
pub struct Term {
    pub node: usize,
    pub epoch: u64,
    pub start: Instant,
    pub end: Option<Instant>,
}

/// Turns the recorded history into terms.
pub fn terms(events: &Events) -> Vec<Term> {
    let mut open: Vec<Option<Term>> = Vec::new();
    let mut done = Vec::new();
    for (at, i, l) in events.lock().unwrap().iter() {
        if open.len() <= *i {
            open.resize(*i + 1, None);
        }
        match (&mut open[*i], l.leader) {
            (None, true) => {
                open[*i] = Some(Term {
                    node: *i,
                    epoch: l.epoch,
                    start: *at,
                    end: None,
                })
            }
            (Some(t), true) => assert_eq!(t.epoch, l.epoch, "epoch changed within a term"),
            (Some(_), false) => {
                let mut t = open[*i].take().unwrap();
                t.end = Some(*at);
                done.push(t);
            }
            (None, false) => {}
        }
    }
    done.extend(open.into_iter().flatten());
    done.sort_by_key(|t| t.start);
    done
}

/// The global invariants: terms never overlap, and the epoch rises by exactly one when the
/// holder changes (and never goes backwards).
pub fn check_history(terms: &[Term]) {
    for pair in terms.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        let a_end = a
            .end
            .unwrap_or_else(|| panic!("term {a:?} still open before {b:?}"));
        assert!(a_end <= b.start, "terms overlap: {a:?} and {b:?}");
        if a.node != b.node {
            assert_eq!(b.epoch, a.epoch + 1, "holder changed: {a:?} -> {b:?}");
        } else {
            assert!(b.epoch >= a.epoch, "epoch went backwards: {a:?} -> {b:?}");
        }
    }
}

/// The failover story every backend must tell the same way, on stores made by `make` (each
/// call a new handle on the same store):
/// one leader at epoch 1 that keeps the Lease by renewing; killed, it is replaced after the
/// lease duration at epoch 2; a holder cut off from the store stops leading at its deadline,
/// before its successor starts at epoch 3, and does not come back when reconnected; a release
/// keeps the count, so the next holder gets epoch 4. Then the whole history is checked.
pub async fn failover_scenario<B, F>(make: F)
where
    B: LeaseBackend + Clone + 'static,
    F: Fn() -> B,
{
    const N: usize = 4;
    let events = Events::default();
    let mut nodes: Vec<Option<Node<Cuttable<B>>>> = Vec::new();
    let mut cuts = Vec::new();
    for i in 0..3 {
        let backend = Cuttable::new(make());
        cuts.push(Arc::clone(&backend.cut));
        nodes.push(Some(spawn_node(i, backend, &events)));
    }

    let (first, epoch) = await_single_leader(&events, N, &[0, 1, 2], Duration::from_secs(5)).await;
    assert_eq!(epoch, 1, "the first holder opens epoch 1");
    sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        leaders(&events, N),
        vec![(first, 1)],
        "renewals keep the holder"
    );

    let killed_at = Instant::now();
    nodes[first].take().unwrap().task.abort();
    // A killed process publishes nothing more; record the moment it stopped acting.
    let stopped = Leadership::default();
    events.lock().unwrap().push((killed_at, first, stopped));
    let rest: Vec<usize> = (0..3).filter(|i| *i != first).collect();
    let (second, epoch) = await_single_leader(&events, N, &rest, Duration::from_secs(5)).await;
    assert_eq!(epoch, 2, "a change of holder raises the epoch by one");
    let took_over = terms(&events)
        .iter()
        .find(|t| t.node == second)
        .expect("second term")
        .start;
    // The victim's last renewal was at most one retry period before the kill.
    assert!(
        took_over >= killed_at + Duration::from_millis(800),
        "taken over {:?} after the kill, before the lease duration",
        took_over - killed_at
    );

    cuts[second].store(true, Ordering::SeqCst);
    let third = rest.iter().copied().find(|i| *i != second).unwrap();
    let (_, epoch) = await_single_leader(&events, N, &[third], Duration::from_secs(5)).await;
    assert_eq!(epoch, 3);
    assert!(
        !leaders(&events, N).iter().any(|(i, _)| *i == second),
        "the cut-off holder still claims to lead"
    );
    cuts[second].store(false, Ordering::SeqCst);
    sleep(Duration::from_millis(500)).await;
    assert_eq!(
        leaders(&events, N),
        vec![(third, 3)],
        "the old holder came back"
    );

    nodes[second].take().unwrap().shutdown().await;
    let backend = nodes[third].take().unwrap().shutdown().await;
    let stored = backend.inner.get().await.expect("read");
    assert_eq!(stored.holder, None, "released");
    assert_eq!(stored.lease_transitions, 3, "a release keeps the count");

    let late = spawn_node(3, Cuttable::new(make()), &events);
    let (_, epoch) = await_single_leader(&events, N, &[3], Duration::from_secs(5)).await;
    assert_eq!(epoch, 4, "the epoch continues past a release");
    late.shutdown().await;

    let history = terms(&events);
    assert_eq!(history.len(), 4, "{history:?}");
    check_history(&history);
}

/// Of many candidates writing from the same observed version at once, exactly one wins; the
/// others get `Conflict`. Same for creating a missing Lease.
pub async fn compare_and_swap_race<B, F>(make: F)
where
    B: LeaseBackend + Clone + 'static,
    F: Fn() -> B,
{
    let attempt = |holder: usize, version: String| {
        let backend = make();
        tokio::spawn(async move {
            let record = LeaseRecord {
                holder: Some(format!("c{holder}")),
                lease_duration_ms: 1_000,
                lease_transitions: 1,
                resource_version: version.clone(),
                ..LeaseRecord::default()
            };
            backend.compare_and_swap(&record).await
        })
    };
    for round in 0..3 {
        let base = make().get().await.expect("read");
        let tasks: Vec<_> = (0..8)
            .map(|i| attempt(i, base.resource_version.clone()))
            .collect();
        let mut won = Vec::new();
        for task in tasks {
            match task.await.expect("task") {
                Ok(stored) => won.push(stored),
                Err(e) => assert_eq!(e, WriteError::Conflict, "round {round}"),
            }
        }
        assert_eq!(won.len(), 1, "round {round}: {won:?}");
        let now = make().get().await.expect("read");
        assert_eq!(now, won[0], "the winner's record is the stored one");
        assert_ne!(now.resource_version, base.resource_version, "a new version");
    }
}
