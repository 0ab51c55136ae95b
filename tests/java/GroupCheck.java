import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.CommitFailedException;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.RebalanceInProgressException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Drives Java-client consumer groups for tests/test_groups.py (and the group benchmarks).
 *
 *   group BOOTSTRAP TOPIC PARTITIONS GROUP PROTOCOL NCONSUMERS NMESSAGES [ASSIGNOR]
 *       Creates TOPIC, produces NMESSAGES/2 values "gv:%09d", starts NCONSUMERS consumers
 *       (group.protocol=PROTOCOL, classic or consumer; manual commitSync after every
 *       non-empty poll), waits until their assignments are disjoint and cover every
 *       partition ("STABLE1 ms"), closes consumer 0 (it leaves the group) and waits until
 *       the rest cover every partition again ("STABLE2 ms": time from the start of the
 *       close to a covering, disjoint assignment), produces the other half, waits until every
 *       value was consumed ("CONSUMED distinct dups"; "COMMIT_FAILURES n" counts commits
 *       that lost a race with a rebalance, which the application tolerates as Kafka's docs
 *       ask), stops the consumers and prints the
 *       group's committed offsets next to the end offsets ("COMMITTED partition off end").
 *   commitbench BOOTSTRAP TOPIC GROUP SECONDS MODE
 *       One consumer assign()ed to partition 0 commits offsets for SECONDS, MODE sync
 *       (commitSync in a loop) or async (commitAsync, at most 64 outstanding); prints
 *       "COMMITS n rate/s".
 * Exit code 0 on success, 1 on any failure (message on stderr).
 */
public class GroupCheck {
    static final long WAIT_MS = 90_000;

    public static void main(String[] args) {
        try {
            run(args);
        } catch (Throwable t) {
            t.printStackTrace();
            System.exit(1);
        }
        System.exit(0);
    }

    static void run(String[] args) throws Exception {
        switch (args[0]) {
            case "group":
                group(args[1], args[2], Integer.parseInt(args[3]), args[4], args[5],
                    Integer.parseInt(args[6]), Integer.parseInt(args[7]),
                    args.length > 8 ? args[8] : null);
                break;
            case "commitbench":
                commitBench(args[1], args[2], args[3], Integer.parseInt(args[4]), args[5]);
                break;
            default:
                throw new IllegalArgumentException("unknown mode " + args[0]);
        }
    }

    /** One consumer thread: poll, remember what it read, commit, publish its assignment. */
    static final class Member implements Runnable {
        final int id;
        final Properties props;
        final String topic;
        final Set<String> seen;
        final AtomicLong dups;
        final AtomicLong commitFailures;
        final AtomicBoolean stop = new AtomicBoolean();
        final AtomicReference<Set<Integer>> assignment = new AtomicReference<>(Collections.emptySet());
        final AtomicReference<Throwable> failure = new AtomicReference<>();
        final AtomicBoolean closed = new AtomicBoolean();
        final Thread thread;

        Member(int id, Properties props, String topic, Set<String> seen, AtomicLong dups,
               AtomicLong commitFailures) {
            this.id = id;
            this.props = props;
            this.topic = topic;
            this.seen = seen;
            this.dups = dups;
            this.commitFailures = commitFailures;
            this.thread = new Thread(this, "member-" + id);
            this.thread.setDaemon(true);
        }

        public void run() {
            try (KafkaConsumer<byte[], byte[]> c =
                     new KafkaConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
                c.subscribe(Collections.singletonList(topic));
                while (!stop.get()) {
                    ConsumerRecords<byte[], byte[]> recs = c.poll(Duration.ofMillis(100));
                    for (ConsumerRecord<byte[], byte[]> r : recs) {
                        if (!seen.add(new String(r.value(), StandardCharsets.UTF_8))) dups.incrementAndGet();
                    }
                    if (!recs.isEmpty()) {
                        try {
                            c.commitSync();
                        } catch (CommitFailedException | RebalanceInProgressException e) {
                            // A commit racing a rebalance fails; as any application does, go on:
                            // the records are read again by whoever owns the partition next.
                            commitFailures.incrementAndGet();
                        }
                    }
                    Set<Integer> a = new TreeSet<>();
                    for (TopicPartition tp : c.assignment()) a.add(tp.partition());
                    assignment.set(a);
                }
                assignment.set(Collections.emptySet());
            } catch (Throwable t) {
                failure.set(t);
            } finally {
                closed.set(true);
            }
        }
    }

    static boolean covers(List<Member> ms, int partitions) {
        int sum = 0;
        Set<Integer> all = new HashSet<>();
        for (Member m : ms) {
            Set<Integer> a = m.assignment.get();
            sum += a.size();
            all.addAll(a);
        }
        return sum == partitions && all.size() == partitions;
    }

    static String describe(List<Member> ms) {
        StringBuilder b = new StringBuilder();
        for (Member m : ms) b.append(m.id).append('=').append(m.assignment.get()).append(' ');
        return b.toString();
    }

    static void check(List<Member> ms) {
        for (Member m : ms) {
            if (m.failure.get() != null) throw new IllegalStateException("member " + m.id + " failed", m.failure.get());
        }
    }

