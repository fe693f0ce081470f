package io.retryd.peers.spring;

import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.kafka.annotation.EnableKafkaRetryTopic;
import org.springframework.scheduling.TaskScheduler;
import org.springframework.scheduling.concurrent.ThreadPoolTaskScheduler;

/**
 * Retry topics on: {@code @EnableKafkaRetryTopic} needs a task scheduler (Boot would provide
 * one) to resume a retry topic's partition, paused until its next record is due.
 */
@Configuration
@EnableKafkaRetryTopic
public class RetryConfig {

    @Bean
    public TaskScheduler taskScheduler() {
        ThreadPoolTaskScheduler scheduler = new ThreadPoolTaskScheduler();
        scheduler.setThreadNamePrefix("retry-topic-");
        return scheduler;
    }
}
