//! Model-based test: random sequences of append (plain and idempotent, with retries), read,
//! segment roll, DeleteRecords, retention, clean reopen and crash reopen, checked against a
//! simple in-memory model of the log after every step.

use std::collections::BTreeMap;
use std::path::Path;
use std::rc::Rc;

use glommio::LocalExecutorBuilder;
use kaas_storage::{AppendOutcome, LeaderEpoch, LogConfig, PartitionLog, SyncScope};
use kaas_wire::batch::{
    build_batch, verify_batch, verify_produced_record_set, BatchSpec, RecordKv,
};

/// xorshift64*: deterministic, dependency-free randomness so a failing seed replays exactly.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The model: batches by base offset, as (last offset, immutable CRC-covered bytes).
#[derive(Default)]
struct Model {
    batches: BTreeMap<i64, (i64, Vec<u8>)>,
    log_start: i64,
    log_end: i64,
}

thread_local! {
    /// The sync scope of the seed running on this thread: odd seeds fdatasync per file (with
    /// zeros written ahead of the data), even seeds syncfs.
    static SCOPE: std::cell::Cell<SyncScope> = const { std::cell::Cell::new(SyncScope::File) };
}

fn config() -> LogConfig {
    LogConfig {
        sync_scope: SCOPE.with(|s| s.get()),
        segment_bytes: 600,
        // Several index marks per segment, so lookups scan headers between marks.
        index_interval_bytes: 150,
        retention_ms: -1,
        retention_bytes: -1,
        flush_ms: 50,
        ..LogConfig::default()
    }
}

async fn open(dir: &Path) -> Rc<PartitionLog> {
    PartitionLog::open(dir.to_path_buf(), config(), LeaderEpoch(0))
        .await
        .expect("open")
}

async fn check(log: &PartitionLog, m: &Model, rng: &mut Rng) {
    assert_eq!(log.log_end_offset(), m.log_end, "log end offset");
    assert_eq!(log.log_start_offset(), m.log_start, "log start offset");
    // Read from a random offset inside the log and compare every returned batch.
    if m.log_end > m.log_start {
        let from = m.log_start + rng.below((m.log_end - m.log_start) as u64) as i64;
        let r = log
            .read(from, 1 + rng.below(2000) as usize)
            .await
            .expect("read");
        assert!(!r.records.is_empty(), "read at {from} returned nothing");
        let mut at = 0;
        let mut first = true;
        while at < r.records.len() {
            let h = verify_batch(&r.records[at..]).expect("stored batch verifies");
            let (last, body) = m
                .batches
                .get(&h.base_offset)
                .unwrap_or_else(|| panic!("batch at {} not in model", h.base_offset));
            assert_eq!(*last, h.last_offset());
            assert_eq!(
                &r.records[at + 21..at + h.total_len()],
                &body[..],
                "batch {} bytes differ",
                h.base_offset
            );
            if first {
                assert!(
                    h.base_offset <= from && from <= h.last_offset(),
                    "first batch must contain {from}"
                );
                first = false;
            }
            at += h.total_len();
        }
    }
    // Reads outside the log are refused.
    assert!(log.read(m.log_end + 1, 100).await.is_err());
    if m.log_start > 0 {
        assert!(log.read(m.log_start - 1, 100).await.is_err());
    }
}

