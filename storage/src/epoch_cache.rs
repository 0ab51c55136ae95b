//! OffsetForLeaderEpoch, with the exact semantics of Kafka's leader-epoch cache. Pure.
//!
//! Consumers (and Kafka followers) ask "where did epoch E end?" after a leader change and
//! compare the answer with their position: anything lower is "log truncation", and with the
//! default reset policy a consumer then skips records. So the answer must never fall below
//! what was served. The cache is the list of (epoch, start offset) runs of the log — here read
//! from the batch index of each segment — plus the current leader epoch, which starts at the
//! log end offset when nothing has been written under it yet (Kafka assigns it at take-over).

/// Kafka's `UNDEFINED_EPOCH` / `UNDEFINED_EPOCH_OFFSET`.
pub const UNDEFINED: (i32, i64) = (-1, -1);

/// The answer for `requested`, given the log's epoch runs in offset order (`runs`), the current
/// leader epoch and the log end offset. As Kafka's `LeaderEpochFileCache.endOffsetFor`:
///
/// - the current (latest) epoch: the log end offset;
/// - an epoch above every known one, or -1: undefined;
/// - otherwise the largest known epoch ≤ `requested` (or `requested` itself when it is below
///   every known epoch) and the start offset of the first epoch above `requested`.
pub fn end_offset_for(
    runs: impl IntoIterator<Item = (i32, i64)>,
    current_epoch: i32,
    log_end_offset: i64,
    requested: i32,
) -> (i32, i64) {
    if requested < 0 {
        return UNDEFINED;
    }
    if requested == current_epoch {
        return (current_epoch, log_end_offset);
    }
    let mut floor: Option<i32> = None;
    for (epoch, start) in runs {
        if epoch > requested {
            return (floor.unwrap_or(requested), start);
        }
        floor = Some(epoch);
    }
    // No run above `requested`: only the current epoch can be, starting where its first write
    // will go (or went: a run of it would have been found above).
    if current_epoch > requested {
        return (floor.unwrap_or(requested), log_end_offset);
    }
    UNDEFINED
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // The examples from the fault run that made consumers skip records.
    #[test]
    fn kafka_semantics() {
        let runs = [(1, 0), (2, 3121), (3, 3949)];
        assert_eq!(end_offset_for(runs, 3, 4669, 2), (2, 3949));
        assert_eq!(end_offset_for(runs, 3, 4669, 1), (1, 3121));
        assert_eq!(end_offset_for(runs, 3, 4669, 3), (3, 4669));
        // Below every known epoch: the requested epoch and the first start offset.
        assert_eq!(end_offset_for([(4, 100)], 4, 200, 2), (2, 100));
        // Above the current epoch, or undefined.
        assert_eq!(end_offset_for(runs, 3, 4669, 4), UNDEFINED);
        assert_eq!(end_offset_for(runs, 3, 4669, -1), UNDEFINED);
        // A take-over raised the epoch and nothing was written under it yet.
        assert_eq!(end_offset_for([(1, 0)], 2, 3661, 1), (1, 3661));
        // Epochs with no data between known ones answer the floor and the next start.
        assert_eq!(end_offset_for([(1, 0), (5, 10)], 6, 20, 3), (1, 10));
    }

    proptest! {
        // For any log written in epoch runs, the end offset answered for the epoch of any
        // stored offset is past that offset: a consumer that read it never sees truncation.
        #[test]
        fn never_below_what_was_served(
            lens in proptest::collection::vec((1i32..3, 1i64..50), 1..8),
            extra in 0i32..3,
        ) {
            let mut runs = Vec::new();
            let (mut epoch, mut start) = (0, 0i64);
            for (step, len) in &lens {
                epoch += step;
                runs.push((epoch, start));
                start += len;
            }
            let leo = start;
            let current = epoch + extra;
            for (i, &(e, s)) in runs.iter().enumerate() {
                let end = runs.get(i + 1).map_or(leo, |r| r.1);
                let (answer_epoch, answer) = end_offset_for(runs.clone(), current, leo, e);
                prop_assert_eq!(answer_epoch, e);
                prop_assert_eq!(answer, end);
                prop_assert!(answer > s);
            }
        }
    }
}
