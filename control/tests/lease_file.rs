//! The `file` Lease backend: candidates in one process on a shared temporary directory, each
//! with its own handle (as separate brokers would have), against the election's invariants.

#[path = "support/harness.rs"]
mod harness;

use kaas_control::election::{LeaseRecord, WriteError};
use kaas_control::lease::file::FileLease;
use kaas_control::lease::LeaseBackend;

// Proves: one leader at a time, epoch +1 per change of holder, killed and cut-off holders
// replaced only after they stopped, and a release keeps the epoch.
#[tokio::test]
async fn failover_keeps_one_leader_and_a_rising_epoch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().to_owned();
    harness::failover_scenario(move || FileLease::new(&path)).await;
}

// Proves: concurrent compare-and-swaps from one observed version have exactly one winner.
#[tokio::test]
async fn concurrent_writers_have_one_winner() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().to_owned();
    harness::compare_and_swap_race(move || FileLease::new(&path)).await;
}

// Proves: the file round-trips a record, versions count up, and stale or duplicate writes
// are conflicts that leave the file unchanged.
#[tokio::test]
async fn versions_and_conflicts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lease = FileLease::new(dir.path());
    assert_eq!(lease.get().await.unwrap(), LeaseRecord::default());
    let record = LeaseRecord {
        holder: Some("b0".into()),
        acquire_time: Some("5".into()),
        renew_time: Some("5".into()),
        lease_duration_ms: 15_000,
        lease_transitions: 1,
        resource_version: String::new(),
    };
    let first = lease.create(&record).await.unwrap();
    assert_eq!(first.resource_version, "1");
    assert_eq!(lease.create(&record).await, Err(WriteError::Conflict));
    let renewed = LeaseRecord {
        renew_time: Some("7".into()),
        ..first.clone()
    };
    let second = lease.replace(&renewed, "1").await.unwrap();
    assert_eq!(second.resource_version, "2");
    assert_eq!(
        lease.replace(&renewed, "1").await,
        Err(WriteError::Conflict)
    );
    assert_eq!(lease.get().await.unwrap(), second);
    assert!(lease.lease_path().ends_with("__cluster/lease.json"));
}

// Proves: a nudged candidate reads the Lease again within a quarter of its retry period rather
// than at the next one, so a broker whose controller released the Lease (SIGTERM) learns it — and
// here takes the free Lease — about 2 s after the release instead of up to 8 s; and the Lease it
// took was released, not expired, so it names no expired holder (no election gap is counted for
// the broker that released it).
#[tokio::test]
async fn a_nudged_candidate_reads_a_released_lease_within_a_quarter_retry() {
    use std::sync::Arc;
    use std::time::Duration;

    use kaas_control::election::ElectionConfig;
    use kaas_control::lease::ElectionDriver;

    const SLOW: ElectionConfig = ElectionConfig {
        lease_duration_ms: 20_000,
        renew_deadline_ms: 12_000,
        retry_period_ms: 8_000,
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let events = harness::Events::default();
    let holder = harness::spawn_driver(
        0,
        ElectionDriver::new(FileLease::new(dir.path()), "b0", SLOW).expect("config"),
        &events,
    );
    harness::await_single_leader(&events, 2, &[0], Duration::from_secs(5)).await;
    let nudge = Arc::new(tokio::sync::Notify::new());
    let follower = harness::spawn_driver(
        1,
        ElectionDriver::new(FileLease::new(dir.path()), "b1", SLOW)
            .expect("config")
            .with_nudge(nudge.clone()),
        &events,
    );
    // Its first round has read b0 as the holder; its next would come 8 s later.
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.shutdown().await;
    let released = tokio::time::Instant::now();
    nudge.notify_one();
    let deadline = released + Duration::from_secs(5);
    let took = loop {
        let last = events
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|(_, i, _)| *i == 1)
            .map(|(at, _, l)| (*at, l.clone()));
        if let Some((at, l)) = last.filter(|(_, l)| l.leader) {
            break (at, l);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the nudged candidate did not take the released Lease within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        took.0 - released < Duration::from_secs(3),
        "{:?}",
        took.0 - released
    );
    assert_eq!(
        took.1.expired_holder, None,
        "a released Lease names no expired holder"
    );
    follower.shutdown().await;
}

/// Set in the environment of the candidate processes [`separate_processes_fail_over`] starts.
const CHILD_DIR_ENV: &str = "KAAS_LEASE_TEST_CHILD_DIR";

/// Wall-clock microseconds: the processes share one host, hence one clock.
fn now_us() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    u64::try_from(since.expect("clock").as_micros()).expect("time fits")
}

