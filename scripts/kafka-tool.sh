#!/usr/bin/env bash
# scripts/kafka-tool.sh — run an Apache Kafka command-line tool from the jars that
# scripts/install-test-deps.sh fetched (no Kafka distribution needed).
#
#   scripts/kafka-tool.sh kafka-topics --bootstrap-server 127.0.0.1:9092 --list
#   scripts/kafka-tool.sh topics --bootstrap-server 127.0.0.1:9092 --list     (same)
#   scripts/kafka-tool.sh --list                                            (the tool names)
#
# Tool names are the distribution's script names, with or without `kafka-` and `.sh`. The jars
# come from scripts/fetch-kafka.sh (~/.cache/kaas/kafka-libs, or $KAAS_KAFKA_LIBS); it fetches
# them on first use if mvn and Maven Central are reachable. Needs java 17+.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# script name -> main class (Apache Kafka 4.x; the tools live in kafka-tools-*.jar)
declare -A TOOLS=(
    [acls]=org.apache.kafka.tools.AclCommand
    [broker-api-versions]=org.apache.kafka.tools.BrokerApiVersionsCommand
    [client-metrics]=org.apache.kafka.tools.ClientMetricsCommand
    [cluster]=org.apache.kafka.tools.ClusterTool
    [configs]=org.apache.kafka.tools.ConfigCommand
    [console-consumer]=org.apache.kafka.tools.consumer.ConsoleConsumer
    [console-producer]=org.apache.kafka.tools.ConsoleProducer
    [consumer-groups]=org.apache.kafka.tools.consumer.group.ConsumerGroupCommand
    [consumer-perf-test]=org.apache.kafka.tools.ConsumerPerformance
    [delegation-tokens]=org.apache.kafka.tools.DelegationTokenCommand
    [delete-records]=org.apache.kafka.tools.DeleteRecordsCommand
    [dump-log]=org.apache.kafka.tools.DumpLogSegments
    [e2e-latency]=org.apache.kafka.tools.EndToEndLatency
    [features]=org.apache.kafka.tools.FeatureCommand
    [get-offsets]=org.apache.kafka.tools.GetOffsetShell
    [groups]=org.apache.kafka.tools.GroupsCommand
    [leader-election]=org.apache.kafka.tools.LeaderElectionCommand
    [log-dirs]=org.apache.kafka.tools.LogDirsCommand
    [metadata-quorum]=org.apache.kafka.tools.MetadataQuorumCommand
    [producer-perf-test]=org.apache.kafka.tools.ProducerPerformance
    [reassign-partitions]=org.apache.kafka.tools.reassign.ReassignPartitionsCommand
    [share-groups]=org.apache.kafka.tools.consumer.group.ShareGroupCommand
    [streams-application-reset]=org.apache.kafka.tools.StreamsResetter
    [streams-groups]=org.apache.kafka.tools.streams.StreamsGroupCommand
    [topics]=org.apache.kafka.tools.TopicCommand
    [transactions]=org.apache.kafka.tools.TransactionsCommand
    [verifiable-consumer]=org.apache.kafka.tools.VerifiableConsumer
    [verifiable-producer]=org.apache.kafka.tools.VerifiableProducer
)

usage() {
    echo "usage: $0 TOOL [ARGS...]   (TOOL: kafka-topics, topics, ...; --list shows them all)" >&2
    exit 2
}

[[ $# -ge 1 ]] || usage
if [[ "$1" == "--list" ]]; then
    printf 'kafka-%s\n' "${!TOOLS[@]}" | sort
    exit 0
fi
name="${1%.sh}"
name="${name#kafka-}"
shift
class="${TOOLS[$name]:-}"
if [[ -z "$class" ]]; then
    echo "$0: unknown tool '$name'; '$0 --list' shows the ones available" >&2
    exit 2
fi
command -v java >/dev/null || { echo "$0: java not found (Java 17+ is needed for the Kafka tools)" >&2; exit 1; }
libs="$(bash "$here/fetch-kafka.sh")"
exec java -Xms32m -Xmx512m -Dlog4j2.level=warn -cp "$libs/*" "$class" "$@"
