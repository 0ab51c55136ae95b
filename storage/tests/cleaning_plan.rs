//! Why: `plan_cleaning` decides what compaction may rewrite; a wrong plan rewrites the active
//! segment, compacts records younger than `min.compaction.lag.ms`, or skips dirty data forever.
//! These properties pin it down over random segment lists.

use kaas_storage::compaction::{plan_cleaning, CleaningRules, SegmentSummary};
use proptest::prelude::*;

fn log() -> impl Strategy<Value = (Vec<SegmentSummary>, i64)> {
    // 1..12 segments of 0..10 KiB with increasing base offsets and timestamps in 0..10_000
    // (or none), and a checkpoint that is one of the base offsets or 0.
    prop::collection::vec(
        (1i64..500, 0u64..10_240, prop::option::of(0i64..10_000)),
        1..12,
    )
    .prop_flat_map(|raw| {
        let mut base = 0;
        let segments: Vec<SegmentSummary> = raw
            .iter()
            .map(|&(len, size, newest)| {
                let s = SegmentSummary {
                    base_offset: base,
                    size,
                    newest_timestamp: newest,
                };
                base += len;
                s
            })
            .collect();
        let n = segments.len();
        (Just(segments), 0..=n)
    })
    .prop_map(|(segments, k)| {
        let checkpoint = segments.get(k).map_or(0, |s| s.base_offset);
        (segments, checkpoint)
    })
}

fn rules() -> impl Strategy<Value = CleaningRules> {
    (0i64..12_000, 0i64..5_000, 0.0f64..1.0).prop_map(|(now_ms, lag, ratio)| CleaningRules {
        now_ms,
        min_compaction_lag_ms: lag,
        min_cleanable_dirty_ratio: ratio,
    })
}

proptest! {
    /// Compaction must never rewrite the active segment or records younger than the lag.
    #[test]
    fn a_plan_respects_the_active_segment_the_lag_and_the_ratio((segments, checkpoint) in log(), rules in rules()) {
        let last = segments.len() - 1;
        let bound = rules.now_ms - rules.min_compaction_lag_ms;
        let Some(plan) = plan_cleaning(&segments, checkpoint, &rules) else {
            return Ok(());
        };
        // The active segment is never rewritten, nor anything at or after a too-young one.
        prop_assert!(plan.first_uncleanable <= last);
        prop_assert!(plan.first_dirty < plan.first_uncleanable);
        for s in &segments[..plan.first_uncleanable] {
            prop_assert!(s.newest_timestamp.unwrap_or(i64::MIN) <= bound, "{s:?} is younger than the lag");
        }
        if plan.first_uncleanable < last {
            prop_assert!(segments[plan.first_uncleanable].newest_timestamp.unwrap_or(i64::MIN) > bound);
        }
        prop_assert_eq!(plan.new_checkpoint, segments[plan.first_uncleanable].base_offset);
        // Keys are collected from the first segment past the checkpoint.
        prop_assert!(segments[plan.first_dirty + 1].base_offset > checkpoint);
        for k in 0..plan.first_dirty {
            prop_assert!(segments[k + 1].base_offset <= checkpoint);
        }
        // The run was worth it by the ratio.
        let (clean, dirty): (u64, u64) = (0..plan.first_uncleanable).fold((0, 0), |(c, d), k| {
            if segments[k + 1].base_offset <= checkpoint { (c + segments[k].size, d) } else { (c, d + segments[k].size) }
        });
        prop_assert!(dirty > 0);
        prop_assert!(dirty as f64 / (clean + dirty) as f64 >= rules.min_cleanable_dirty_ratio);
        // After the run, the same log has nothing dirty left to plan.
        prop_assert_eq!(plan_cleaning(&segments, plan.new_checkpoint, &rules), None);
    }

    #[test]
    fn dirty_old_data_is_always_planned_when_the_ratio_is_zero((segments, checkpoint) in log(), now_ms in 10_000i64..20_000) {
        // Everything sealed is old enough and any dirty byte is worth a run: the plan must
        // cover every sealed segment, so nothing dirty is skipped forever.
        let rules = CleaningRules { now_ms, min_compaction_lag_ms: 0, min_cleanable_dirty_ratio: 0.0 };
        let last = segments.len() - 1;
        let dirty: u64 = (0..last).filter(|&k| segments[k + 1].base_offset > checkpoint).map(|k| segments[k].size).sum();
        match plan_cleaning(&segments, checkpoint, &rules) {
            Some(plan) => prop_assert_eq!(plan.first_uncleanable, last),
            None => prop_assert_eq!(dirty, 0),
        }
    }
}

// An empty segment list (cannot happen for an open log) plans nothing instead of panicking.
#[test]
fn no_segments_no_plan() {
    let rules = CleaningRules {
        now_ms: 0,
        min_compaction_lag_ms: 0,
        min_cleanable_dirty_ratio: 0.0,
    };
    assert_eq!(plan_cleaning(&[], 0, &rules), None);
}
