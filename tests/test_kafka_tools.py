"""The stock Apache Kafka command-line tools (jars from Maven Central, run as their main
classes exactly as the kafka-*.sh wrappers do): kafka-topics (TopicCommand), kafka-configs
(ConfigCommand), kafka-console-producer/consumer and kafka-get-offsets (GetOffsetShell)."""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from kcheck import admin, create_topic, unique_topic

TOPIC_COMMAND = "org.apache.kafka.tools.TopicCommand"
CONSOLE_PRODUCER = "org.apache.kafka.tools.ConsoleProducer"
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"
GET_OFFSETS = "org.apache.kafka.tools.GetOffsetShell"


@pytest.fixture(scope="module")
def tool(kafka_libs):
    """Run a Kafka tool main class; returns (returncode, stdout, stderr)."""
    # kafka-configs moved from kafka.admin.ConfigCommand (core) to org.apache.kafka.tools
    config_cmd = "org.apache.kafka.tools.ConfigCommand"
    if not any(p.name.startswith("kafka-tools-") for p in kafka_libs.iterdir()):
        pytest.skip("kafka-tools jar missing")

    def run(cls, *args, input=None, timeout=120, check=True):
        if cls == "ConfigCommand":
            cls = config_cmd
        cmd = ["java", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
               "-cp", f"{kafka_libs}/*", cls, *map(str, args)]
        r = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout,
                           stdin=None if input is not None else subprocess.DEVNULL)
        if check and r.returncode != 0:
            raise AssertionError(f"{cls.rsplit('.', 1)[-1]} {' '.join(map(str, args))} "
                                 f"exited {r.returncode}\nstdout: {r.stdout[-3000:]}\n"
                                 f"stderr: {r.stderr[-3000:]}")
        return r.returncode, r.stdout, r.stderr

    return run


def describe(tool, broker, topic):
    """Parse `kafka-topics --describe`: (header fields, [partition line fields])."""
    _, out, _ = tool(TOPIC_COMMAND, "--bootstrap-server", broker.bootstrap, "--describe",
                     "--topic", topic)
    header, parts = None, []
    for line in out.splitlines():
        fields = dict(re.findall(r"(\w+):\s*(\S*)", line))
        if line.startswith("Topic:") and "PartitionCount" in fields:
            header = fields
        elif line.strip().startswith("Topic:") and "Partition" in fields:
            parts.append(fields)
    assert header is not None, f"no topic header in describe output:\n{out}"
    return header, parts


def wait_for(pred, timeout=15.0, interval=0.3):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(interval)


def test_topic_command_create_describe_alter_delete(broker, tool):
    """kafka-topics creates a topic with 3 partitions and a config, lists and describes it
    (every partition led), refuses a duplicate, grows it to 6 partitions, and deletes it."""
    topic = unique_topic("tools-topic")
    bs = ["--bootstrap-server", broker.bootstrap]
    _, out, _ = tool(TOPIC_COMMAND, *bs, "--create", "--topic", topic, "--partitions", 3,
                     "--replication-factor", 1, "--config", "retention.ms=86400000")
    assert f"Created topic {topic}." in out

    _, out, _ = tool(TOPIC_COMMAND, *bs, "--list")
    assert topic in out.split()

    header, parts = describe(tool, broker, topic)
    assert header["Topic"] == topic
    assert header["PartitionCount"] == "3" and header["ReplicationFactor"] == "1", header
    assert header.get("TopicId") not in (None, "", "AAAAAAAAAAAAAAAAAAAAAA"), \
        f"no real topic id: {header}"
    assert "retention.ms=86400000" in header.get("Configs", ""), header
    assert sorted(int(p["Partition"]) for p in parts) == [0, 1, 2]
    assert all(p["Leader"] not in ("-1", "none") for p in parts), parts

    rc, out, err = tool(TOPIC_COMMAND, *bs, "--create", "--topic", topic, "--partitions", 1,
                        "--replication-factor", 1, check=False)
    assert rc != 0 and "already exists" in (out + err), (rc, out, err)

    tool(TOPIC_COMMAND, *bs, "--alter", "--topic", topic, "--partitions", 6)
    got = wait_for(lambda: describe(tool, broker, topic)[0]["PartitionCount"] == "6")
    header, parts = describe(tool, broker, topic)
    assert got, header
    assert sorted(int(p["Partition"]) for p in parts) == list(range(6))

    tool(TOPIC_COMMAND, *bs, "--delete", "--topic", topic)
    gone = wait_for(lambda: topic not in tool(TOPIC_COMMAND, *bs, "--list")[1].split())
    assert gone, f"{topic} still listed after --delete"
    rc, out, err = tool(TOPIC_COMMAND, *bs, "--describe", "--topic", topic, check=False)
    assert rc != 0 and "does not exist" in (out + err), (rc, out, err)


