//! Compaction of compressed batches, one codec at a time. Batches are compressed by the codec
//! crates themselves (flate2, snap, lz4_flex, zstd) and read back with an independent decoder
//! written here, so the log engine's codec code is checked against real encoders both ways.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;
use std::rc::Rc;

use glommio::LocalExecutorBuilder;
use kaas_storage::{LeaderEpoch, LogConfig, PartitionLog};
use kaas_wire::batch::{
    build_batch, seal_crc, verify_batch, verify_produced_record_set, BatchSpec, RecordKv,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Codec {
    Gzip = 1,
    Snappy = 2,
    /// Unframed snappy, which Kafka's readers also accept; rewritten as xerial-framed.
    RawSnappy = 102,
    Lz4 = 3,
    Zstd = 4,
}

impl Codec {
    fn bits(self) -> i16 {
        match self {
            Codec::RawSnappy => 2,
            c => c as i16,
        }
    }
}

const XERIAL_MAGIC: &[u8; 8] = b"\x82SNAPPY\x00";

fn compress(codec: Codec, raw: &[u8]) -> Vec<u8> {
    match codec {
        Codec::Gzip => {
            let mut w = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            w.write_all(raw).unwrap();
            w.finish().unwrap()
        }
        Codec::Snappy => {
            // xerial framing as Kafka's Java producer writes it: header, then length-prefixed
            // blocks of at most 32 KiB of input each.
            let mut out = XERIAL_MAGIC.to_vec();
            out.extend_from_slice(&1i32.to_be_bytes());
            out.extend_from_slice(&1i32.to_be_bytes());
            for block in raw.chunks(32 * 1024) {
                let c = snap::raw::Encoder::new().compress_vec(block).unwrap();
                out.extend_from_slice(&(c.len() as u32).to_be_bytes());
                out.extend_from_slice(&c);
            }
            out
        }
        Codec::RawSnappy => snap::raw::Encoder::new().compress_vec(raw).unwrap(),
        Codec::Lz4 => {
            let mut w = lz4_flex::frame::FrameEncoder::new(Vec::new());
            w.write_all(raw).unwrap();
            w.finish().unwrap()
        }
        Codec::Zstd => zstd::encode_all(raw, 1).unwrap(),
    }
}

fn decompress(bits: i16, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match bits {
        0 => out.extend_from_slice(body),
        1 => {
            flate2::read::GzDecoder::new(body)
                .read_to_end(&mut out)
                .unwrap();
        }
        2 => {
            if body.starts_with(XERIAL_MAGIC) {
                let mut rest = &body[16..];
                while !rest.is_empty() {
                    let n = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
                    out.extend(
                        snap::raw::Decoder::new()
                            .decompress_vec(&rest[4..4 + n])
                            .unwrap(),
                    );
                    rest = &rest[4 + n..];
                }
            } else {
                out = snap::raw::Decoder::new().decompress_vec(body).unwrap();
            }
        }
        3 => {
            lz4_flex::frame::FrameDecoder::new(body)
                .read_to_end(&mut out)
                .unwrap();
        }
        4 => out = zstd::decode_all(body).unwrap(),
        other => panic!("unknown codec {other}"),
    }
    out
}

/// A batch of `records` compressed with `codec`: built uncompressed, then its records are
/// compressed and the header's attributes, length and CRC set to match.
fn compressed_batch(codec: Codec, spec: BatchSpec, records: &[RecordKv<'_>]) -> Vec<u8> {
    let plain = build_batch(spec, records);
    let mut b = plain[..61].to_vec();
    b.extend_from_slice(&compress(codec, &plain[61..]));
    b[21..23].copy_from_slice(&(spec.attributes | codec.bits()).to_be_bytes());
    let len = (b.len() - 12) as i32;
    b[8..12].copy_from_slice(&len.to_be_bytes());
    seal_crc(&mut b);
    b
}

fn varint(b: &[u8], at: &mut usize) -> i64 {
    let (mut raw, mut shift) = (0u64, 0);
    loop {
        let x = b[*at];
        *at += 1;
        raw |= ((x & 0x7f) as u64) << shift;
        if x & 0x80 == 0 {
            return ((raw >> 1) as i64) ^ -((raw & 1) as i64);
        }
        shift += 7;
    }
}

fn bytes_field(b: &[u8], at: &mut usize) -> Option<Vec<u8>> {
    let n = varint(b, at);
    (n >= 0).then(|| {
        let v = b[*at..*at + n as usize].to_vec();
        *at += n as usize;
        v
    })
}

/// A record's value; `None` is a tombstone.
type Value = Option<Vec<u8>>;

/// One stored batch as this test's decoder sees it.
struct Decoded {
    base_offset: i64,
    last_offset: i64,
    codec_bits: i16,
    producer_id: i64,
    /// (offset, key, value) of each record.
    records: Vec<(i64, Option<Vec<u8>>, Value)>,
}

fn decode(batch: &[u8]) -> Decoded {
    let h = verify_batch(batch).expect("stored batch verifies (CRC-32C, length, magic)");
    let raw = decompress(h.compression(), &batch[61..h.total_len()]);
    let mut records = Vec::new();
    let mut at = 0;
    while at < raw.len() {
        let len = varint(&raw, &mut at) as usize;
        let rec = &raw[at..at + len];
        at += len;
        let mut r = 1;
        varint(rec, &mut r); // timestamp delta
        let offset = h.base_offset + varint(rec, &mut r);
        let key = bytes_field(rec, &mut r);
        let value = bytes_field(rec, &mut r);
        records.push((offset, key, value));
    }
    assert_eq!(records.len(), h.record_count as usize, "record count");
    Decoded {
        base_offset: h.base_offset,
        last_offset: h.last_offset(),
        codec_bits: h.compression(),
        producer_id: h.producer_id,
        records,
    }
}

async fn read_all(log: &PartitionLog) -> Vec<Decoded> {
    let mut out = Vec::new();
    let mut off = log.log_start_offset();
    while off < log.log_end_offset() {
        let r = log.read(off, 1 << 20).await.unwrap();
        let mut at = 0;
        while at < r.records.len() {
            let h = verify_batch(&r.records[at..]).unwrap();
            out.push(decode(&r.records[at..at + h.total_len()]));
            off = h.last_offset() + 1;
            at += h.total_len();
        }
    }
    out
}

fn run<F: std::future::Future<Output = ()> + 'static>(f: impl FnOnce() -> F + Send + 'static) {
    LocalExecutorBuilder::default()
        .spawn(move || async move { f().await })
        .unwrap()
        .join()
        .unwrap();
}

fn config() -> LogConfig {
    LogConfig {
        // Every append rolls, so every batch but the last is in a sealed segment.
        segment_bytes: 1,
        compact_enabled: true,
        delete_enabled: false,
        delete_retention_ms: 1_000_000,
        ..LogConfig::default()
    }
}

async fn append(log: &Rc<PartitionLog>, bytes: &[u8]) -> i64 {
    let headers = verify_produced_record_set(bytes).unwrap();
    let out = log.append(bytes, &headers, LeaderEpoch(0)).await.unwrap();
    log.wait_durable(out.end_offset()).await.unwrap();
    out.base_offset()
}

fn value(key: &str, i: usize) -> Vec<u8> {
    format!("{key}-value-{i}-").repeat(20).into_bytes()
}

#[allow(clippy::too_many_lines)] // long before the ratchet; split when next changed
fn compact_one_codec(codec: Codec, path: &Path) {
    let path = path.to_path_buf();
    run(move || async move {
        let log = PartitionLog::open(path.clone(), config(), LeaderEpoch(0))
            .await
            .unwrap();
        let spec = BatchSpec {
            timestamp: 1000,
            ..Default::default()
        };
        // (key -> (offset, value)) of the newest record of every key.
        let mut newest: BTreeMap<String, (i64, Option<Vec<u8>>)> = BTreeMap::new();
        let mut all_offsets: Vec<i64> = Vec::new();
        let mut put = |base: i64, recs: &[(String, Option<Vec<u8>>)]| {
            for (i, (k, v)) in recs.iter().enumerate() {
                newest.insert(k.clone(), (base + i as i64, v.clone()));
                all_offsets.push(base + i as i64);
            }
        };
        let batch_of = |recs: &[(String, Option<Vec<u8>>)], spec: BatchSpec| {
            let kv: Vec<RecordKv> = recs
                .iter()
                .map(|(k, v)| (Some(k.as_bytes()), v.as_deref()))
                .collect();
            compressed_batch(codec, spec, &kv)
        };
        // An idempotent producer's only batch, wholly superseded later: it must stay, empty.
        let idem: Vec<(String, Option<Vec<u8>>)> = vec![
            ("a".into(), Some(value("a", 0))),
            ("b".into(), Some(value("b", 0))),
        ];
        let idem_spec = BatchSpec {
            producer_id: 9,
            producer_epoch: 2,
            base_sequence: 0,
            ..spec
        };
        let idem_base = append(&log, &batch_of(&idem, idem_spec)).await;
        put(idem_base, &idem);
        // A plain batch wholly superseded later: it must disappear.
        let doomed: Vec<(String, Option<Vec<u8>>)> = vec![
            ("c".into(), Some(value("c", 0))),
            ("d".into(), Some(value("d", 0))),
        ];
        let doomed_base = append(&log, &batch_of(&doomed, spec)).await;
        put(doomed_base, &doomed);
        // Batches that lose some records and keep others; "d" ends with a tombstone.
        for i in 1..=6usize {
            let recs: Vec<(String, Option<Vec<u8>>)> = ["a", "b", "c", "d", "e"]
                .iter()
                .filter(|k| !(i + k.len() + k.as_bytes()[0] as usize).is_multiple_of(3) || i == 6)
                .map(|k| {
                    let v = (!(i == 6 && *k == "d")).then(|| value(k, i));
                    (k.to_string(), v)
                })
                .take(if i == 6 { 5 } else { 3 })
                .collect();
            let base = append(&log, &batch_of(&recs, spec)).await;
            put(base, &recs);
        }
        // A last batch of an unrelated key stays in the active segment.
        let tail: Vec<(String, Option<Vec<u8>>)> = vec![("z".into(), Some(value("z", 0)))];
        let tail_base = append(&log, &batch_of(&tail, spec)).await;
        put(tail_base, &tail);
        let end = log.log_end_offset();

        let before = read_all(&log).await;
        assert!(before.iter().all(|b| b.codec_bits == codec.bits()));
        let rewritten = log.compact(10_000).await.unwrap();
        assert!(rewritten > 0, "{codec:?}: nothing compacted");
        assert_eq!(log.log_end_offset(), end);

        for reopened in [false, true] {
            let log = if reopened {
                log.close().await.unwrap();
                PartitionLog::open(path.clone(), config(), LeaderEpoch(0))
                    .await
                    .unwrap()
            } else {
                log.clone()
            };
            let after = read_all(&log).await;
            let mut seen: BTreeMap<String, Vec<(i64, Value)>> = BTreeMap::new();
            for b in &after {
                for (off, k, v) in &b.records {
                    let k = String::from_utf8(k.clone().unwrap()).unwrap();
                    seen.entry(k).or_default().push((*off, v.clone()));
                }
                if b.records.is_empty() {
                    // Only the idempotent producer's batch may be left empty, header only.
                    assert_eq!(
                        (b.base_offset, b.producer_id, b.codec_bits),
                        (idem_base, 9, 0)
                    );
                    assert_eq!(b.last_offset, idem_base + 1, "offset span kept");
                } else {
                    assert_eq!(b.codec_bits, codec.bits(), "rewritten with its own codec");
                }
            }
            // Exactly the newest record of every key survives, at its original offset.
            for (k, (off, v)) in &newest {
                assert_eq!(
                    seen.get(k),
                    Some(&vec![(*off, v.clone())]),
                    "{codec:?}: key {k}"
                );
            }
            assert!(newest["d"].1.is_none(), "d's newest is a tombstone, kept");
            // The wholly superseded plain batch is gone; the idempotent one is there, empty.
            assert!(after.iter().all(|b| b.base_offset != doomed_base));
            assert!(after
                .iter()
                .any(|b| b.base_offset == idem_base && b.records.is_empty()));
            assert!(after.len() < before.len());
            // Offsets only increase, and every surviving record was written at that offset.
            let offs: Vec<i64> = after
                .iter()
                .flat_map(|b| b.records.iter().map(|r| r.0))
                .collect();
            assert!(offs.windows(2).all(|w| w[0] < w[1]));
            assert!(offs.iter().all(|o| all_offsets.contains(o)));
            // A reader positioned inside the dropped batch lands on the next surviving one.
            let r = log.read(doomed_base, 1 << 20).await.unwrap();
            assert!(verify_batch(&r.records).unwrap().base_offset > doomed_base);
        }
    });
}

// gzip batches: only the newest record of each key survives compaction, re-encoded as gzip.
#[test]
fn compacts_gzip_batches() {
    let dir = tempfile::tempdir().unwrap();
    compact_one_codec(Codec::Gzip, &dir.path().join("p"));
}

// xerial-framed snappy batches compact and are rewritten xerial-framed.
#[test]
fn compacts_snappy_batches() {
    let dir = tempfile::tempdir().unwrap();
    compact_one_codec(Codec::Snappy, &dir.path().join("p"));
}

// Raw (unframed) snappy batches are read too, and rewritten as snappy.
#[test]
fn compacts_raw_snappy_batches() {
    let dir = tempfile::tempdir().unwrap();
    compact_one_codec(Codec::RawSnappy, &dir.path().join("p"));
}

// LZ4-frame batches compact and stay LZ4.
#[test]
fn compacts_lz4_batches() {
    let dir = tempfile::tempdir().unwrap();
    compact_one_codec(Codec::Lz4, &dir.path().join("p"));
}

// zstd batches compact and stay zstd.
#[test]
fn compacts_zstd_batches() {
    let dir = tempfile::tempdir().unwrap();
    compact_one_codec(Codec::Zstd, &dir.path().join("p"));
}
