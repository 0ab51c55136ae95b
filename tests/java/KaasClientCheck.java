import java.io.BufferedWriter;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Drives the Apache Kafka Java client for tests/test_java_client.py.
 *
 *   create  BOOTSTRAP TOPIC PARTITIONS
 *       AdminClient.createTopics, then wait until describeTopics shows every partition led.
 *   produce BOOTSTRAP TOPIC N OUTFILE
 *       N keyed records (key "key-%05d" of i%1000, value "jv:%09d:" of i), acks=all,
 *       enable.idempotence=true; writes "i partition offset" per acknowledged record.
 *   consume BOOTSTRAP TOPIC PARTITIONS OUTFILE
 *       assign() every partition (no group), read from the beginning up to the end offsets;
 *       writes "partition offset key value" per record, and "# end partition offset" lines.
 *   load    BOOTSTRAP TOPIC PARTITIONS STOPFILE OUTFILE
 *       A producer with the client's defaults (acks=all, idempotent, 5 requests in flight)
 *       writing "j-<partition>-<sequence>" round robin over the partitions until STOPFILE
 *       exists, then flushing; writes "partition offset value" per acknowledged record and
 *       "E partition value error" per failed one (tests/test_failover_clients.py).
 *   member  BOOTSTRAP GROUP TOPIC OUTFILE PROTOCOL
 *       One consumer group member with the client's defaults (auto commit every 5 s,
 *       auto.offset.reset=latest; group.protocol classic or consumer) subscribed to TOPIC:
 *       appends "partition offset value" per record and flushes them to the kernel before
 *       the next poll, which is where auto commit commits what the last poll returned, so
 *       every committed offset was written first. SIGTERM closes the consumer (it commits
 *       and leaves the group). tests/test_failover_clients.py SIGKILLs it as well.
 * Exit code 0 on success, 1 on any error (message on stderr).
 */
public class KaasClientCheck {
    static String key(int i) { return String.format("key-%05d", i % 1000); }
    static String value(int i) { return String.format("jv:%09d:", i); }

    public static void main(String[] args) throws Exception {
        switch (args[0]) {
            case "create": create(args[1], args[2], Integer.parseInt(args[3])); break;
            case "produce": produce(args[1], args[2], Integer.parseInt(args[3]), args[4]); break;
            case "consume": consume(args[1], args[2], Integer.parseInt(args[3]), args[4]); break;
            case "load": load(args[1], args[2], Integer.parseInt(args[3]), args[4], args[5]); break;
            case "member": member(args[1], args[2], args[3], args[4], args[5]); break;
            default: throw new IllegalArgumentException("unknown mode " + args[0]);
        }
    }

