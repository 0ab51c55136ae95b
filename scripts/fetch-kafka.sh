#!/usr/bin/env bash
# scripts/fetch-kafka.sh — make sure the Apache Kafka 4.x jars are on this machine.
#
# Interface (stable; scripts/run-apache-kafka.sh and the bench comparison rely on it):
#   scripts/fetch-kafka.sh
#     Ensures every jar needed to run Apache Kafka itself (single-node KRaft, main class
#     `kafka.Kafka`, storage formatting with `kafka.tools.StorageTool`), its command-line
#     tools (org.apache.kafka.tools.*: TopicCommand, ConfigCommand, ConsoleProducer,
#     consumer.ConsoleConsumer, ProducerPerformance, ...) and the Java client is present in
#     one flat directory, and prints that directory's absolute path as the ONLY line on
#     stdout (progress goes to stderr). Use it as a classpath: java -cp "$DIR/*" ...
#   Directory: $KAAS_KAFKA_LIBS if set, else $HOME/.cache/kaas/kafka-libs.
#   The Kafka version is the one in tests/java/pom.xml (kafka.version); it is recorded in
#   $DIR/.kafka-version. Reruns are fast: nothing is fetched when the directory already
#   matches the pom (a stamp file holds the pom's checksum).
#   Needs: java (17+), mvn, network access to Maven Central on the first run.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
pom="$here/../tests/java/pom.xml"
libs="${KAAS_KAFKA_LIBS:-$HOME/.cache/kaas/kafka-libs}"
stamp="$libs/.pom-sha256"

want="$(sha256sum "$pom" | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && ls "$libs"/kafka_2.13-*.jar >/dev/null 2>&1; then
    echo "$libs"
    exit 0
fi

command -v mvn >/dev/null || { echo "fetch-kafka.sh: mvn not found (apt-get install maven)" >&2; exit 1; }
echo "fetch-kafka.sh: fetching Apache Kafka jars into $libs" >&2
tmp="$(mktemp -d "${libs%/}.tmp.XXXXXX" 2>/dev/null || { mkdir -p "$(dirname "$libs")"; mktemp -d "${libs%/}.tmp.XXXXXX"; })"
trap 'rm -rf "$tmp"' EXIT
ok=0
for attempt in 1 2 3; do
    if mvn -q -B -Dstyle.color=never -f "$pom" dependency:copy-dependencies \
        -DoutputDirectory="$tmp" -DincludeScope=runtime >&2; then
        ok=1; break
    fi
    echo "fetch-kafka.sh: mvn failed (attempt $attempt), retrying" >&2
    sleep $((attempt * 5))
done
[[ $ok == 1 ]] || { echo "fetch-kafka.sh: could not fetch the Kafka jars" >&2; exit 1; }
ver="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom" | head -1)"
echo "$ver" > "$tmp/.kafka-version"
echo "$want" > "$tmp/.pom-sha256"
rm -rf "$libs"
mv "$tmp" "$libs"
trap - EXIT
echo "$libs"
