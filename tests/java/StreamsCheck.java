import java.time.Duration;
import java.util.*;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.LongDeserializer;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;

/**
 * A Kafka Streams word count, as a user writes it first (tests/test_kafka_streams.py):
 *
 *   StreamsCheck wordcount BOOTSTRAP APP_ID LINES GUARANTEE STATE_DIR
 *
 * writes LINES lines to APP_ID-in ("w<i%50> x<i%7> all"), runs the topology
 * split -> groupBy(word) (a repartition topic) -> count (a store with a changelog topic) ->
 * APP_ID-out, and reads APP_ID-out until every word's latest count is what the lines imply
 * or 120 s pass. Prints `state <final KafkaStreams state>`, `error <the uncaught exception's
 * root cause class: message>` if a stream thread died, and `count <word> <latest count>` per
 * word. Exit 0 whatever happened: the test judges the output.
 */
public class StreamsCheck {
    static final long DEADLINE_MS = 120_000;

    public static void main(String[] a) throws Exception {
        String bootstrap = a[1], app = a[2], guarantee = a[4], stateDir = a[5];
        int lines = Integer.parseInt(a[3]);
        String in = app + "-in", out = app + "-out";

        Properties pp = new Properties();
        pp.put("bootstrap.servers", bootstrap);
        pp.put("key.serializer", StringSerializer.class.getName());
        pp.put("value.serializer", StringSerializer.class.getName());
        try (KafkaProducer<String, String> p = new KafkaProducer<>(pp)) {
            for (int i = 0; i < lines; i++) {
                p.send(new ProducerRecord<>(in, "k" + i, "w" + (i % 50) + " x" + (i % 7) + " all"));
            }
            p.flush();
        }
        Map<String, Long> want = new TreeMap<>();
        for (int i = 0; i < lines; i++) {
            for (String w : List.of("w" + (i % 50), "x" + (i % 7), "all")) want.merge(w, 1L, Long::sum);
        }

        Properties sp = new Properties();
        sp.put(StreamsConfig.APPLICATION_ID_CONFIG, app);
        sp.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        sp.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, guarantee);
        sp.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        sp.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 2);
        sp.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 500);
        // Streams purges what it has consumed of a repartition topic with DeleteRecords after a
        // commit, at most this often (30 s by default): the test sees the purge.
        sp.put(StreamsConfig.REPARTITION_PURGE_INTERVAL_MS_CONFIG, 1000);
        StreamsBuilder b = new StreamsBuilder();
        b.stream(in, Consumed.with(Serdes.String(), Serdes.String()))
                .flatMapValues(v -> Arrays.asList(v.split(" ")))
                .groupBy((k, w) -> w, Grouped.with(Serdes.String(), Serdes.String()))
                .count(Materialized.as("counts"))
                .toStream()
                .to(out, Produced.with(Serdes.String(), Serdes.Long()));
        KafkaStreams streams = new KafkaStreams(b.build(), sp);
        AtomicReference<Throwable> died = new AtomicReference<>();
        streams.setUncaughtExceptionHandler(e -> {
            died.compareAndSet(null, e);
            return StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.start();

        Properties cp = new Properties();
        cp.put("bootstrap.servers", bootstrap);
        cp.put("group.id", app + "-reader");
        cp.put("auto.offset.reset", "earliest");
        cp.put("key.deserializer", StringDeserializer.class.getName());
        cp.put("value.deserializer", LongDeserializer.class.getName());
        Map<String, Long> got = new TreeMap<>();
        long start = System.currentTimeMillis();
        try (KafkaConsumer<String, Long> c = new KafkaConsumer<>(cp)) {
            c.subscribe(List.of(out));
            while (!got.equals(want) && died.get() == null
                    && System.currentTimeMillis() - start < DEADLINE_MS) {
                for (ConsumerRecord<String, Long> r : c.poll(Duration.ofMillis(200))) {
                    got.put(r.key(), r.value());
                }
            }
        }
        // One more commit interval, so the repartition topic's purge has run at least once.
        if (died.get() == null) Thread.sleep(2_500);
        System.out.println("state " + streams.state());
        streams.close(Duration.ofSeconds(30));
        Throwable e = died.get();
        if (e != null) {
            while (e.getCause() != null) e = e.getCause();
            System.out.println("error " + e.getClass().getSimpleName() + ": " + e.getMessage());
        }
        System.out.println("seconds " + (System.currentTimeMillis() - start) / 1000.0);
        for (Map.Entry<String, Long> w : got.entrySet()) {
            System.out.println("count " + w.getKey() + " " + w.getValue());
        }
    }
}