#[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
fn run_seed(seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p");
    LocalExecutorBuilder::default()
        .spawn(move || async move {
            let scope = if seed % 2 == 1 {
                SyncScope::File
            } else {
                SyncScope::Filesystem
            };
            SCOPE.with(|s| s.set(scope));
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let mut m = Model::default();
            let mut log = open(&path).await;
            let mut seq = 0i32;
            let mut last_idempotent: Option<(Vec<u8>, i64, i64)> = None;
            for step in 0..250 {
                match rng.below(100) {
                    0..=49 => {
                        // Append a batch of 1..5 records, idempotent half of the time.
                        let n = 1 + rng.below(5) as usize;
                        let values: Vec<Vec<u8>> = (0..n)
                            .map(|i| {
                                format!("s{seed}-{step}-{i}-{}", "x".repeat(rng.below(60) as usize))
                                    .into_bytes()
                            })
                            .collect();
                        let recs: Vec<RecordKv> = values
                            .iter()
                            .map(|v| (Some(&b"k"[..]), Some(&v[..])))
                            .collect();
                        let idem = rng.below(2) == 0;
                        let spec = if idem {
                            BatchSpec {
                                producer_id: 7,
                                producer_epoch: 0,
                                base_sequence: seq,
                                timestamp: step as i64,
                                ..Default::default()
                            }
                        } else {
                            BatchSpec {
                                timestamp: step as i64,
                                ..Default::default()
                            }
                        };
                        let bytes = build_batch(spec, &recs);
                        let hs = verify_produced_record_set(&bytes).unwrap();
                        let out = log
                            .append(&bytes, &hs, LeaderEpoch(0))
                            .await
                            .expect("append");
                        assert_eq!(
                            out,
                            AppendOutcome::Appended {
                                base_offset: m.log_end,
                                last_offset: m.log_end + n as i64 - 1
                            }
                        );
                        m.batches
                            .insert(m.log_end, (m.log_end + n as i64 - 1, bytes[21..].to_vec()));
                        m.log_end += n as i64;
                        if idem {
                            seq += n as i32;
                            last_idempotent = Some((bytes, m.log_end - n as i64, m.log_end - 1));
                        }
                        if rng.below(3) == 0 {
                            log.wait_durable(m.log_end).await.expect("fsync");
                        }
                    }
                    50..=57 => {
                        // A producer retry of its last batch returns the original offsets.
                        if let Some((bytes, base, last)) = &last_idempotent {
                            let hs = verify_produced_record_set(bytes).unwrap();
                            let out = log.append(bytes, &hs, LeaderEpoch(0)).await.expect("retry");
                            assert_eq!(
                                out,
                                AppendOutcome::Duplicate {
                                    base_offset: *base,
                                    last_offset: *last
                                }
                            );
                        }
                    }
                    58..=64 => {
                        // DeleteRecords to a random offset inside the log.
                        let target =
                            m.log_start + rng.below((m.log_end - m.log_start + 1) as u64) as i64;
                        let low = log
                            .delete_records_before(target)
                            .await
                            .expect("delete records");
                        assert_eq!(low, target.max(m.log_start));
                        m.log_start = low;
                    }
                    65..=69 => {
                        // Size retention keeps at least the active segment and moves the start
                        // to a batch boundary.
                        let mut c = config();
                        c.retention_bytes = 1 + rng.below(1500) as i64;
                        log.set_config(c);
                        log.enforce_retention(i64::MAX).await.expect("retention");
                        log.set_config(config());
                        let start = log.log_start_offset();
                        assert!(start >= m.log_start);
                        assert!(
                            start == m.log_end
                                || m.batches.contains_key(&start)
                                || start == m.log_start,
                            "log start {start} is not a batch boundary"
                        );
                        m.log_start = start;
                    }
                    70..=79 => {
                        log.close().await.expect("close");
                        drop(log);
                        log = open(&path).await;
                    }
                    80..=89 => {
                        // Crash: the process dies without closing (written data stays in the
                        // page cache, as after SIGKILL).
                        log.abandon();
                        drop(log);
                        log = open(&path).await;
                    }
                    _ => {}
                }
                m.batches
                    .retain(|base, (last, _)| *last >= m.log_start || *base >= m.log_start);
                check(&log, &m, &mut rng).await;
            }
            // The idempotence window survives reopen: a retry after a crash is still a duplicate.
            if let Some((bytes, base, last)) = &last_idempotent {
                log.abandon();
                drop(log);
                let log = open(&path).await;
                let hs = verify_produced_record_set(bytes).unwrap();
                if *base >= log.log_start_offset() {
                    let out = log
                        .append(bytes, &hs, LeaderEpoch(0))
                        .await
                        .expect("retry after reopen");
                    assert_eq!(
                        out,
                        AppendOutcome::Duplicate {
                            base_offset: *base,
                            last_offset: *last
                        }
                    );
                }
            }
        })
        .unwrap()
        .join()
        .unwrap();
}

// Twenty seeds of 250 random operations each agree with the model.
#[test]
fn random_operations_match_model() {
    let seeds: u64 = std::env::var("KAAS_MODEL_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    for seed in 1..=seeds {
        run_seed(seed);
    }
}
