package dev.tideline.writers;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import org.junit.jupiter.api.Test;
import redis.clients.jedis.exceptions.JedisDataException;

class RedisChangeWriterTest {

  private static byte[] text(String value) {
    return value.getBytes(StandardCharsets.UTF_8);
  }

  private static RedisChangeWriter.Change change(int partition, long offset) {
    return new RedisChangeWriter.Change(new byte[][] {text("1"), text("row " + offset)},
        new Origin("tideline.public.orders", partition, offset));
  }

  @Test
  void aRowRedisRefusedBecomesALetterNamingItsOrigin() throws Exception {
    List<RedisChangeWriter.Change> rows = List.of(change(0, 10), change(0, 11), change(1, 12));
    List<String> sent = new ArrayList<>();
    DeadLetters letters = new DeadLetters("apply:cache", letter -> {
      sent.add(new String(letter, StandardCharsets.US_ASCII));
      return CompletableFuture.completedFuture(null);
    }, () -> 99L);
    List<List<byte[][]>> applied = new ArrayList<>();
    RedisChangeWriter.ship(rows, args -> {
      applied.add(args);
      // APPLY_BATCH's reply: {index, reason} pairs, 1-based, for the rows it refused.
      List<Object> reply = List.of(List.of(List.of(2L, text("WRONGTYPE Operation against a key"))));
      return RedisStore.refusals(reply, List.of(0));
    }, letters);
    assertEquals(1, applied.size());
    assertArrayEquals(rows.get(2).args(), applied.get(0).get(2));
    assertEquals(List.of("{\"stage\": \"apply:cache\", \"reason\": \"WRONGTYPE Operation against a key\", "
        + "\"topic\": \"tideline.public.orders\", \"partition\": 0, \"offset\": 11, \"value\": null, "
        + "\"dead_at_ms\": 99}"), sent);
  }

  @Test
  void refusalsOfEveryChunkCountFromTheChunksStart() {
    List<Object> replies = List.of(
        List.of(List.of(1L, text("first"))),
        List.of(),
        List.of(List.of(3L, text("third")), List.of(1L, text("second"))));
    assertEquals(Map.of(0, "first", 1000, "second", 1002, "third"),
        RedisStore.refusals(replies, List.of(0, 500, 1000)));
    assertEquals(List.of(0, 1000, 1002), List.copyOf(RedisStore.refusals(replies, List.of(0, 500, 1000)).keySet()));
  }

  @Test
  void anErrorReplyFailsTheFlush() {
    List<Object> replies = List.of(List.of(), new JedisDataException("ERR Error running script"));
    assertThrows(JedisDataException.class, () -> RedisStore.refusals(replies, List.of(0, 500)));
  }

  @Test
  void aScriptIsNamedByItsSha1() {
    // The SHA-1 SCRIPT LOAD returns for "return 1" (and Python's Script.sha).
    assertEquals("e0e1f9fabfc9d4800c877a703b823ac0578ff8db",
        new String(RedisStore.Script.of("return 1").sha(), StandardCharsets.US_ASCII));
  }
}
