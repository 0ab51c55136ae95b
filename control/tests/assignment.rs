//! `assignment.json` on real files: the writer, the NFS-safe watcher, the epoch fence and the
//! takeover diff. Every wait is bounded.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kaas_control::assignment::{
    accept, assignment_chain, claim_epoch, diff, publish, read_published, write_fenced, Assignment,
    AssignmentWatcher, BrokerEntry, Decision, FenceError, Health,
};
use kaas_control::balancer::{coordinator_for_group, BrokerId, TopicPartition};
use kaas_control::chain::Chain;
use tokio::sync::watch;

fn brokers() -> Vec<BrokerEntry> {
    [(2, Health::Dead), (0, Health::Alive), (1, Health::Draining)]
        .into_iter()
        .map(|(id, health)| BrokerEntry {
            id: BrokerId(id),
            host: format!("kaas-{id}.kaas"),
            port: 9092,
            rack: (id != 1).then(|| format!("zone-{id}")),
            health,
        })
        .collect()
}

fn assignment(epoch: u64, version: u64, leaders: &[(&str, i32, i32)]) -> Assignment {
    let partitions = leaders
        .iter()
        .map(|(t, p, l)| (TopicPartition::new(*t, *p), BrokerId(*l)))
        .collect();
    Assignment::new(
        epoch,
        version,
        brokers(),
        partitions,
        ["orders-app".to_string(), "billing".to_string()],
    )
}

fn write(chain: &Chain, a: &Assignment) {
    publish(chain, a).expect("write assignment");
}

fn read(chain: &Chain) -> Option<Assignment> {
    read_published(chain).unwrap().map(|p| p.assignment)
}

async fn wait_version(
    rx: &mut watch::Receiver<Option<Arc<Assignment>>>,
    key: (u64, u64),
    within: Duration,
) -> Duration {
    let start = Instant::now();
    tokio::time::timeout(
        within,
        rx.wait_for(|a| a.as_ref().is_some_and(|a| a.order_key() == key)),
    )
    .await
    .unwrap_or_else(|_| panic!("watcher did not publish {key:?} within {within:?}"))
    .expect("watcher running");
    start.elapsed()
}

// The file round-trips, uses the design's field names, keeps dead rows and sorts brokers.
#[test]
fn round_trip_through_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let chain = assignment_chain(dir.path());
    assert!(read(&chain).is_none());
    let a = assignment(3, 17, &[("t", 0, 0), ("t", 1, 0), ("u", 0, 1)]);
    write(&chain, &a);
    assert_eq!(read(&chain).as_ref(), Some(&a));

    let path = chain.mirror_path();
    assert!(path.ends_with("__cluster/assignment.json"));
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(json["controller_epoch"], 3);
    assert_eq!(json["assignment_version"], 17);
    assert_eq!(json["brokers"][2]["health"], "dead");
    assert_eq!(json["brokers"][1]["health"], "draining");
    assert_eq!(json["partitions"][2]["leader"], 1);
    let ids: Vec<i32> = a.brokers.iter().map(|b| b.id.0).collect();
    assert_eq!(ids, vec![0, 1, 2]);

    // Coordinators are the balancer's hash over every row, falling back to alive brokers only.
    let registered: Vec<BrokerId> = a.brokers.iter().map(|b| b.id).collect();
    for group in ["orders-app", "billing"] {
        let want = coordinator_for_group(group, &registered, |b| b == BrokerId(0)).unwrap();
        assert_eq!(a.consumer_groups[group], want);
        assert_eq!(json["consumer_groups"][group], want.0);
    }
    // No temporary files are left behind: the version and its copy.
    let mut names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["assignment.1.json", "assignment.json"]);
}

// The 1 s poll picks up another writer's new file within about a second, with no push.
#[tokio::test]
async fn watcher_sees_another_writers_file_within_a_second() {
    let dir = tempfile::tempdir().unwrap();
    let chain = assignment_chain(dir.path());
    let watcher = AssignmentWatcher::new(chain.clone(), Duration::from_secs(1));
    let mut rx = watcher.subscribe();
    let task = tokio::spawn(watcher.run());
    tokio::time::sleep(Duration::from_millis(300)).await;

    for version in 1..=2 {
        let a = assignment(1, version, &[("t", 0, (version % 2) as i32)]);
        let c = chain.clone();
        // Written from another thread, as another broker's process would.
        std::thread::spawn(move || publish(&c, &a).unwrap())
            .join()
            .unwrap();
        // One poll period plus slack for a loaded machine.
        let took = wait_version(&mut rx, (1, version), Duration::from_millis(3_000)).await;
        assert!(took <= Duration::from_millis(2_000), "took {took:?}");
    }
    task.abort();
}

