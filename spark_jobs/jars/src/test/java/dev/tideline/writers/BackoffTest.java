package dev.tideline.writers;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.net.ConnectException;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;
import redis.clients.jedis.exceptions.JedisConnectionException;
import redis.clients.jedis.exceptions.JedisDataException;

class BackoffTest {

  @Test
  void retriesWhileTheStoreIsAwayDoublingTheWaitUpToTheMost() throws Exception {
    List<Long> waits = new ArrayList<>();
    Backoff backoff = new Backoff(500, 30_000, RedisStore::isAway, waits::add);
    AtomicInteger attempts = new AtomicInteger();
    String result = backoff.call("test", () -> {
      if (attempts.incrementAndGet() <= 8) throw new JedisConnectionException(new ConnectException("refused"));
      return "applied";
    });
    assertEquals("applied", result);
    assertEquals(9, attempts.get());
    assertEquals(List.of(500L, 1_000L, 2_000L, 4_000L, 8_000L, 16_000L, 30_000L, 30_000L), waits);
  }

  @Test
  void anyOtherErrorIsThrownAtOnce() {
    List<Long> waits = new ArrayList<>();
    Backoff backoff = new Backoff(500, 30_000, RedisStore::isAway, waits::add);
    JedisDataException refused = new JedisDataException("ERR Error running script");
    assertSame(refused, assertThrows(JedisDataException.class, () -> backoff.call("test", () -> {
      throw refused;
    })));
    assertEquals(List.of(), waits);
  }

  @Test
  void anInterruptedWaitEndsTheRetries() {
    Backoff backoff = new Backoff(500, 30_000, error -> true, millis -> {
      throw new InterruptedException("stopping");
    });
    assertThrows(InterruptedException.class, () -> backoff.call("test", () -> {
      throw new ConnectException("refused");
    }));
  }

  @Test
  void whatCountsAsAway() {
    assertEquals(true, RedisStore.isAway(new JedisConnectionException("Connection reset")));
    assertEquals(true, RedisStore.isAway(new RuntimeException(new java.net.SocketTimeoutException("Read timed out"))));
    assertEquals(true, RedisStore.isAway(new JedisDataException("LOADING Redis is loading the dataset in memory")));
    assertEquals(true, RedisStore.isAway(new JedisDataException("BUSY Redis is busy running a script.")));
    assertEquals(false, RedisStore.isAway(new JedisDataException("ERR Error running script")));
    assertEquals(false, RedisStore.isAway(new IllegalStateException("a bug")));
  }
}