    static void create(String bootstrap, String topic, int partitions) throws Exception {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(p)) {
            admin.createTopics(Collections.singleton(new NewTopic(topic, partitions, (short) 1)))
                .all().get(30, TimeUnit.SECONDS);
            long deadline = System.currentTimeMillis() + 30_000;
            while (true) {
                try {
                    TopicDescription d = admin.describeTopics(Collections.singleton(topic))
                        .allTopicNames().get(10, TimeUnit.SECONDS).get(topic);
                    if (d.partitions().size() == partitions
                            && d.partitions().stream().allMatch(x -> x.leader() != null)) {
                        System.out.println("created " + topic + " id=" + d.topicId());
                        return;
                    }
                } catch (Exception e) {
                    if (System.currentTimeMillis() > deadline) throw e;
                }
                if (System.currentTimeMillis() > deadline)
                    throw new IllegalStateException("topic " + topic + " not ready");
                Thread.sleep(200);
            }
        }
    }

    static void produce(String bootstrap, String topic, int n, String out) throws Exception {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.put(ProducerConfig.BATCH_SIZE_CONFIG, "131072");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "300000");
        p.put(ProducerConfig.CLIENT_ID_CONFIG, "kaas-test-java-producer");
        int[] parts = new int[n];
        long[] offsets = new long[n];
        AtomicInteger acked = new AtomicInteger();
        AtomicReference<Exception> firstError = new AtomicReference<>();
        long t0 = System.nanoTime();
        try (KafkaProducer<byte[], byte[]> producer =
                 new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer())) {
            for (int i = 0; i < n; i++) {
                final int idx = i;
                producer.send(new ProducerRecord<>(topic, key(i).getBytes(StandardCharsets.UTF_8),
                        value(i).getBytes(StandardCharsets.UTF_8)), (md, e) -> {
                    if (e != null) {
                        firstError.compareAndSet(null, e);
                        parts[idx] = -1;
                    } else {
                        parts[idx] = md.partition();
                        offsets[idx] = md.offset();
                        acked.incrementAndGet();
                    }
                });
            }
            producer.flush();
        }
        double secs = (System.nanoTime() - t0) / 1e9;
        if (firstError.get() != null) {
            System.err.println("produce error: " + firstError.get());
            firstError.get().printStackTrace();
            System.exit(1);
        }
        try (BufferedWriter w = Files.newBufferedWriter(Paths.get(out))) {
            for (int i = 0; i < n; i++) {
                w.write(i + " " + parts[i] + " " + offsets[i] + "\n");
            }
        }
        System.out.printf("produced %d acked %d in %.2fs%n", n, acked.get(), secs);
    }

    static void consume(String bootstrap, String topic, int partitions, String out) throws Exception {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "none");
        p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "5000");
        p.put(ConsumerConfig.CLIENT_ID_CONFIG, "kaas-test-java-consumer");
        List<TopicPartition> tps = new ArrayList<>();
        for (int i = 0; i < partitions; i++) tps.add(new TopicPartition(topic, i));
        long t0 = System.nanoTime();
        long count = 0;
        try (KafkaConsumer<byte[], byte[]> c =
                 new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer());
             BufferedWriter w = Files.newBufferedWriter(Paths.get(out))) {
            c.assign(tps);
            Map<TopicPartition, Long> begins = c.beginningOffsets(tps, Duration.ofSeconds(30));
            Map<TopicPartition, Long> ends = c.endOffsets(tps, Duration.ofSeconds(30));
            for (TopicPartition tp : tps) {
                if (begins.get(tp) != 0L)
                    throw new IllegalStateException(tp + " log start offset " + begins.get(tp));
                w.write("# end " + tp.partition() + " " + ends.get(tp) + "\n");
            }
            c.seekToBeginning(tps);
            Map<Integer, Long> pos = new HashMap<>();
            long deadline = System.currentTimeMillis() + 300_000;
            while (true) {
                boolean done = true;
                for (TopicPartition tp : tps) {
                    if (pos.getOrDefault(tp.partition(), 0L) < ends.get(tp)) done = false;
                }
                if (done) break;
                if (System.currentTimeMillis() > deadline)
                    throw new IllegalStateException("timed out at " + pos + " ends " + ends);
                ConsumerRecords<byte[], byte[]> recs = c.poll(Duration.ofMillis(1000));
                for (ConsumerRecord<byte[], byte[]> r : recs) {
                    w.write(r.partition() + " " + r.offset() + " "
                        + new String(r.key(), StandardCharsets.UTF_8) + " "
                        + new String(r.value(), StandardCharsets.UTF_8) + "\n");
                    pos.merge(r.partition(), r.offset() + 1, Math::max);
                    count++;
                }
            }
        }
        System.out.printf("consumed %d in %.2fs%n", count, (System.nanoTime() - t0) / 1e9);
    }

    static void load(String bootstrap, String topic, int partitions, String stopFile, String out)
            throws Exception {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.CLIENT_ID_CONFIG, "kaas-test-java-load");
        long[] seq = new long[partitions];
        long sent = 0;
        try (BufferedWriter w = Files.newBufferedWriter(Paths.get(out));
             KafkaProducer<byte[], byte[]> producer =
                 new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer())) {
            while (!Files.exists(Paths.get(stopFile))) {
                for (int part = 0; part < partitions; part++) {
                    final int fp = part;
                    final String v = "j-" + part + "-" + String.format("%08d", seq[part]++);
                    producer.send(new ProducerRecord<>(topic, part, null,
                            v.getBytes(StandardCharsets.UTF_8)), (md, e) -> {
                        String line = e == null ? fp + " " + md.offset() + " " + v + "\n"
                                                : "E " + fp + " " + v + " " + e + "\n";
                        synchronized (w) {
                            try {
                                w.write(line);
                            } catch (IOException io) {
                                throw new RuntimeException(io);
                            }
                        }
                    });
                    sent++;
                }
                Thread.sleep(10);
            }
            producer.flush();
        }
        System.out.println("sent " + sent);
    }

    static void member(String bootstrap, String group, String topic, String out, String protocol)
            throws Exception {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        p.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, protocol);
        p.put(ConsumerConfig.CLIENT_ID_CONFIG, "kaas-test-java-member");
        if (protocol.equals("classic")) {
            // As tests/group_member.py: Kafka's minimum session timeout bounds how long a
            // killed member's partitions wait.
            p.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "6000");
            p.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "1000");
        }
        KafkaConsumer<byte[], byte[]> consumer =
            new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer());
        Thread main = Thread.currentThread();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            consumer.wakeup();
            try {
                main.join(30_000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }));
        try (java.io.FileOutputStream w = new java.io.FileOutputStream(out, true)) {
            consumer.subscribe(Collections.singletonList(topic));
            try {
                while (true) {
                    ConsumerRecords<byte[], byte[]> recs = consumer.poll(Duration.ofMillis(200));
                    if (recs.isEmpty()) continue;
                    StringBuilder sb = new StringBuilder();
                    for (ConsumerRecord<byte[], byte[]> r : recs) {
                        sb.append(r.partition()).append(' ').append(r.offset()).append(' ')
                          .append(new String(r.value(), StandardCharsets.UTF_8)).append('\n');
                    }
                    // An unbuffered stream: the bytes are in the kernel before the next poll
                    // can commit past them, so a SIGKILL loses no processed line.
                    w.write(sb.toString().getBytes(StandardCharsets.UTF_8));
                }
            } catch (WakeupException e) {
                // SIGTERM: fall through to close, which commits and leaves.
            } finally {
                consumer.close();
            }
        }
    }
}
