package io.retryd.peers.spring;

import io.retryd.peers.common.PeerArgs;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.TreeMap;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.kafka.annotation.EnableKafka;
import org.springframework.kafka.config.ConcurrentKafkaListenerContainerFactory;
import org.springframework.kafka.core.ConsumerFactory;
import org.springframework.kafka.core.DefaultKafkaConsumerFactory;
import org.springframework.kafka.core.DefaultKafkaProducerFactory;
import org.springframework.kafka.core.KafkaAdmin;
import org.springframework.kafka.core.KafkaTemplate;
import org.springframework.kafka.core.ProducerFactory;

/**
 * The beans Spring Boot would otherwise configure, with Spring Kafka's defaults except the
 * broker, the group, reading from the earliest offset and byte-array (de)serializers. The
 * producer, template and admin serve the retry topics (forwarding, creating them).
 */
@Configuration
@EnableKafka
public class KafkaConfig {

    static Map<String, Object> consumerConfig(PeerArgs args) {
        Map<String, Object> c = new LinkedHashMap<>();
        c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args.bootstrap);
        c.put(ConsumerConfig.GROUP_ID_CONFIG, args.group);
        c.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        c.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        c.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        c.putAll(overrides("peer.consumer."));
        return c;
    }

    static Map<String, Object> producerConfig(PeerArgs args) {
        Map<String, Object> p = new LinkedHashMap<>();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, args.bootstrap);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.putAll(overrides("peer.producer."));
        return p;
    }

    /**
     * Client settings given as JVM system properties {@code -Dpeer.consumer.NAME=VALUE} or
     * {@code -Dpeer.producer.NAME=VALUE}: for experiments off the defaults (they show in the
     * result's config like every other non-default setting).
     */
    static Map<String, Object> overrides(String prefix) {
        Map<String, Object> o = new TreeMap<>();
        for (String name : System.getProperties().stringPropertyNames()) {
            if (name.startsWith(prefix)) {
                o.put(name.substring(prefix.length()), System.getProperty(name));
            }
        }
        return o;
    }

    @Bean
    public ConsumerFactory<byte[], byte[]> consumerFactory(PeerArgs args) {
        return new DefaultKafkaConsumerFactory<>(consumerConfig(args));
    }

    @Bean
    public ConcurrentKafkaListenerContainerFactory<byte[], byte[]> kafkaListenerContainerFactory(
            ConsumerFactory<byte[], byte[]> consumerFactory, PeerArgs args) {
        ConcurrentKafkaListenerContainerFactory<byte[], byte[]> factory =
                new ConcurrentKafkaListenerContainerFactory<>();
        factory.setConsumerFactory(consumerFactory);
        if (args.concurrency != null) {
            factory.setConcurrency(args.concurrency);
        }
        return factory;
    }

    @Bean
    public ProducerFactory<byte[], byte[]> producerFactory(PeerArgs args) {
        return new DefaultKafkaProducerFactory<>(producerConfig(args));
    }

    @Bean
    public KafkaTemplate<byte[], byte[]> kafkaTemplate(ProducerFactory<byte[], byte[]> producerFactory) {
        return new KafkaTemplate<>(producerFactory);
    }

    @Bean
    public KafkaAdmin kafkaAdmin(PeerArgs args) {
        return new KafkaAdmin(Map.of(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args.bootstrap));
    }
}
