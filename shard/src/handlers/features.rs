//! UpdateFeatures (`kafka-features upgrade|downgrade|disable`, `Admin::updateFeatures`).
//!
//! The feature levels kaas reports ([`versions::FEATURES`]) are fixed by what the binary serves,
//! so nothing is ever stored: an update that keeps a feature at its finalized level is accepted
//! (as Kafka's controller accepts it, changing nothing), and any other update is refused the way
//! Kafka's controller refuses an update it cannot make. One refused update fails the whole
//! request with INVALID_UPDATE_VERSION, the reason naming the feature; the per-feature results
//! are listed only on success and only up to v1 (v2 dropped them).

use kaas_wire::kafka_protocol::messages::update_features_response::UpdatableFeatureResult;
use kaas_wire::kafka_protocol::messages::{UpdateFeaturesRequest, UpdateFeaturesResponse};
use kaas_wire::kafka_protocol::protocol::StrBytes;
use kaas_wire::versions;

use crate::errors;

/// Kafka's `FeatureUpdate.UpgradeType`: v0's `allow_downgrade` maps to SAFE_DOWNGRADE.
const UPGRADE: i8 = 1;
const SAFE_DOWNGRADE: i8 = 2;
const UNSAFE_DOWNGRADE: i8 = 3;

pub fn update_features(req: &UpdateFeaturesRequest, version: i16) -> UpdateFeaturesResponse {
    // Kafka's controller reads the updates into a map: a feature named twice keeps its last one.
    let mut updates: Vec<(&str, i16, i8)> = Vec::new();
    for u in &req.feature_updates {
        let kind = if version == 0 {
            if u.allow_downgrade {
                SAFE_DOWNGRADE
            } else {
                UPGRADE
            }
        } else {
            u.upgrade_type
        };
        updates.retain(|(name, _, _)| *name != u.feature.as_str());
        updates.push((u.feature.as_str(), u.max_version_level, kind));
    }
    for (name, level, kind) in &updates {
        if let Err(reason) = check(name, *level, *kind) {
            return UpdateFeaturesResponse::default()
                .with_error_code(errors::INVALID_UPDATE_VERSION)
                .with_error_message(Some(StrBytes::from_string(format!(
                    "The update failed for all features since the following feature had an \
                     error: Invalid update version {level} for feature {name}. {reason}"
                ))));
        }
    }
    // Nothing to store or validate further: every accepted update keeps its level, so
    // `validate_only` changes nothing either.
    let results = if version <= 1 {
        updates
            .iter()
            .map(|(name, _, _)| {
                UpdatableFeatureResult::default()
                    .with_feature(StrBytes::from_string((*name).to_string()))
                    .with_error_code(errors::NONE)
                    // Kafka names the error of an accepted feature ("NONE"), not null.
                    .with_error_message(Some(StrBytes::from_static_str("NONE")))
            })
            .collect()
    } else {
        Vec::new()
    };
    UpdateFeaturesResponse::default()
        .with_error_code(errors::NONE)
        .with_error_message(None)
        .with_results(results)
}

