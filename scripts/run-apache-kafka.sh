#!/usr/bin/env bash
# scripts/run-apache-kafka.sh — run a single-node KRaft Apache Kafka 4.x in the foreground.
#
# Interface (stable; the kaas tests and the bench comparison rely on it):
#   scripts/run-apache-kafka.sh PORT DATADIR
#     Starts one Apache Kafka broker+controller (KRaft combined mode, node id 1) whose client
#     listener is PLAINTEXT://127.0.0.1:PORT, keeping everything under DATADIR (created if
#     missing; storage is formatted only the first time, so a restart on the same DATADIR keeps
#     the data). It runs in the foreground (exec java ...): SIGTERM stops it cleanly, and the
#     caller is expected to wait for PORT to accept connections (startup takes a few seconds).
#     Broker logs go to stdout/stderr.
#   Jars come from scripts/fetch-kafka.sh (fetched on first use).
#   Environment knobs (all optional):
#     KAFKA_HEAP_OPTS        JVM heap, default "-Xmx1g -Xms1g"
#     KAFKA_JVM_OPTS         extra JVM options, default Kafka's G1 settings
#     KAFKA_CONTROLLER_PORT  the KRaft controller port on 127.0.0.1, default: a free port
#                            (remembered in DATADIR/controller.port for restarts)
#     KAFKA_EXTRA_PROPS      extra server.properties lines, newline-separated key=value
#                            (e.g. "log.flush.interval.messages=1" for fsync-per-write runs)
#     KAFKA_LOG_LEVEL        root log level, default WARN (startup/shutdown lines still print)
#     JAVA                   java binary, default: $JAVA_HOME/bin/java or java on PATH
#   The generated config is DATADIR/server.properties.
set -euo pipefail

if [[ $# -ne 2 ]]; then
    echo "usage: $0 PORT DATADIR" >&2
    exit 2
fi
port="$1"
datadir="$2"
[[ "$port" =~ ^[0-9]+$ ]] || { echo "run-apache-kafka.sh: bad PORT '$port'" >&2; exit 2; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
libs="$("$here/fetch-kafka.sh")"
mkdir -p "$datadir"
datadir="$(cd "$datadir" && pwd)"

if [[ -n "${JAVA:-}" ]]; then java="$JAVA"
elif [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]]; then java="$JAVA_HOME/bin/java"
else java="java"; fi

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}
if [[ -n "${KAFKA_CONTROLLER_PORT:-}" ]]; then
    cport="$KAFKA_CONTROLLER_PORT"
elif [[ -s "$datadir/controller.port" ]]; then
    cport="$(cat "$datadir/controller.port")"
else
    cport="$(free_port)"
    if [[ "$cport" == "$port" ]]; then cport="$(free_port)"; fi
fi
echo "$cport" > "$datadir/controller.port"

props="$datadir/server.properties"
cat > "$props" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$datadir/kafka-logs
num.partitions=1
auto.create.topics.enable=true
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
delete.topic.enable=true
socket.request.max.bytes=104857600
PROPS
if [[ -n "${KAFKA_EXTRA_PROPS:-}" ]]; then
    printf '%s\n' "$KAFKA_EXTRA_PROPS" >> "$props"
fi

log4j="$datadir/log4j2.properties"
level="${KAFKA_LOG_LEVEL:-WARN}"
cat > "$log4j" <<L4J
status = error
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = $level
rootLogger.appenderRef.out.ref = STDOUT
logger.raftserver.name = kafka.server.KafkaRaftServer
logger.raftserver.level = INFO
logger.kafka.name = kafka.Kafka\$
logger.kafka.level = INFO
L4J

heap="${KAFKA_HEAP_OPTS:--Xmx1g -Xms1g}"
jvm="${KAFKA_JVM_OPTS:--server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true}"
common=(-Dlog4j2.configurationFile="$log4j" -cp "$libs/*")

if [[ ! -f "$datadir/kafka-logs/meta.properties" ]]; then
    cluster_id="$(python3 -c 'import base64,uuid; print(base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("="))')"
    # shellcheck disable=SC2086
    "$java" -Xmx256m "${common[@]}" kafka.tools.StorageTool format \
        -t "$cluster_id" -c "$props" --ignore-formatted >&2
fi

# shellcheck disable=SC2086
exec "$java" $heap $jvm "${common[@]}" kafka.Kafka "$props"
