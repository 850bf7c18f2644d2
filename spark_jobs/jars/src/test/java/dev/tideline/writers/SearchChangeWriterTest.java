package dev.tideline.writers;

import static dev.tideline.writers.Changes.upsert;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import org.apache.kafka.common.errors.TimeoutException;
import org.junit.jupiter.api.Test;

class SearchChangeWriterTest {

  private final List<String> events = new ArrayList<>();
  private final DeadLetters out = new DeadLetters("apply:search", letter -> {
    events.add("letter " + new String(letter, StandardCharsets.US_ASCII));
    return CompletableFuture.completedFuture(null);
  }, (topic, value) -> {
    events.add(topic + " " + new String(value, StandardCharsets.UTF_8));
    return CompletableFuture.completedFuture(null);
  }, () -> 99L);

  private final List<SearchChange> rows = List.of(
      upsert("1", 5, 0).offset(10).touches("{\"view\":\"v\",\"value\":\"1\"}", "{\"view\":\"w\",\"value\":\"1\"}")
          .build(),
      upsert("2", 5, 0).offset(11).touches("{\"view\":\"v\",\"value\":\"2\"}").build(),
      upsert("3", 5, 0).offset(12).build());

  private Map<Integer, String> applied(List<SearchChange> chunk, Map<Integer, String> refused) {
    events.add("apply " + chunk.size() + " rows");
    return refused;
  }

  @Test
  void touchesGoOutOnceTheirRowIsAppliedAndARefusedRowBecomesALetterInstead() throws Exception {
    SearchChangeWriter.ship(rows, chunk -> applied(chunk, Map.of(1, "elasticsearch document_parsing_exception: bad")),
        out, "tideline.search-touches");
    assertEquals(List.of("apply 3 rows",
        "tideline.search-touches {\"view\":\"v\",\"value\":\"1\"}",
        "tideline.search-touches {\"view\":\"w\",\"value\":\"1\"}",
        "letter {\"stage\": \"apply:search\", \"reason\": \"elasticsearch document_parsing_exception: bad\", "
            + "\"topic\": \"tideline.public.orders\", \"partition\": 0, \"offset\": 11, \"value\": null, "
            + "\"dead_at_ms\": 99}"),
        events);
  }

  @Test
  void withoutATouchesTopicNothingIsTouched() throws Exception {
    SearchChangeWriter.ship(rows, chunk -> applied(chunk, Map.of()), out, "");
    assertEquals(List.of("apply 3 rows"), events);
  }

  @Test
  void aChunkThatFailsTouchesNothing() {
    IllegalStateException boom = new IllegalStateException("2 rows still conflict after 5 tries");
    assertSame(boom, assertThrows(IllegalStateException.class, () -> SearchChangeWriter.ship(rows, chunk -> {
      throw boom;
    }, out, "tideline.search-touches")));
    assertEquals(List.of(), events);
  }

  @Test
  void aTouchKafkaDidNotAcknowledgeFailsTheWait() {
    TimeoutException timeout = new TimeoutException("Expiring 1 record(s)");
    DeadLetters failing = new DeadLetters("apply:search", letter -> CompletableFuture.completedFuture(null),
        (topic, value) -> CompletableFuture.failedFuture(timeout), () -> 7L);
    SearchChangeWriter.touch(failing, "tideline.search-touches", List.of("{}"));
    assertSame(timeout, assertThrows(TimeoutException.class, failing::awaitSent));
  }
}