def test_config_command_topic_configs(broker, tool):
    """kafka-configs adds topic configs, describes them, deletes one, and kafka-topics sees
    the result."""
    topic = unique_topic("tools-cfg")
    bs = ["--bootstrap-server", broker.bootstrap]
    tool(TOPIC_COMMAND, *bs, "--create", "--topic", topic, "--partitions", 2,
         "--replication-factor", 1)
    ent = ["--entity-type", "topics", "--entity-name", topic]
    _, out, _ = tool("ConfigCommand", *bs, *ent, "--alter", "--add-config",
                     "retention.ms=1000000,max.message.bytes=2000000")
    assert f"Completed updating config for topic {topic}." in out, out

    def dynamic_configs():
        _, out, _ = tool("ConfigCommand", *bs, *ent, "--describe")
        return dict(re.findall(r"^\s+([\w.]+)=(\S*) sensitive=", out, re.M))

    cfg = wait_for(lambda: (c := dynamic_configs()).get("retention.ms") == "1000000" and c) \
        or dynamic_configs()
    assert cfg.get("retention.ms") == "1000000", cfg
    assert cfg.get("max.message.bytes") == "2000000", cfg

    tool("ConfigCommand", *bs, *ent, "--alter", "--delete-config", "retention.ms")
    cfg = wait_for(lambda: "retention.ms" not in (c := dynamic_configs()) and c) \
        or dynamic_configs()
    assert "retention.ms" not in cfg, cfg
    assert cfg.get("max.message.bytes") == "2000000", cfg

    header, _ = describe(tool, broker, topic)
    assert "max.message.bytes=2000000" in header.get("Configs", ""), header
    assert "retention.ms=1000000" not in header.get("Configs", ""), header


def test_config_command_describes_broker(broker, tool):
    """kafka-configs --describe --all lists the broker's configuration by broker id."""
    md = admin(broker.bootstrap).list_topics(timeout=10)
    [broker_id] = list(md.brokers)
    _, out, _ = tool("ConfigCommand", "--bootstrap-server", broker.bootstrap,
                     "--entity-type", "brokers", "--entity-name", broker_id,
                     "--describe", "--all")
    assert f"All configs for broker {broker_id} are:" in out, out
    entries = dict(re.findall(r"^\s+([\w.]+)=(.*?) sensitive=", out, re.M))
    assert len(entries) >= 3, out