// notify() (the ASSIGNMENT_CHANGED push) re-reads at once instead of waiting for the poll.
#[tokio::test]
async fn notify_is_the_fast_path() {
    let dir = tempfile::tempdir().unwrap();
    let chain = assignment_chain(dir.path());
    let watcher = AssignmentWatcher::new(chain.clone(), Duration::from_secs(60));
    let notifier = watcher.notifier();
    let mut rx = watcher.subscribe();
    let task = tokio::spawn(watcher.run());
    tokio::time::sleep(Duration::from_millis(200)).await;
    write(&chain, &assignment(1, 1, &[("t", 0, 0)]));
    notifier.notify();
    let took = wait_version(&mut rx, (1, 1), Duration::from_secs(2)).await;
    assert!(took < Duration::from_millis(500), "took {took:?}");
    task.abort();
}

// A file from a controller below the Lease epoch is rejected, and the view never goes back.
#[test]
fn stale_epoch_and_older_files_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let chain = assignment_chain(dir.path());
    let mut watcher = AssignmentWatcher::new(chain.clone(), Duration::from_secs(1));
    watcher.lease_epoch().observe(5);
    watcher.lease_epoch().observe(2); // epochs never go back
    assert_eq!(watcher.lease_epoch().get(), 5);

    write(&chain, &assignment(4, 100, &[("t", 0, 0)]));
    assert_eq!(
        watcher.poll_once(),
        Some(Decision::StaleEpoch {
            candidate: 4,
            lease_epoch: 5
        })
    );
    assert!(watcher.current().is_none());

    write(&chain, &assignment(5, 1, &[("t", 0, 1)]));
    assert_eq!(watcher.poll_once(), Some(Decision::Accept));
    assert_eq!(
        watcher.poll_once(),
        None,
        "unchanged bytes are not re-decided"
    );

    write(&chain, &assignment(5, 2, &[("t", 0, 0)]));
    assert_eq!(watcher.poll_once(), Some(Decision::Accept));
    write(&chain, &assignment(5, 1, &[("t", 0, 1)]));
    assert!(matches!(watcher.poll_once(), Some(Decision::Older { .. })));
    assert_eq!(watcher.current().unwrap().order_key(), (5, 2));

    // The pure rule: a higher epoch wins even with a lower version.
    let cur = assignment(5, 9, &[]);
    assert_eq!(
        accept(Some(&cur), &assignment(6, 1, &[]), 6),
        Decision::Accept
    );
    assert!(!accept(Some(&cur), &assignment(5, 3, &[]), 0).is_accept());
}

// A torn or garbage file is ignored and the last good assignment stays in force.
#[test]
fn torn_or_garbage_file_keeps_the_last_good_one() {
    let dir = tempfile::tempdir().unwrap();
    let chain = assignment_chain(dir.path());
    let mut watcher = AssignmentWatcher::new(chain.clone(), Duration::from_secs(1));
    let good = assignment(1, 1, &[("t", 0, 0)]);
    write(&chain, &good);
    assert_eq!(watcher.poll_once(), Some(Decision::Accept));

    // Written as the newest version without the chain's care (a torn copy, a hand edit).
    let raw = |bytes: &[u8]| {
        let next = chain.versions().unwrap().last().unwrap() + 1;
        std::fs::write(chain.entry_path(next), bytes).unwrap();
    };
    let bytes = good.to_json();
    raw(&bytes[..bytes.len() / 2]);
    assert_eq!(watcher.poll_once(), None);
    assert!(read_published(&chain).is_err());
    raw(b"\0\0garbage\xff");
    assert_eq!(watcher.poll_once(), None);
    // Duplicate partition rows are not a controller's file either.
    let dup = String::from_utf8(bytes.clone()).unwrap().replace(
        "\"partitions\": [",
        "\"partitions\": [\n    {\"topic\": \"t\", \"partition\": 0, \"leader\": 2},",
    );
    raw(dup.as_bytes());
    assert_eq!(watcher.poll_once(), None);
    assert_eq!(watcher.current().as_deref(), Some(&good));

    write(&chain, &assignment(1, 2, &[("t", 0, 1)]));
    assert_eq!(watcher.poll_once(), Some(Decision::Accept));
    assert_eq!(watcher.current().unwrap().assignment_version, 2);
}