    static void produce(String bootstrap, String topic, int from, int to) throws Exception {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        try (KafkaProducer<byte[], byte[]> producer =
                 new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer())) {
            for (int i = from; i < to; i++) {
                producer.send(new ProducerRecord<>(topic, null,
                    String.format("gv:%09d", i).getBytes(StandardCharsets.UTF_8)));
            }
            producer.flush();
        }
    }

    static void group(String bootstrap, String topic, int partitions, String group, String protocol,
                      int n, int messages, String assignor) throws Exception {
        Properties ap = new Properties();
        ap.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(ap)) {
            admin.createTopics(Collections.singleton(new NewTopic(topic, partitions, (short) 1)))
                .all().get(30, TimeUnit.SECONDS);
        }
        produce(bootstrap, topic, 0, messages / 2);
        Set<String> seen = ConcurrentHashMap.newKeySet();
        AtomicLong dups = new AtomicLong();
        AtomicLong commitFailures = new AtomicLong();
        List<Member> members = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            Properties p = new Properties();
            p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
            p.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, protocol);
            p.put(ConsumerConfig.CLIENT_ID_CONFIG, "group-check-" + i);
            p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
            p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
            if (protocol.equals("classic")) {
                p.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "10000");
                p.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "500");
            } else if (assignor != null) {
                p.put(ConsumerConfig.GROUP_REMOTE_ASSIGNOR_CONFIG, assignor);
            }
            members.add(new Member(i, p, topic, seen, dups, commitFailures));
        }
        long t0 = System.nanoTime();
        for (Member m : members) m.thread.start();
        long deadline = System.currentTimeMillis() + WAIT_MS;
        int expectOwners = Math.min(n, partitions);
        while (true) {
            check(members);
            long owners = members.stream().filter(m -> !m.assignment.get().isEmpty()).count();
            if (covers(members, partitions) && owners == expectOwners) break;
            if (System.currentTimeMillis() > deadline)
                throw new IllegalStateException("no covering assignment: " + describe(members));
            Thread.sleep(20);
        }
        System.out.printf("STABLE1 %d %s%n", (System.nanoTime() - t0) / 1_000_000, describe(members));

        Member leaving = members.get(0);
        long t1 = System.nanoTime();
        leaving.stop.set(true);
        leaving.thread.join(60_000);
        if (leaving.failure.get() != null) throw new IllegalStateException("close failed", leaving.failure.get());
        List<Member> rest = members.subList(1, members.size());
        deadline = System.currentTimeMillis() + WAIT_MS;
        while (!covers(rest, partitions)) {
            check(rest);
            if (System.currentTimeMillis() > deadline)
                throw new IllegalStateException("no takeover: " + describe(rest));
            Thread.sleep(5);
        }
        System.out.printf("STABLE2 %d %s%n", (System.nanoTime() - t1) / 1_000_000, describe(rest));

        produce(bootstrap, topic, messages / 2, messages);
        deadline = System.currentTimeMillis() + WAIT_MS;
        while (seen.size() < messages) {
            check(rest);
            if (System.currentTimeMillis() > deadline)
                throw new IllegalStateException("consumed only " + seen.size() + " of " + messages);
            Thread.sleep(20);
        }
        System.out.printf("CONSUMED %d %d%n", seen.size(), dups.get());
        System.out.printf("COMMIT_FAILURES %d%n", commitFailures.get());
        for (Member m : rest) m.stop.set(true);
        for (Member m : rest) m.thread.join(60_000);
        check(rest);
        try (Admin admin = Admin.create(ap)) {
            Map<TopicPartition, OffsetAndMetadata> committed =
                admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get(30, TimeUnit.SECONDS);
            Map<TopicPartition, org.apache.kafka.clients.admin.OffsetSpec> latest = new HashMap<>();
            for (int p = 0; p < partitions; p++)
                latest.put(new TopicPartition(topic, p), org.apache.kafka.clients.admin.OffsetSpec.latest());
            var ends = admin.listOffsets(latest).all().get(30, TimeUnit.SECONDS);
            for (int p = 0; p < partitions; p++) {
                TopicPartition tp = new TopicPartition(topic, p);
                OffsetAndMetadata c = committed.get(tp);
                System.out.printf("COMMITTED %d %d %d%n", p, c == null ? -1 : c.offset(), ends.get(tp).offset());
            }
        }
    }

    static void commitBench(String bootstrap, String topic, String group, int seconds, String mode) throws Exception {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        TopicPartition tp = new TopicPartition(topic, 0);
        try (KafkaConsumer<byte[], byte[]> c =
                 new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            c.assign(Collections.singletonList(tp));
            // Warm up: find the coordinator, open the group's log.
            c.commitSync(Collections.singletonMap(tp, new OffsetAndMetadata(0)));
            AtomicLong done = new AtomicLong();
            AtomicReference<Exception> err = new AtomicReference<>();
            long end = System.nanoTime() + seconds * 1_000_000_000L;
            long t0 = System.nanoTime();
            long i = 1;
            if (mode.equals("sync")) {
                while (System.nanoTime() < end) {
                    c.commitSync(Collections.singletonMap(tp, new OffsetAndMetadata(i++)));
                    done.incrementAndGet();
                }
            } else {
                while (System.nanoTime() < end) {
                    if (i - done.get() < 64) {
                        c.commitAsync(Collections.singletonMap(tp, new OffsetAndMetadata(i++)), (o, e) -> {
                            if (e != null) err.compareAndSet(null, e);
                            done.incrementAndGet();
                        });
                    }
                    c.poll(Duration.ZERO);
                }
                c.commitSync(Collections.singletonMap(tp, new OffsetAndMetadata(i)));
            }
            double secs = (System.nanoTime() - t0) / 1e9;
            if (err.get() != null) throw err.get();
            System.out.printf("COMMITS %d %.0f%n", done.get(), done.get() / secs);
        }
    }
}
