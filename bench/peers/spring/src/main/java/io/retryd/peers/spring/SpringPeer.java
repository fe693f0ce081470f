package io.retryd.peers.spring;

import io.retryd.peers.common.Meter;
import io.retryd.peers.common.PeerArgs;
import io.retryd.peers.common.PeerMain;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.utils.AppInfoParser;
import org.springframework.context.annotation.AnnotationConfigApplicationContext;

/**
 * Spring Kafka as a peer, plain Spring (no Boot, so the jar holds Spring Kafka and what it
 * needs): one {@code @KafkaListener} on the default container factory. The success and keyed
 * shapes use a plain listener; the retry shape one with {@code @RetryableTopic}: one retry
 * attempt after a fixed back-off of {@code --retry-delay-ms}, on Spring's own retry topic.
 */
public final class SpringPeer implements PeerMain.Peer {
    static final String TOPIC = "peer.topic";
    static final String GROUP = "peer.group";
    static final String RETRY_DELAY_MS = "peer.retry-delay-ms";
    static final String RETRY_PARTITIONS = "peer.retry-partitions";

    public static void main(String[] argv) {
        PeerMain.run(argv, new SpringPeer());
    }

    @Override
    public String system() {
        return "spring-kafka";
    }

    @Override
    public String version() {
        Properties p = new Properties();
        try (InputStream in = getClass().getResourceAsStream("/peer.properties")) {
            p.load(in);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        return p.getProperty("version");
    }

    private static int partitionsOf(PeerArgs args) throws Exception {
        try (Admin admin = Admin.create(Map.of(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args.bootstrap))) {
            TopicDescription description = admin.describeTopics(List.of(args.topic))
                    .allTopicNames()
                    .get(30, TimeUnit.SECONDS)
                    .get(args.topic);
            return description.partitions().size();
        }
    }

    @Override
    public Map<String, Object> start(PeerArgs args, Meter meter) throws Exception {
        boolean retry = args.shape.equals("retry");
        // Listener annotations resolve ${...} from the environment, which holds these.
        System.setProperty(TOPIC, args.topic);
        System.setProperty(GROUP, args.group);
        System.setProperty(RETRY_DELAY_MS, Long.toString(args.retryDelayMs));
        // Spring forwards a failed record to the retry topic's partition of the same number:
        // its retry topic gets as many partitions as the main topic (one, by default, and
        // then every forward logs a warning and lands where the producer puts it).
        int partitions = retry ? partitionsOf(args) : 1;
        System.setProperty(RETRY_PARTITIONS, Integer.toString(partitions));

        AnnotationConfigApplicationContext context = new AnnotationConfigApplicationContext();
        context.registerBean(PeerArgs.class, () -> args);
        context.registerBean(Meter.class, () -> meter);
        context.register(KafkaConfig.class);
        if (retry) {
            context.register(RetryConfig.class, RetryListener.class);
        } else {
            context.register(PlainListener.class);
        }
        context.refresh(); // starts the listener containers

        Map<String, Object> config = new LinkedHashMap<>();
        config.put("consumer", KafkaConfig.consumerConfig(args));
        if (args.concurrency != null) {
            config.put("container.concurrency", args.concurrency);
        }
        if (retry) {
            config.put("producer", KafkaConfig.producerConfig(args));
            config.put("RetryableTopic.attempts", 2);
            config.put("RetryableTopic.backOff.delay_ms", args.retryDelayMs);
            config.put("RetryableTopic.numPartitions", partitions);
        }
        if (args.shape.equals("keyed")) {
            config.put("handler_ms_max", args.handlerMsMax);
        }
        config.put("kafka_clients", AppInfoParser.getVersion());
        return config;
    }
}
