package io.retryd.peers.spring;

import io.retryd.peers.common.Meter;
import io.retryd.peers.common.PeerArgs;
import io.retryd.peers.common.PeerMain;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.springframework.kafka.annotation.KafkaListener;

/** The success shape's no-op listener, or the keyed shape's 0..M ms pause. */
public class PlainListener {
    private final Meter meter;
    private final boolean keyed;
    private final double msMax;

    public PlainListener(Meter meter, PeerArgs args) {
        this.meter = meter;
        this.keyed = args.shape.equals("keyed");
        this.msMax = args.handlerMsMax;
    }

    @KafkaListener(id = "peer", topics = "${" + SpringPeer.TOPIC + "}", groupId = "${" + SpringPeer.GROUP + "}")
    public void listen(ConsumerRecord<byte[], byte[]> record) {
        if (keyed) {
            PeerMain.pauseUpTo(msMax);
        }
        meter.handled();
    }
}
