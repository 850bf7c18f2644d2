package dev.tideline.writers;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.common.TopicPartition;
import org.junit.jupiter.api.Test;

class AppliedPositionsTest {

  private static final Duration DEADLINE = Duration.ofSeconds(5);

  /** The newest offsets each group was given, as Kafka would hold them. */
  static final class Groups implements AppliedPositions.Publisher {
    final Map<String, Map<TopicPartition, Long>> offsets = new ConcurrentHashMap<>();

    @Override
    public void publish(String group, Map<TopicPartition, Long> nextOffsets) {
      offsets.computeIfAbsent(group, key -> new ConcurrentHashMap<>()).putAll(nextOffsets);
    }

    Long at(String group, String topic, int partition) {
      return offsets.getOrDefault(group, Map.of()).get(new TopicPartition(topic, partition));
    }
  }

  @Test
  void eachGroupGetsTheOffsetAfterTheNewestAppliedRecordOfEachPartition() throws Exception {
    Groups groups = new Groups();
    AppliedPositions positions = new AppliedPositions(groups, 1, "test-positions");
    try {
      positions.applied("search", List.of(new Origin("orders", 0, 7), new Origin("orders", 0, 9),
          new Origin("orders", 1, 3)));
      positions.applied("cache", List.of(new Origin("orders", 0, 4)));
      Eventually.holds("both groups published", DEADLINE,
          () -> groups.at("search", "orders", 1) != null && groups.at("cache", "orders", 0) != null);
      assertEquals(10L, groups.at("search", "orders", 0));
      assertEquals(4L, groups.at("search", "orders", 1));
      assertEquals(5L, groups.at("cache", "orders", 0));
    } finally {
      positions.stop();
    }
  }

  @Test
  void aPositionNeverGoesBackAndAFailedPublishIsTriedAgain() throws Exception {
    Groups groups = new Groups();
    AtomicBoolean failed = new AtomicBoolean();
    AppliedPositions positions = new AppliedPositions((group, offsets) -> {
      if (!failed.getAndSet(true)) throw new org.apache.kafka.common.errors.TimeoutException("Kafka away");
      groups.publish(group, offsets);
    }, 1, "test-positions");
    try {
      positions.applied("search", List.of(new Origin("orders", 0, 20)));
      Eventually.holds("the failed publish", DEADLINE, failed::get);
      positions.applied("search", List.of(new Origin("orders", 0, 12))); // a replayed epoch's older chunk
      Eventually.holds("the publish again", DEADLINE, () -> groups.at("search", "orders", 0) != null);
      assertEquals(21L, groups.at("search", "orders", 0));
    } finally {
      positions.stop();
    }
  }
}