def test_config_command_alters_broker_defaults(broker, tool):
    """kafka-configs --entity-type brokers --entity-default --alter sets a dynamic broker
    default (log.retention.ms) that topics without their own value inherit, describes it, and
    deletes it; Kafka's other dynamic broker configs are accepted, as is a name Kafka does not
    define; a static one is refused with Kafka's reason."""
    bs = ["--bootstrap-server", broker.bootstrap]
    topic = unique_topic("tools-brk")
    tool(TOPIC_COMMAND, *bs, "--create", "--topic", topic, "--partitions", 1, "--replication-factor", 1)
    ent = ["--entity-type", "brokers", "--entity-default"]
    _, out, _ = tool("ConfigCommand", *bs, *ent, "--alter", "--add-config", "log.retention.ms=3600000")
    assert "Completed updating default config for brokers in the cluster." in out, out

    def topic_retention():
        _, out, _ = tool("ConfigCommand", *bs, "--entity-type", "topics", "--entity-name", topic, "--describe", "--all")
        m = re.search(r"^\s+retention.ms=(\S*) sensitive=\S+ synonyms=\{?([^\n]*)", out, re.M)
        return m.group(1) if m else out

    assert wait_for(lambda: topic_retention() == "3600000"), topic_retention()
    _, out, _ = tool("ConfigCommand", *bs, *ent, "--describe")
    assert "log.retention.ms=3600000" in out, out

    # Kafka's other dynamic broker configs are accepted as Kafka accepts them (and change
    # nothing in kaas). As in Kafka 4.4, a name Kafka does not define is stored and described
    # back as sensitive, and a static one is refused with Kafka's reason.
    tool("ConfigCommand", *bs, *ent, "--alter", "--add-config", "num.io.threads=4")
    _, out, _ = tool("ConfigCommand", *bs, *ent, "--describe")
    assert "num.io.threads=4" in out, out
    tool("ConfigCommand", *bs, *ent, "--alter", "--delete-config", "num.io.threads")
    tool("ConfigCommand", *bs, *ent, "--alter", "--add-config", "no.such.broker.config=4")
    _, out, _ = tool("ConfigCommand", *bs, *ent, "--describe")
    assert "no.such.broker.config=null sensitive=true" in out, out
    tool("ConfigCommand", *bs, *ent, "--alter", "--delete-config", "no.such.broker.config")
    rc, out, err = tool("ConfigCommand", *bs, *ent, "--alter", "--add-config", "log.dirs=/elsewhere", check=False)
    assert rc != 0 and "Cannot update these configs dynamically: [log.dirs]" in (out + err), (rc, out, err)

    tool("ConfigCommand", *bs, *ent, "--alter", "--delete-config", "log.retention.ms")
    assert wait_for(lambda: topic_retention() == "604800000"), topic_retention()


def test_config_command_keeps_a_brokers_own_configs_apart(broker, tool):
    """kafka-configs --entity-name <id> sets that broker's own dynamic config, above the
    cluster-wide default (--entity-default) and listed apart from it, as Kafka does: a topic
    without its own value inherits the broker's, and deleting the broker's leaves the
    default in place. Before, the two were one file: the broker's value replaced the default,
    and deleting it from either entity deleted it from both."""
    md = admin(broker.bootstrap).list_topics(timeout=10)
    [broker_id] = list(md.brokers)
    bs = ["--bootstrap-server", broker.bootstrap]
    topic = unique_topic("tools-own")
    tool(TOPIC_COMMAND, *bs, "--create", "--topic", topic, "--partitions", 1, "--replication-factor", 1)
    default = ["--entity-type", "brokers", "--entity-default"]
    own = ["--entity-type", "brokers", "--entity-name", broker_id]

    def topic_retention():
        _, out, _ = tool("ConfigCommand", *bs, "--entity-type", "topics", "--entity-name", topic,
                         "--describe", "--all")
        m = re.search(r"^\s+retention.ms=(\S*) sensitive=\S+ synonyms=\{(\w+)", out, re.M)
        return (m.group(1), m.group(2)) if m else out

    try:
        tool("ConfigCommand", *bs, *default, "--alter", "--add-config", "log.retention.ms=3600000")
        tool("ConfigCommand", *bs, *own, "--alter", "--add-config", "log.retention.ms=7200000")
        assert wait_for(lambda: topic_retention() == ("7200000", "DYNAMIC_BROKER_CONFIG")), \
            topic_retention()
        _, out, _ = tool("ConfigCommand", *bs, *own, "--describe")
        assert f"Dynamic configs for broker {broker_id} are:" in out, out
        assert "log.retention.ms=7200000" in out, out
        _, out, _ = tool("ConfigCommand", *bs, *default, "--describe")
        assert "log.retention.ms=3600000" in out and "7200000" not in out, out

        tool("ConfigCommand", *bs, *own, "--alter", "--delete-config", "log.retention.ms")
        assert wait_for(lambda: topic_retention() == ("3600000", "DYNAMIC_DEFAULT_BROKER_CONFIG")), \
            topic_retention()
        _, out, _ = tool("ConfigCommand", *bs, *default, "--describe")
        assert "log.retention.ms=3600000" in out, out
    finally:
        tool("ConfigCommand", *bs, *own, "--alter", "--delete-config", "log.retention.ms", check=False)
        tool("ConfigCommand", *bs, *default, "--alter", "--delete-config", "log.retention.ms",
             check=False)


