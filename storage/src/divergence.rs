//! Which segment files make up a partition's log when two leaders wrote it. Pure.
//!
//! In cluster mode every broker reaches the partition's directory, and leadership moves by
//! epochs: a take-over raises the leader epoch past every stored one and writes under it into a
//! segment named by it. A deposed leader paused between its fence check and its write can still
//! land a batch afterwards — never acknowledged (the fence is checked again after the write),
//! but on disk, possibly at offsets the new leader has used too. Kafka resolves the same
//! divergence between replicas by truncating to the leader epoch's end offset; here the rule is
//! the same and applies to files: **from the base offset of a segment with a higher epoch on,
//! only higher-epoch data counts.** So a segment is
//!
//! - removed whole when a segment of a higher epoch starts at or before its base (the old leader
//!   rolled after the new one had taken over), and otherwise
//! - kept only below the base of the next higher-epoch segment that starts after it (the old
//!   leader's tail past the take-over point is cut).
//!
//! A log written by one leader at a time has epochs that never fall along the base offsets, and
//! then nothing is removed or cut.

/// What recovery does with one segment file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentFate {
    /// Part of the log; batches at or after `end_before` (if any) were superseded by a newer
    /// leader epoch and are cut.
    Keep { end_before: Option<i64> },
    /// Written by a deposed leader after a newer one had taken over: not part of the log.
    Remove,
}

/// The fate of each segment in `names` (base offset, leader epoch), in the same order.
pub fn plan(names: &[(i64, i32)]) -> Vec<SegmentFate> {
    names
        .iter()
        .map(|&(base, epoch)| {
            let newer = names.iter().filter(|&&(_, e)| e > epoch);
            if newer.clone().any(|&(b, _)| b <= base) {
                return SegmentFate::Remove;
            }
            SegmentFate::Keep {
                end_before: newer.map(|&(b, _)| b).min(),
            }
        })
        .collect()
}

/// Whether a producer-state snapshot written by the leader at `snapshot_epoch` with every batch
/// below `snapshot_offset` in it describes this log: no higher epoch started before that offset
/// (otherwise it holds a deposed leader's superseded batches).
pub fn snapshot_consistent(
    names: &[(i64, i32)],
    snapshot_offset: i64,
    snapshot_epoch: i32,
) -> bool {
    names
        .iter()
        .all(|&(base, epoch)| epoch <= snapshot_epoch || base >= snapshot_offset)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // One leader at a time: everything is kept, nothing is cut before the next epoch begins.
    #[test]
    fn a_single_history_is_kept_whole() {
        let names = [(0, 1), (100, 1), (200, 2), (300, 4)];
        assert_eq!(
            plan(&names),
            vec![
                SegmentFate::Keep {
                    end_before: Some(200)
                },
                SegmentFate::Keep {
                    end_before: Some(200)
                },
                SegmentFate::Keep {
                    end_before: Some(300)
                },
                SegmentFate::Keep { end_before: None },
            ]
        );
    }

    // The case seen in a fault run: the old leader (epoch 7) wrote at 11834 after the new one
    // (epoch 8) had started its segment at 11834, then rolled once more.
    #[test]
    fn a_deposed_leaders_tail_and_rolls_are_dropped() {
        let names = [(0, 7), (11834, 7), (11834, 8), (11900, 7)];
        assert_eq!(
            plan(&names),
            vec![
                SegmentFate::Keep {
                    end_before: Some(11834)
                },
                SegmentFate::Remove,
                SegmentFate::Keep { end_before: None },
                SegmentFate::Remove,
            ]
        );
        assert!(snapshot_consistent(&names, 11834, 7));
        assert!(!snapshot_consistent(&names, 11840, 7));
        assert!(snapshot_consistent(&names, 11840, 8));
    }

    proptest! {
        // Whatever the files, the kept ranges have epochs that never fall along the offsets,
        // and no kept range overlaps a later, higher-epoch one.
        #[test]
        fn kept_ranges_are_one_history(raw in proptest::collection::btree_set((0i64..50, 0i32..6), 0..12)) {
            let names: Vec<(i64, i32)> = raw.into_iter().collect();
            let fates = plan(&names);
            let kept: Vec<(i64, i32, Option<i64>)> = names
                .iter()
                .zip(&fates)
                .filter_map(|(&(b, e), f)| match f {
                    SegmentFate::Keep { end_before } => Some((b, e, *end_before)),
                    SegmentFate::Remove => None,
                })
                .collect();
            for w in kept.windows(2) {
                prop_assert!(w[0].1 <= w[1].1, "epochs fall: {kept:?}");
            }
            for &(b, e, end) in &kept {
                for &(b2, e2, _) in &kept {
                    if e2 > e {
                        prop_assert!(b2 > b && end.is_some_and(|x| x <= b2), "{kept:?}");
                    }
                }
            }
            // The highest epoch's first segment always survives.
            if let Some(&max_e) = names.iter().map(|(_, e)| e).max() {
                let first = names.iter().position(|&(_, e)| e == max_e).unwrap();
                prop_assert_eq!(fates[first], SegmentFate::Keep { end_before: None });
            }
        }
    }
}
