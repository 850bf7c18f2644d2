package dev.tideline.writers;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.stream.IntStream;
import org.junit.jupiter.api.Test;

class ChangeBufferTest {

  private static final long HOUR_MS = 3_600_000;
  private static final Duration DEADLINE = Duration.ofSeconds(5);

  /** Records every flush: its rows and the thread that shipped them. */
  static final class Recorder implements ChangeBuffer.Shipper<Integer> {
    final List<List<Integer>> flushes = new CopyOnWriteArrayList<>();
    final List<String> threads = new CopyOnWriteArrayList<>();

    @Override
    public void ship(List<Integer> rows) {
      flushes.add(List.copyOf(rows));
      threads.add(Thread.currentThread().getName());
    }

    List<Integer> shipped() {
      List<Integer> all = new ArrayList<>();
      flushes.forEach(all::addAll);
      return all;
    }
  }

  @Test
  void shipsEveryMaxRowsRowsAtOnceAndTheRestAtClose() throws Exception {
    Recorder recorder = new Recorder();
    ChangeBuffer<Integer> buffer = new ChangeBuffer<>(3, HOUR_MS, recorder, "test-flusher");
    for (int row = 0; row < 7; row++) buffer.add(row);
    assertEquals(List.of(List.of(0, 1, 2), List.of(3, 4, 5)), recorder.flushes); // in add(), no waiting
    assertEquals(1, buffer.pending());
    buffer.close();
    assertEquals(List.of(List.of(0, 1, 2), List.of(3, 4, 5), List.of(6)), recorder.flushes);
    assertEquals(0, buffer.pending());
  }

  @Test
  void aLoneRowGoesOutOnceItHasLingered() throws Exception {
    AtomicLong shippedAt = new AtomicLong();
    Recorder recorder = new Recorder();
    ChangeBuffer<Integer> buffer = new ChangeBuffer<>(100, 50, rows -> {
      shippedAt.set(System.nanoTime());
      recorder.ship(rows);
    }, "test-flusher");
    long addedAt = System.nanoTime();
    buffer.add(1);
    Eventually.holds("the lone row's flush", DEADLINE, () -> !recorder.flushes.isEmpty());
    assertEquals(List.of(List.of(1)), recorder.flushes);
    assertTrue(shippedAt.get() - addedAt >= Duration.ofMillis(50).toNanos(), "flushed before its linger time");
    assertEquals("test-flusher", recorder.threads.get(0));
    buffer.close();
    assertEquals(1, recorder.flushes.size());
  }

  @Test
  void orderIsKeptWhenBothThreadsFlush() throws Exception {
    Recorder recorder = new Recorder();
    // Linger 0: the flusher ships whatever it finds, while add() ships every 5 rows itself.
    ChangeBuffer<Integer> buffer = new ChangeBuffer<>(5, 0, recorder, "test-flusher");
    int rows = 0;
    for (int burst = 0; burst < 2_000; burst++) {
      for (int i = 0; i <= burst % 12; i++) buffer.add(rows++);
      // Now and then wait for the flusher to take what add() left (fewer than 5: add() never ships
      // those), so both threads surely flush, and race the rest of the time.
      if (burst % 100 == 0) Eventually.holds("the flusher's flush", DEADLINE, () -> buffer.pending() == 0);
    }
    buffer.close();
    assertEquals(IntStream.range(0, rows).boxed().toList(), recorder.shipped());
    assertTrue(recorder.flushes.stream().allMatch(flush -> !flush.isEmpty() && flush.size() <= 5));
    assertTrue(recorder.threads.contains("test-flusher"), "the flusher never flushed");
    assertTrue(recorder.threads.contains(Thread.currentThread().getName()), "add() never flushed");
  }

  @Test
  void closeFlushesEverythingBuffered() throws Exception {
    Recorder recorder = new Recorder();
    ChangeBuffer<Integer> buffer = new ChangeBuffer<>(100, HOUR_MS, recorder, "test-flusher");
    for (int row = 0; row < 42; row++) buffer.add(row);
    assertTrue(recorder.flushes.isEmpty());
    buffer.close();
    assertEquals(IntStream.range(0, 42).boxed().toList(), recorder.shipped());
  }

  @Test
  void flushThenRunsTheActionAfterTheRowsBeforeIt() throws Exception {
    List<String> events = new CopyOnWriteArrayList<>();
    ChangeBuffer<Integer> buffer = new ChangeBuffer<>(100, HOUR_MS, rows -> events.add("rows " + rows), "test-flusher");
    buffer.add(1);
    buffer.add(2);
    buffer.flushThen(() -> events.add("truncate"));
    buffer.add(3);
    buffer.close();
    assertEquals(List.of("rows [1, 2]", "truncate", "rows [3]"), events);
  }

  @Test
  void abortDropsTheBuffer() throws Exception {
    Recorder recorder = new Recorder();
    ChangeBuffer<Integer> buffer = new ChangeBuffer<>(100, HOUR_MS, recorder, "test-flusher");
    for (int row = 0; row < 3; row++) buffer.add(row);
    buffer.abort();
    assertEquals(0, buffer.pending());
    assertTrue(recorder.flushes.isEmpty());
  }

  @Test
  void abortStopsAFlusherThatIsRetrying() throws Exception {
    AtomicInteger attempts = new AtomicInteger();
    Backoff backoff = Backoff.standard(error -> true); // the store is away for good
    ChangeBuffer<Integer> buffer = new ChangeBuffer<>(100, 0, rows -> backoff.run("test", () -> {
      attempts.incrementAndGet();
      throw new java.net.ConnectException("refused");
    }), "test-flusher");
    buffer.add(1);
    Eventually.holds("a first attempt", DEADLINE, () -> attempts.get() > 0);
    long began = System.nanoTime();
    buffer.abort(); // interrupts the back-off sleep
    assertTrue(System.nanoTime() - began < Duration.ofSeconds(5).toNanos(), "abort waited for the retries");
    assertEquals(1, attempts.get());
  }

  @Test
  void aFailedFlushOfTheFlusherIsThrownByTheNextCalls() throws Exception {
    IllegalStateException boom = new IllegalStateException("boom");
    ChangeBuffer<Integer> buffer = new ChangeBuffer<>(100, 1, rows -> {
      throw boom;
    }, "test-flusher");
    buffer.add(1);
    Eventually.holds("the flusher's failure", DEADLINE, () -> {
      try {
        buffer.check();
        return false;
      } catch (Exception e) {
        return true;
      }
    });
    assertSame(boom, assertThrows(IllegalStateException.class, () -> buffer.add(2)));
    assertSame(boom, assertThrows(IllegalStateException.class, () -> buffer.flush()));
    assertSame(boom, assertThrows(IllegalStateException.class, buffer::close));
    buffer.abort(); // what Spark's close(error) does next: no throw
  }

  @Test
  void aFailedFlushInAddIsThrownThereAndAgainByClose() throws Exception {
    IllegalStateException boom = new IllegalStateException("boom");
    ChangeBuffer<Integer> buffer = new ChangeBuffer<>(2, HOUR_MS, rows -> {
      throw boom;
    }, "test-flusher");
    buffer.add(1);
    assertSame(boom, assertThrows(IllegalStateException.class, () -> buffer.add(2)));
    assertSame(boom, assertThrows(IllegalStateException.class, buffer::close));
  }
}