def test_console_producer_consumer(broker, tool):
    """kafka-console-producer writes 1000 keyed lines (acks=all, idempotent);
    kafka-console-consumer --partition 0 --offset earliest (no group) prints them back with
    their keys at offsets 0..999, and kafka-get-offsets reports 0 and 1000."""
    topic = unique_topic("tools-console")
    bs = ["--bootstrap-server", broker.bootstrap]
    tool(TOPIC_COMMAND, *bs, "--create", "--topic", topic, "--partitions", 1,
         "--replication-factor", 1)
    n = 1000
    lines = "".join(f"k{i % 7}:line-{i}\n" for i in range(n))
    tool(CONSOLE_PRODUCER, *bs, "--topic", topic,
         "--reader-property", "parse.key=true", "--reader-property", "key.separator=:",
         "--command-property", "acks=all", "--command-property", "enable.idempotence=true",
         input=lines)
    _, out, err = tool(CONSOLE_CONSUMER, *bs, "--topic", topic, "--partition", 0,
                       "--offset", "earliest", "--max-messages", n, "--timeout-ms", 30000,
                       "--formatter-property", "print.key=true",
                       "--formatter-property", "print.offset=true",
                       "--formatter-property", "print.partition=true")
    rows = [line.split("\t") for line in out.splitlines() if line.startswith("Partition:")]
    assert len(rows) == n, f"read {len(rows)} of {n}; stderr: {err[-2000:]}"
    for i, row in enumerate(rows):
        assert row == [f"Partition:0", f"Offset:{i}", f"k{i % 7}", f"line-{i}"], row
    assert f"Processed a total of {n} messages" in err

    _, out, _ = tool(GET_OFFSETS, *bs, "--topic", topic, "--time", "-1")
    assert out.split() == [f"{topic}:0:{n}"], out
    _, out, _ = tool(GET_OFFSETS, *bs, "--topic", topic, "--time", "-2")
    assert out.split() == [f"{topic}:0:0"], out


def test_readme_wrapper_runs_the_tools_by_their_script_names(broker, kafka_libs):
    """The README's tool commands work as written through `scripts/kafka-tool.sh` (a newcomer
    with only the fetched jars had no `kafka-topics.sh` to run): create, describe and
    reconfigure a topic, and an unknown tool name is refused with exit 2 and the way to list
    the names."""
    from conftest import REPO
    wrapper = str(REPO / "scripts" / "kafka-tool.sh")
    topic = unique_topic("wrapped")

    def run(*args, check=True):
        r = subprocess.run([wrapper, *args], capture_output=True, text=True, timeout=180,
                           stdin=subprocess.DEVNULL)
        assert not check or r.returncode == 0, f"{args}: exit {r.returncode}\n{r.stderr[-2000:]}"
        return r

    run("kafka-topics.sh", "--bootstrap-server", broker.bootstrap, "--create", "--topic", topic,
        "--partitions", "3")
    out = run("kafka-topics", "--bootstrap-server", broker.bootstrap, "--describe",
              "--topic", topic).stdout
    assert re.search(rf"Topic:\s*{topic}\b.*PartitionCount:\s*3", out), out
    run("configs", "--bootstrap-server", broker.bootstrap, "--alter", "--entity-type", "topics",
        "--entity-name", topic, "--add-config", "retention.ms=3600000")
    out = run("kafka-configs", "--bootstrap-server", broker.bootstrap, "--describe",
              "--entity-type", "topics", "--entity-name", topic).stdout
    assert "retention.ms=3600000" in out, out
    bad = run("kafka-nonsense", check=False)
    assert bad.returncode == 2 and "--list" in bad.stderr, (bad.returncode, bad.stderr)