// Proves nothing by itself: it is the candidate process the next test starts (a no-op when
// run directly). It prints `EV <unix µs> <leader 0|1> <epoch>` on each change, for 30 s at most.
#[tokio::test]
async fn child_candidate() {
    let Ok(dir) = std::env::var(CHILD_DIR_ENV) else {
        return;
    };
    let identity = format!("pid{}", std::process::id());
    let driver = harness::driver(FileLease::new(dir), identity);
    let mut rx = driver.subscribe();
    tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            let l = rx.borrow_and_update().clone();
            println!("EV {} {} {}", now_us(), u8::from(l.leader), l.epoch);
        }
    });
    driver
        .run(tokio::time::sleep(std::time::Duration::from_secs(30)))
        .await;
}

/// One candidate process and the events it printed.
struct Candidate {
    child: std::process::Child,
    events: std::sync::Arc<std::sync::Mutex<Vec<(u64, bool, u64)>>>,
}

impl Candidate {
    fn start(dir: &std::path::Path) -> Self {
        use std::io::BufRead;
        let mut child = std::process::Command::new(std::env::current_exe().expect("exe"))
            .args([
                "child_candidate",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_DIR_ENV, dir)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn candidate");
        let stdout = child.stdout.take().expect("stdout");
        let events: std::sync::Arc<std::sync::Mutex<Vec<_>>> = std::sync::Arc::default();
        let sink = std::sync::Arc::clone(&events);
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                // The test harness may print its own text before ours on the same line.
                let Some(start) = line.find("EV ") else {
                    continue;
                };
                let f: Vec<&str> = line[start..].split_whitespace().collect();
                if let ["EV", at, leader, epoch] = f.as_slice() {
                    let event = (at.parse().unwrap(), *leader == "1", epoch.parse().unwrap());
                    sink.lock().unwrap().push(event);
                }
            }
        });
        Self { child, events }
    }

    fn last(&self) -> Option<(u64, bool, u64)> {
        self.events.lock().unwrap().last().copied()
    }

    fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits (bounded) until `pick` returns something.
fn wait_for<T>(what: &str, mut pick: impl FnMut() -> Option<T>) -> T {
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Some(v) = pick() {
            return v;
        }
        assert!(
            std::time::Instant::now() < give_up,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

// Proves: across real processes, a SIGSTOPped holder is replaced only after the lease duration
// with epoch +1, announces on SIGCONT that it no longer leads, and takes over again (epoch +1)
// when the new holder is SIGKILLed.
#[test]
fn separate_processes_fail_over() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = Candidate::start(dir.path());
    let b = Candidate::start(dir.path());
    let leading = |c: &Candidate, epoch: u64| {
        c.last()
            .filter(|(_, leader, e)| *leader && *e == epoch)
            .map(|(at, _, _)| at)
    };
    let ((first, second), epoch) = wait_for("a first leader", || {
        let lead = |c: &Candidate| c.last().filter(|(_, leader, _)| *leader);
        match (lead(&a), lead(&b)) {
            (Some((_, _, e)), None) => Some(((&a, &b), e)),
            (None, Some((_, _, e))) => Some(((&b, &a), e)),
            _ => None,
        }
    });

    // Stopped at whatever it is doing, a write included: no lock exists that it could keep
    // (a frozen holder of the old `lease.lock` stalled every election until it resumed).
    first.signal("-STOP");
    let stopped_us = now_us();
    let took_over_us = wait_for("a takeover", || leading(second, epoch + 1));
    assert!(
        took_over_us >= stopped_us + 800_000,
        "taken over {} µs after the holder stopped, before the lease duration",
        took_over_us - stopped_us
    );

    first.signal("-CONT");
    let resumed = wait_for("the resumed holder to step down", || {
        first.last().filter(|(_, leader, e)| !*leader && *e > epoch)
    });
    assert!(!resumed.1, "the resumed holder stepped down: {resumed:?}");
    assert!(
        leading(second, epoch + 1).is_some(),
        "the new holder kept the lease"
    );

    second.signal("-KILL");
    wait_for("the old holder to take over again", || {
        leading(first, epoch + 2)
    });

    let stored: LeaseRecord =
        serde_json::from_slice(&std::fs::read(dir.path().join("__cluster/lease.json")).unwrap())
            .unwrap();
    assert_eq!(stored.lease_transitions, epoch + 2);
}
