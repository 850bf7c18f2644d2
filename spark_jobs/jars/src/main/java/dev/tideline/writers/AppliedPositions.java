package dev.tideline.writers;

import java.util.Collection;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;

/**
 * How far each real-time query's writers have applied their Kafka records, published as the committed
 * offsets of a consumer group of the query's own ({@link #GROUP_PREFIX} + its query id, which stays the
 * same across restarts from one checkpoint). Spark commits a real-time query's offsets to its checkpoint
 * only when an epoch ends (seconds apart); `tide status` reads these too, so a real-time query's lag and
 * freshness are at most {@link #INTERVAL_MS} plus a status read old. The group has no members and
 * nothing consumes with it: it is a place in Kafka to keep positions, which Kafka expires once unused.
 * Publishing is side work: a failure is retried later and never fails a writer.
 */
public final class AppliedPositions {

  /** The group's name is this and the query id. */
  public static final String GROUP_PREFIX = "tideline-applied-";
  static final long INTERVAL_MS = 500;
  private static final long PUBLISH_TIMEOUT_S = 10;

  /** One partition of one query's group. */
  record Partition(String group, String topic, int partition) {}

  /** Sets a group's next offsets ({@code Admin.alterConsumerGroupOffsets} in production). */
  @FunctionalInterface
  interface Publisher {
    void publish(String group, Map<TopicPartition, Long> nextOffsets) throws Exception;
  }

  private static final ConcurrentHashMap<String, AppliedPositions> BY_BOOTSTRAP = new ConcurrentHashMap<>();

  private final Coalescer<Partition, Long> marks;

  AppliedPositions(Publisher publisher, long intervalMs, String threadName) {
    this.marks = new Coalescer<>(batch -> publish(publisher, batch), Math::max, intervalMs, threadName);
  }

  /** The JVM's positions published to the Kafka at {@code bootstrap}. */
  public static AppliedPositions of(String bootstrap) {
    return BY_BOOTSTRAP.computeIfAbsent(bootstrap,
        key -> new AppliedPositions(new KafkaPublisher(bootstrap), INTERVAL_MS, "tideline-applied-positions"));
  }

  /** The records at these origins are applied: the group's next offset of each partition passes them. */
  public void applied(String group, Collection<Origin> origins) {
    Map<Partition, Long> next = new HashMap<>();
    for (Origin origin : origins) {
      next.merge(new Partition(group, origin.topic(), origin.partition()), origin.offset() + 1, Math::max);
    }
    marks.mark(next);
  }

  /** Stops the thread (tests). */
  void stop() throws InterruptedException {
    marks.stop();
  }

  private static void publish(Publisher publisher, Map<Partition, Long> batch) throws Exception {
    Map<String, Map<TopicPartition, Long>> byGroup = new HashMap<>();
    batch.forEach((at, offset) ->
        byGroup.computeIfAbsent(at.group(), group -> new HashMap<>()).put(new TopicPartition(at.topic(), at.partition()), offset));
    for (Map.Entry<String, Map<TopicPartition, Long>> group : byGroup.entrySet()) {
      publisher.publish(group.getKey(), group.getValue());
    }
  }

  /** Kafka's admin client, created on first use by the publishing thread (so a Kafka away is retried). */
  private static final class KafkaPublisher implements Publisher {
    private final String bootstrap;
    private Admin admin;

    KafkaPublisher(String bootstrap) {
      this.bootstrap = bootstrap;
    }

    @Override
    public void publish(String group, Map<TopicPartition, Long> nextOffsets) throws Exception {
      if (admin == null) {
        Properties config = new Properties();
        config.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        admin = KafkaClients.create(() -> Admin.create(config));
      }
      Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
      nextOffsets.forEach((partition, offset) -> offsets.put(partition, new OffsetAndMetadata(offset)));
      admin.alterConsumerGroupOffsets(group, offsets).all().get(PUBLISH_TIMEOUT_S, TimeUnit.SECONDS);
    }
  }
}
