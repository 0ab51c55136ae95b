//! Per-API request timing split into phases, and the error codes responses carried (Kafka's
//! RequestMetrics: `RequestQueueTimeMs`/`LocalTimeMs`/`ResponseSendTimeMs`, `ErrorsPerSec`).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use kaas_shard::probe::{ERROR_CODES, PHASES};
use kaas_wire::kafka_protocol::ResponseError;
use kaas_wire::versions::SUPPORTED_APIS;

use super::metrics::{api_label, LatencyHistogram};
use super::HealthView;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApiPhaseLabels {
    api: &'static str,
    phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApiErrorLabels {
    api: &'static str,
    error: String,
}

/// `kaas_request_duration_seconds{api, phase}`: one histogram per served API and phase, as
/// read at one scrape (prometheus-client's own histogram cannot be filled from bucket counts).
#[derive(Debug)]
struct RequestPhases(Vec<(ApiPhaseLabels, LatencyHistogram)>);

impl Collector for RequestPhases {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(
            "kaas_request_duration",
            "Request time by API and phase: queue (behind the connection's previous request), \
             process (handling, including what Kafka counts as remote time: the group-commit \
             sync of acks=all and Fetch's long-poll wait), send (behind earlier responses, then \
             written)",
            Some(&Unit::Seconds),
            MetricType::Histogram,
        )?;
        for (labels, histogram) in &self.0 {
            histogram.encode(family.encode_family(labels)?)?;
        }
        Ok(())
    }
}

/// Kafka's name for an error code (`NOT_LEADER_OR_FOLLOWER`), from the codec's variant name;
/// `OTHER` for the last slot, which also counts every larger code.
fn error_name(code: i16) -> String {
    if usize::try_from(code).is_ok_and(|c| c >= ERROR_CODES - 1) {
        return "OTHER".to_string();
    }
    let e = match ResponseError::try_from_code(code) {
        Some(ResponseError::Unknown(_)) | None => return format!("CODE_{code}"),
        Some(e) => e,
    };
    let camel = format!("{e:?}");
    let mut out = String::with_capacity(camel.len() + 8);
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

impl HealthView {
    pub(super) fn register_request_detail(&self, registry: &mut Registry) {
        let mut phases = Vec::new();
        for (key, _, _) in SUPPORTED_APIS {
            let api = api_label(*key as usize);
            for (i, phase) in PHASES.iter().enumerate() {
                let histogram = LatencyHistogram::read(
                    self.probes
                        .iter()
                        .map(|p| &p.request_phases[*key as usize][i]),
                );
                // Only APIs that were called: 19 series per API and phase would otherwise
                // be thousands of zeros on every scrape.
                if histogram.count > 0 {
                    phases.push((ApiPhaseLabels { api, phase }, histogram));
                }
            }
        }
        registry.register_collector(Box::new(RequestPhases(phases)));

        let errors = Family::<ApiErrorLabels, Counter>::default();
        for key in 0..kaas_shard::probe::API_KEYS {
            for slot in 0..ERROR_CODES {
                let n = self.sum(|p| &p.response_errors[key][slot]);
                if n == 0 {
                    continue;
                }
                let code = if slot == 0 { -1 } else { slot as i16 };
                errors
                    .get_or_create(&ApiErrorLabels {
                        api: api_label(key),
                        error: error_name(code),
                    })
                    .inc_by(n);
            }
        }
        registry.register(
            "kaas_response_errors",
            "Error codes in responses, by API and Kafka error name (each partition, topic, \
             group or resource with an error counts once)",
            errors,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::error_name;

    // Labels read as Kafka names its errors, so dashboards and runbooks match Kafka's.
    #[test]
    fn error_names_are_kafkas() {
        assert_eq!(error_name(6), "NOT_LEADER_OR_FOLLOWER");
        assert_eq!(error_name(-1), "UNKNOWN_SERVER_ERROR");
        assert_eq!(error_name(25), "UNKNOWN_MEMBER_ID");
        assert_eq!(error_name(158), "CODE_158");
        assert_eq!(error_name(159), "OTHER");
    }
}
