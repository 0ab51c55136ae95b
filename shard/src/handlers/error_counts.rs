//! The error codes a response carries, for `kaas_response_errors_total{api, error}` (Kafka's
//! RequestMetrics `ErrorsPerSec`): every top-level, topic, partition, group and resource error
//! code in it, NONE left out. A response counts each one, as Kafka's `errorCounts` does: a
//! Produce refused for two partitions counts NOT_LEADER_OR_FOLLOWER twice.

use kaas_wire::fetch_frame::FetchResponseOut;

/// The error codes of the items in each `$inner` list of `$outer`'s items (a response's
/// partitions within its topics): the responses' types differ, their shape does not.
macro_rules! nested {
    ($outer:expr, $inner:ident) => {
        $outer.iter().flat_map(|t| &t.$inner).map(|p| p.error_code)
    };
}
use kaas_wire::kafka_protocol::messages::ResponseKind;

/// Calls `f` with every error code in `response`.
pub fn each(response: &ResponseKind, mut f: impl FnMut(i16)) {
    use ResponseKind as R;
    let mut all = |codes: &mut dyn Iterator<Item = i16>| codes.for_each(&mut f);
    match response {
        R::ApiVersions(r) => f(r.error_code),
        R::Produce(r) => all(&mut nested!(r.responses, partition_responses)),
        R::Metadata(r) => all(
            &mut std::iter::once(r.error_code).chain(r.topics.iter().flat_map(|t| {
                std::iter::once(t.error_code).chain(t.partitions.iter().map(|p| p.error_code))
            })),
        ),
        R::ListOffsets(r) => all(&mut nested!(r.topics, partitions)),
        R::OffsetForLeaderEpoch(r) => all(&mut nested!(r.topics, partitions)),
        R::InitProducerId(r) => f(r.error_code),
        R::CreateTopics(r) => all(&mut r.topics.iter().map(|t| t.error_code)),
        R::DeleteTopics(r) => all(&mut r.responses.iter().map(|t| t.error_code)),
        R::CreatePartitions(r) => all(&mut r.results.iter().map(|t| t.error_code)),
        R::DeleteRecords(r) => all(&mut nested!(r.topics, partitions)),
        R::DescribeLogDirs(r) => {
            all(&mut std::iter::once(r.error_code).chain(r.results.iter().map(|d| d.error_code)))
        }
        R::DescribeProducers(r) => all(&mut nested!(r.topics, partitions)),
        R::DescribeConfigs(r) => all(&mut r.results.iter().map(|x| x.error_code)),
        R::AlterConfigs(r) => all(&mut r.responses.iter().map(|x| x.error_code)),
        R::IncrementalAlterConfigs(r) => all(&mut r.responses.iter().map(|x| x.error_code)),
        R::DescribeCluster(r) => f(r.error_code),
        R::DescribeTopicPartitions(r) => all(&mut r.topics.iter().flat_map(|t| {
            std::iter::once(t.error_code).chain(t.partitions.iter().map(|p| p.error_code))
        })),
        R::DescribeClientQuotas(r) => f(r.error_code),
        R::ListTransactions(r) => f(r.error_code),
        R::UpdateFeatures(r) => {
            all(&mut std::iter::once(r.error_code).chain(r.results.iter().map(|x| x.error_code)))
        }
        R::DescribeUserScramCredentials(r) => {
            all(&mut std::iter::once(r.error_code).chain(r.results.iter().map(|x| x.error_code)))
        }
        R::ListPartitionReassignments(r) => f(r.error_code),
        R::AlterPartitionReassignments(r) => {
            all(&mut std::iter::once(r.error_code).chain(nested!(r.responses, partitions)))
        }
        R::ElectLeaders(r) => all(&mut std::iter::once(r.error_code)
            .chain(nested!(r.replica_election_results, partition_result))),
        _ => each_in_group_response(response, f),
    }
}

/// [`each`] for the group coordinator's responses.
fn each_in_group_response(response: &ResponseKind, mut f: impl FnMut(i16)) {
    use ResponseKind as R;
    let mut all = |codes: &mut dyn Iterator<Item = i16>| codes.for_each(&mut f);
    match response {
        R::FindCoordinator(r) => {
            all(&mut std::iter::once(r.error_code)
                .chain(r.coordinators.iter().map(|c| c.error_code)))
        }
        R::JoinGroup(r) => f(r.error_code),
        R::SyncGroup(r) => f(r.error_code),
        R::Heartbeat(r) => f(r.error_code),
        R::LeaveGroup(r) => {
            all(&mut std::iter::once(r.error_code).chain(r.members.iter().map(|m| m.error_code)))
        }
        R::OffsetCommit(r) => all(&mut nested!(r.topics, partitions)),
        R::OffsetFetch(r) => {
            all(&mut std::iter::once(r.error_code)
                .chain(nested!(r.topics, partitions))
                .chain(r.groups.iter().flat_map(|g| {
                    std::iter::once(g.error_code).chain(nested!(g.topics, partitions))
                })))
        }
        R::OffsetDelete(r) => {
            all(&mut std::iter::once(r.error_code).chain(nested!(r.topics, partitions)))
        }
        R::ListGroups(r) => f(r.error_code),
        R::DescribeGroups(r) => all(&mut r.groups.iter().map(|g| g.error_code)),
        R::DeleteGroups(r) => all(&mut r.results.iter().map(|g| g.error_code)),
        R::ConsumerGroupHeartbeat(r) => f(r.error_code),
        R::ConsumerGroupDescribe(r) => all(&mut r.groups.iter().map(|g| g.error_code)),
        _ => {}
    }
}

/// Calls `f` with every error code in a Fetch response (framed by hand, see `fetch.rs`).
pub fn each_in_fetch(out: &FetchResponseOut, mut f: impl FnMut(i16)) {
    f(out.error_code);
    for p in out.topics.iter().flat_map(|t| &t.partitions) {
        f(p.error_code);
    }
}
