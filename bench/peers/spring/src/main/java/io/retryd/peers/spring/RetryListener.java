package io.retryd.peers.spring;

import io.retryd.peers.common.Meter;
import io.retryd.peers.common.PeerArgs;
import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.header.Header;
import org.springframework.kafka.annotation.BackOff;
import org.springframework.kafka.annotation.KafkaListener;
import org.springframework.kafka.annotation.RetryableTopic;
import org.springframework.kafka.retrytopic.RetryTopicHeaders;
import org.springframework.kafka.support.KafkaHeaders;

/**
 * The retry shape: every record fails on its first attempt (read from the main topic) and
 * succeeds on its one retry (read from Spring's retry topic). Lateness is measured in this
 * process's monotonic clock: when the retry reached this method minus (when its first
 * attempt threw + the delay). A retry finds its first attempt by the original partition and
 * offset that Spring's forwarding adds as headers; a retry whose first attempt this process
 * did not see (an earlier run's, left in the shared retry topic) is neither handled nor
 * counted. Use a fresh topic per run.
 */
public class RetryListener {
    /** Clock slack when telling an earlier run's retry by its due time (Spring's, in wall ms). */
    private static final long STALE_MS = 50;

    private final Meter meter;
    private final String mainTopic;
    private final long delayMs;
    private final Map<Long, long[]> failedAt = new ConcurrentHashMap<>(); // {nanoTime, wall ms}

    public RetryListener(Meter meter, PeerArgs args) {
        this.meter = meter;
        this.mainTopic = args.topic;
        this.delayMs = args.retryDelayMs;
    }

    @RetryableTopic(
            attempts = "2",
            backOff = @BackOff(delayString = "${" + SpringPeer.RETRY_DELAY_MS + "}"),
            numPartitions = "${" + SpringPeer.RETRY_PARTITIONS + "}",
            kafkaTemplate = "kafkaTemplate")
    @KafkaListener(id = "peer", topics = "${" + SpringPeer.TOPIC + "}", groupId = "${" + SpringPeer.GROUP + "}")
    public void listen(ConsumerRecord<byte[], byte[]> record) {
        long now = System.nanoTime();
        if (record.topic().equals(mainTopic)) {
            failedAt.put(id(record.partition(), record.offset()), new long[] {System.nanoTime(), System.currentTimeMillis()});
            throw new FirstAttemptFailure();
        }
        Header partition = record.headers().lastHeader(KafkaHeaders.ORIGINAL_PARTITION);
        Header offset = record.headers().lastHeader(KafkaHeaders.ORIGINAL_OFFSET);
        if (partition == null || offset == null) {
            return; // not forwarded by Spring: not this run's
        }
        long key = id(ByteBuffer.wrap(partition.value()).getInt(), ByteBuffer.wrap(offset.value()).getLong());
        long[] failed = failedAt.get(key);
        Header due = record.headers().lastHeader(RetryTopicHeaders.DEFAULT_HEADER_BACKOFF_TIMESTAMP);
        if (failed == null || (due != null && new BigInteger(due.value()).longValue() < failed[1] + delayMs - STALE_MS)) {
            // The retry topic belongs to the main topic, not to the group: a new group reads
            // the retries an earlier run left there (due before this run's failure of the same
            // record). Not this run's: neither handled nor counted.
            return;
        }
        failedAt.remove(key);
        meter.lateness((now - failed[0]) / 1e6 - delayMs);
        meter.handled();
    }

    private static long id(int partition, long offset) {
        return ((long) partition << 48) ^ offset;
    }

    /** The planned failure of a first attempt (no stack trace: it is not a bug). */
    static final class FirstAttemptFailure extends RuntimeException {
        FirstAttemptFailure() {
            super("first attempt fails by design", null, false, false);
        }
    }
}
