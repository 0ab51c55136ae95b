//! A produced record set, as Produce hands it to the broker: verification must never panic,
//! and what it accepts must hold together — every batch inside the bytes, with the lengths and
//! offsets its header claims — and reading its records (decompressing, within the broker's
//! bound) must not panic either: a compacted topic reads every produced batch's keys.
#![no_main]

use kaas_wire::batch::{peek_header, seal_crc, verify_produced_record_set};
use libfuzzer_sys::fuzz_target;

// The broker's allocator: a decoder's Vec::with_capacity of a lying array length costs an
// untouched NORESERVE mapping there, not an abort (see kaas_wire::alloc).
#[global_allocator]
static ALLOCATOR: kaas_wire::alloc::GuardedAlloc = kaas_wire::alloc::GuardedAlloc;

/// The checks on one candidate record set.
fn check(data: &[u8]) {
    let Ok(headers) = verify_produced_record_set(data) else {
        let _ = peek_header(data);
        return;
    };
    let mut at = 0usize;
    let mut scratch = Vec::new();
    for h in &headers {
        let len = h.total_len();
        assert!(
            at + len <= data.len(),
            "a verified batch ends inside the record set"
        );
        let batch = &data[at..at + len];
        assert_eq!(peek_header(batch).ok().map(|p| p.total_len()), Some(len));
        let _ = kaas_storage::walk_produced_records(
            batch,
            h,
            &mut scratch,
            kaas_storage::StoredCompression::AsProduced,
            |_| {},
        );
        let _ = kaas_storage::compaction_records(batch);
        at += len;
    }
    assert_eq!(
        at,
        data.len(),
        "the verified batches cover the whole record set"
    );
}

fuzz_target!(|data: &[u8]| {
    check(data);
    // The same bytes with their CRC made right, so that mutations reach what lies behind the
    // checksum: the records, their varints and the decompressors.
    // (seal_crc trusts the batch length: only a length that fits is sealed.)
    let declared = data
        .get(8..12)
        .map(|b| 12 + i32::from_be_bytes([b[0], b[1], b[2], b[3]]) as i64);
    if declared.is_some_and(|len| (61..=data.len() as i64).contains(&len)) {
        let mut sealed = data.to_vec();
        seal_crc(&mut sealed);
        check(&sealed);
    }
});
