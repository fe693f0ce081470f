package io.retryd.peers.pc;

import io.confluent.parallelconsumer.ParallelConsumerOptions;
import io.confluent.parallelconsumer.ParallelConsumerOptions.ProcessingOrder;
import io.confluent.parallelconsumer.ParallelStreamProcessor;
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
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.utils.AppInfoParser;

/**
 * Confluent Parallel Consumer as a peer: KEY ordering, {@code maxConcurrency} from
 * {@code --concurrency} (16 by default), everything else the library's defaults (periodic
 * asynchronous commits, batch size 1). It has no delayed retry of its own, so the retry shape
 * is refused (exit 2).
 */
public final class ParallelConsumerPeer implements PeerMain.Peer {
    static final int DEFAULT_CONCURRENCY = 16;

    public static void main(String[] argv) {
        PeerMain.run(argv, new ParallelConsumerPeer());
    }

    @Override
    public String system() {
        return "parallel-consumer";
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

    @Override
    public Map<String, Object> start(PeerArgs args, Meter meter) {
        if (args.shape.equals("retry")) {
            throw new PeerArgs.UsageError(
                    "the retry shape is not run: Parallel Consumer has no delayed retry topic");
        }
        Map<String, Object> consumerConfig = new LinkedHashMap<>();
        consumerConfig.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args.bootstrap);
        consumerConfig.put(ConsumerConfig.GROUP_ID_CONFIG, args.group);
        consumerConfig.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        consumerConfig.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false"); // required by PC
        consumerConfig.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        consumerConfig.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        Properties props = new Properties();
        props.putAll(consumerConfig);
        KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props);

        int concurrency = args.concurrency != null ? args.concurrency : DEFAULT_CONCURRENCY;
        ParallelConsumerOptions<byte[], byte[]> options = ParallelConsumerOptions.<byte[], byte[]>builder()
                .ordering(ProcessingOrder.KEY)
                .maxConcurrency(concurrency)
                .consumer(consumer)
                .build();
        ParallelStreamProcessor<byte[], byte[]> processor = ParallelStreamProcessor.createEosStreamProcessor(options);
        processor.subscribe(List.of(args.topic));
        boolean keyed = args.shape.equals("keyed");
        double msMax = args.handlerMsMax;
        processor.poll(context -> {
            if (keyed) {
                PeerMain.pauseUpTo(msMax);
            }
            for (long i = context.size(); i > 0; i--) {
                meter.handled();
            }
        });

        Map<String, Object> config = new LinkedHashMap<>();
        config.put("consumer", consumerConfig);
        config.put("ordering", "KEY");
        config.put("maxConcurrency", concurrency);
        config.put("kafka_clients", AppInfoParser.getVersion());
        if (keyed) {
            config.put("handler_ms_max", msMax);
        }
        return config;
    }
}