def test_kafka_log_dirs_reports_partition_sizes_and_the_volume(broker, kafka_libs):
    """`kafka-log-dirs --describe` (DescribeLogDirs, refused as unsupported before) lists the
    data directory with every partition of the topic, the sizes of those written to above
    the bytes written and 0 for the empty one, and the volume's total and usable bytes."""
    import json

    from conftest import REPO
    from confluent_kafka import Producer

    from kcheck import create_topic
    topic = unique_topic("logdirs")
    create_topic(broker.bootstrap, topic, 3)
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all",
                  "compression.type": "none"})
    for partition, n in ((0, 200), (1, 50)):
        for _ in range(n):
            p.produce(topic, b"x" * 1000, partition=partition)
    assert p.flush(60) == 0
    r = subprocess.run([str(REPO / "scripts" / "kafka-tool.sh"), "kafka-log-dirs",
                        "--bootstrap-server", broker.bootstrap, "--describe", "--topic-list", topic],
                       capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(next(line for line in r.stdout.splitlines() if line.startswith("{")))
    (b,) = doc["brokers"]
    (d,) = b["logDirs"]
    assert d["error"] is None and d["logDir"], d
    sizes = {p["partition"]: p["size"] for p in d["partitions"]}
    assert set(sizes) == {f"{topic}-0", f"{topic}-1", f"{topic}-2"}, sizes
    assert sizes[f"{topic}-0"] > 200 * 1000 and sizes[f"{topic}-1"] > 50 * 1000, sizes
    assert sizes[f"{topic}-0"] > sizes[f"{topic}-1"] and sizes[f"{topic}-2"] == 0, sizes
    if "totalBytes" in d:
        assert d["totalBytes"] > d["usableBytes"] > 0, d


def kafka_tool(*args, timeout=180):
    """scripts/kafka-tool.sh with `args`; returns the CompletedProcess."""
    from conftest import REPO
    return subprocess.run([str(REPO / "scripts" / "kafka-tool.sh"), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def test_kafka_transactions_describe_producers(broker, kafka_libs):
    """`kafka-transactions describe-producers` (DescribeProducers, refused as unsupported
    before) lists the idempotent producer that wrote the partition, with the epoch, the
    sequence of its last record and the timestamp of its last batch (it was -1, where Kafka
    shows the timestamp); a partition nobody wrote lists none."""
    from confluent_kafka import Producer

    from kcheck import create_topic
    topic = unique_topic("producers")
    create_topic(broker.bootstrap, topic, 2)
    p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    base_ms = int(time.time() * 1000) - 60_000
    for i in range(50):
        p.produce(topic, b"v%d" % i, partition=0, timestamp=base_ms + i)
    assert p.flush(60) == 0
    r = kafka_tool("kafka-transactions", "--bootstrap-server", broker.bootstrap,
                   "describe-producers", "--topic", topic, "--partition", 0)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [line.split() for line in r.stdout.splitlines() if line.strip()]
    header, rows = lines[0], lines[1:]
    assert header[:4] == ["ProducerId", "ProducerEpoch", "LatestCoordinatorEpoch", "LastSequence"], r.stdout
    assert len(rows) == 1, r.stdout
    row = dict(zip(header, rows[0]))
    assert int(row["ProducerId"]) >= 0 and row["ProducerEpoch"] == "0", row
    assert row["LastSequence"] == "49", row
    assert row["LastTimestamp"] == str(base_ms + 49), row
    r = kafka_tool("kafka-transactions", "--bootstrap-server", broker.bootstrap,
                   "describe-producers", "--topic", topic, "--partition", 1)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len([line for line in r.stdout.splitlines() if line.strip()]) == 1, r.stdout


def test_kafka_transactions_list_shows_none(broker, kafka_libs):
    """`kafka-transactions list` (ListTransactions, refused as unsupported before) prints its
    table with no rows: kaas never starts a transaction, as a Kafka cluster without
    transactional producers lists none."""
    r = kafka_tool("kafka-transactions", "--bootstrap-server", broker.bootstrap, "list")
    assert r.returncode == 0 and "Exception" not in r.stdout + r.stderr, (r.stdout, r.stderr[-2000:])
    lines = [line.split() for line in r.stdout.splitlines() if line.strip()]
    assert lines and lines[0][:2] == ["TransactionalId", "Coordinator"], r.stdout
    assert len(lines) == 1, r.stdout


def test_quota_scram_and_reassignment_tools_answer_empty(broker, kafka_libs):
    """What kaas has none of is described as empty, as Kafka describes an unconfigured cluster
    (these tools failed with UnsupportedVersionException before): client quotas, SCRAM users,
    ongoing partition reassignments."""
    r = kafka_tool("kafka-configs", "--bootstrap-server", broker.bootstrap, "--describe",
                   "--entity-type", "clients")
    assert r.returncode == 0 and "Exception" not in r.stdout + r.stderr, (r.stdout, r.stderr[-2000:])
    r = kafka_tool("kafka-configs", "--bootstrap-server", broker.bootstrap, "--describe",
                   "--entity-type", "users", "--entity-name", "alice")
    assert r.returncode == 0 and "Exception" not in r.stdout + r.stderr, (r.stdout, r.stderr[-2000:])
    r = kafka_tool("kafka-reassign-partitions", "--bootstrap-server", broker.bootstrap, "--list")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "No partition reassignments found" in r.stdout, r.stdout


def test_kafka_features_describes_the_group_protocol(broker, kafka_libs):
    """kafka-features describe (Admin.describeFeatures, read from ApiVersions) names what the
    broker supports: group.version finalized at 1, KIP-848's consumer group protocol, which
    every kaas broker serves. Before, it listed no feature at all."""
    if broker.kind != "kaas":
        pytest.skip("the feature levels asserted are kaas's")
    r = kafka_tool("kafka-features", "--bootstrap-server", broker.bootstrap, "describe")
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [l for l in r.stdout.splitlines() if l.startswith("Feature:")]
    assert len(lines) == 1, r.stdout
    fields = dict(re.findall(r"(\w+):\s*(\S+)", lines[0]))
    assert fields["Feature"] == "group.version", fields
    assert (fields["SupportedMinVersion"], fields["SupportedMaxVersion"]) == ("0", "1"), fields
    assert fields["FinalizedVersionLevel"] == "1", fields


def test_kafka_leader_election_finds_every_leader_in_place(broker, kafka_libs):
    """kafka-leader-election, as an operator runs it after a broker came back: every partition
    is led by its only replica, so there is nothing to elect, which the tool reports (exit 0);
    a partition that does not exist is named as such. Before, the tool failed with
    UnsupportedVersionException."""
    if broker.kind != "kaas":
        pytest.skip("kaas's answer for a single copy per partition")
    topic = unique_topic("elect")
    create_topic(broker.bootstrap, topic, 3)
    r = kafka_tool("kafka-leader-election", "--bootstrap-server", broker.bootstrap,
                   "--election-type", "preferred", "--topic", topic, "--partition", "1")
    assert r.returncode == 0, (r.stdout, r.stderr[-2000:])
    assert f"Valid replica already elected for partitions {topic}-1" in r.stdout, r.stdout
    # For every partition Kafka lists only what it elected or failed to: here nothing.
    r = kafka_tool("kafka-leader-election", "--bootstrap-server", broker.bootstrap,
                   "--election-type", "preferred", "--all-topic-partitions")
    assert r.returncode == 0 and not r.stdout.strip(), (r.stdout, r.stderr[-2000:])
    r = kafka_tool("kafka-leader-election", "--bootstrap-server", broker.bootstrap,
                   "--election-type", "unclean", "--topic", topic, "--partition", "7")
    assert r.returncode != 0
    assert "UnknownTopicOrPartitionException" in r.stdout + r.stderr, (r.stdout, r.stderr[-2000:])