/// Why `name` cannot be set to `level` with upgrade type `kind`, in Kafka's words where Kafka
/// has them (its `FeatureControlManager.updateFeature`, checked in its order).
fn check(name: &str, level: i16, kind: i8) -> Result<(), String> {
    if !matches!(kind, UPGRADE | SAFE_DOWNGRADE | UNSAFE_DOWNGRADE) {
        return Err("The controller does not support the given upgrade type.".into());
    }
    if level < 0 {
        return Err("A feature version cannot be less than 0.".into());
    }
    // A feature kaas does not know is at level 0, the only level it supports (as in Kafka,
    // where a controller supports [0, 0] of a feature it does not know).
    let (max, finalized) = versions::FEATURES
        .iter()
        .find(|(n, _, _)| *n == name)
        .map_or((0, 0), |(_, max, finalized)| (*max, *finalized));
    if level > max {
        return Err(if max == 0 {
            "kaas does not support this feature.".into()
        } else {
            format!("kaas only supports versions 0-{max}")
        });
    }
    if level < finalized && kind == UPGRADE {
        return Err(
            "Can't downgrade the version of this feature without setting the upgrade \
                    type to either safe or unsafe downgrade."
                .into(),
        );
    }
    if level > finalized && kind != UPGRADE {
        return Err("Can't downgrade to a newer version.".into());
    }
    if level != finalized {
        // Only group.version is reported, finalized at its maximum: KIP-848's consumer groups
        // are part of every kaas broker and cannot be switched off.
        return Err(format!(
            "kaas serves {name} at level {finalized} on every broker; its level cannot be \
             changed."
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use kaas_wire::kafka_protocol::messages::update_features_request::FeatureUpdateKey;

    use super::*;

    fn request(updates: &[(&str, i16, i8)]) -> UpdateFeaturesRequest {
        UpdateFeaturesRequest::default().with_feature_updates(
            updates
                .iter()
                .map(|(n, level, kind)| {
                    FeatureUpdateKey::default()
                        .with_feature(StrBytes::from_string((*n).to_string()))
                        .with_max_version_level(*level)
                        .with_upgrade_type(*kind)
                })
                .collect(),
        )
    }

    fn refusal(updates: &[(&str, i16, i8)]) -> String {
        let r = update_features(&request(updates), 1);
        assert_eq!(r.error_code, errors::INVALID_UPDATE_VERSION, "{r:?}");
        assert!(
            r.results.is_empty(),
            "no per-feature results on a refusal: {r:?}"
        );
        r.error_message.expect("a refusal says why").to_string()
    }

    #[test]
    fn keeping_the_finalized_level_is_accepted_and_listed_up_to_v1() {
        let req = request(&[("group.version", 1, UPGRADE)]);
        let v1 = update_features(&req, 1);
        assert_eq!(v1.error_code, errors::NONE);
        assert_eq!(v1.results.len(), 1);
        assert_eq!(v1.results[0].feature.as_str(), "group.version");
        assert_eq!(v1.results[0].error_code, errors::NONE);
        let v2 = update_features(&req, 2);
        assert_eq!(v2.error_code, errors::NONE);
        assert!(v2.results.is_empty(), "v2 has no per-feature results");
    }

    #[test]
    fn an_unknown_feature_above_level_0_fails_the_whole_request() {
        let msg = refusal(&[
            ("group.version", 1, UPGRADE),
            ("sarama.unsupported.feature", 1, UPGRADE),
        ]);
        assert!(
            msg.ends_with(
                "Invalid update version 1 for feature sarama.unsupported.feature. kaas does not \
                 support this feature."
            ),
            "{msg}"
        );
        // Disabling a feature nobody has is a no-op, as in Kafka.
        let ok = update_features(&request(&[("no.such.feature", 0, SAFE_DOWNGRADE)]), 1);
        assert_eq!(ok.error_code, errors::NONE);
    }

    #[test]
    fn group_version_cannot_move() {
        assert!(refusal(&[("group.version", 2, UPGRADE)]).ends_with("only supports versions 0-1"));
        assert!(refusal(&[("group.version", 0, UPGRADE)]).contains("without setting the upgrade"));
        assert!(refusal(&[("group.version", 0, SAFE_DOWNGRADE)]).contains("cannot be changed"));
        assert!(refusal(&[("group.version", 0, UNSAFE_DOWNGRADE)]).contains("cannot be changed"));
        assert!(refusal(&[("group.version", -1, UPGRADE)]).contains("cannot be less than 0"));
        assert!(refusal(&[("group.version", 1, 9)]).contains("upgrade type"));
    }

    #[test]
    fn v0_allow_downgrade_is_a_safe_downgrade_and_the_last_update_of_a_name_counts() {
        let mut req = request(&[("group.version", 0, UPGRADE)]);
        req.feature_updates[0].allow_downgrade = true;
        let r = update_features(&req, 0);
        assert!(
            r.error_message.unwrap().contains("cannot be changed"),
            "a v0 downgrade reaches the level check"
        );
        let r = update_features(
            &request(&[("group.version", 0, UPGRADE), ("group.version", 1, UPGRADE)]),
            1,
        );
        assert_eq!(r.error_code, errors::NONE);
        assert_eq!(r.results.len(), 1);
    }
}