// Proves: a deposed controller's write computed before its successor's claim is refused once
// the claim landed, whenever it resumes; one that landed first is carried forward by the claim.
#[test]
fn a_claim_fences_every_later_write_of_a_deposed_controller() {
    let dir = tempfile::tempdir().unwrap();
    let chain = assignment_chain(dir.path());
    let base = write_fenced(&chain, None, &assignment(3, 7, &[("t", 0, 0)])).unwrap();

    // Epoch 3 computes its next file from `base`, and freezes before writing it.
    let late = assignment(3, 8, &[("t", 0, 1)]);
    // Epoch 4 claims: it republishes the head under its epoch, moving nothing.
    let claimed = claim_epoch(&chain, 4, None).unwrap().unwrap();
    assert_eq!(claimed.assignment.order_key(), (4, 8));
    assert_eq!(
        claimed.assignment.partitions,
        assignment(3, 7, &[("t", 0, 0)]).partitions
    );
    // Epoch 3 resumes: refused, and refused again when it tries to claim.
    assert!(matches!(
        write_fenced(&chain, Some(base), &late),
        Err(FenceError::Conflict)
    ));
    assert!(matches!(
        claim_epoch(&chain, 3, None),
        Err(FenceError::Deposed {
            claimed: 4,
            ours: 3
        })
    ));
    assert_eq!(read(&chain).unwrap().order_key(), (4, 8));

    // A write by epoch 4 that landed before epoch 5's claim is what epoch 5 starts from.
    let landed = assignment(4, 9, &[("t", 0, 2)]);
    write_fenced(&chain, Some(claimed.seq), &landed).unwrap();
    let next = claim_epoch(&chain, 5, None).unwrap().unwrap();
    assert_eq!(next.assignment.order_key(), (5, 10));
    assert_eq!(next.assignment.partitions, landed.partitions);
    // Claiming again in the same epoch changes nothing.
    assert_eq!(claim_epoch(&chain, 5, None).unwrap().unwrap(), next);
}

// Proves: a head with a lower epoch than the file the new controller already accepted (a forged
// or hand-written file) is not adopted: the claim carries the newer file forward.
#[test]
fn a_claim_does_not_adopt_an_older_epochs_head() {
    let dir = tempfile::tempdir().unwrap();
    let chain = assignment_chain(dir.path());
    let known = assignment(6, 3, &[("t", 0, 1)]);
    write(&chain, &known);
    write(&chain, &assignment(5, 100, &[("t", 0, 2)]));
    let claimed = claim_epoch(&chain, 7, Some(&known)).unwrap().unwrap();
    assert_eq!(claimed.assignment.order_key(), (7, 4));
    assert_eq!(claimed.assignment.partitions, known.partitions);
}

// diff lists exactly the partitions that moved to or from this broker.
#[test]
fn diff_is_exactly_what_moved() {
    let me = BrokerId(1);
    let old = assignment(1, 1, &[("a", 0, 1), ("a", 1, 0), ("b", 0, 1), ("b", 1, 1)]);
    let new = assignment(1, 2, &[("a", 0, 0), ("a", 1, 1), ("b", 1, 1), ("c", 0, 1)]);
    let d = diff(Some(&old), &new, me);
    let tps = |v: &[(&str, i32)]| -> Vec<TopicPartition> {
        v.iter().map(|(t, p)| TopicPartition::new(*t, *p)).collect()
    };
    assert_eq!(d.take_over, tps(&[("a", 1), ("c", 0)]));
    assert_eq!(d.relinquish, tps(&[("a", 0), ("b", 0)]));
    assert!(diff(Some(&new), &new, me).is_empty());
    let first = diff(None, &new, me);
    assert_eq!(first.take_over, tps(&[("a", 1), ("b", 1), ("c", 0)]));
    assert!(first.relinquish.is_empty());
    assert!(diff(Some(&old), &new, BrokerId(7)).is_empty());
}
