package dev.tideline.writers;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
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
  void shipsEveryMaxRowsRowsAsAChunkAndTheRestAtClose() throws Exception {
    Recorder recorder = new Recorder();
    ChangeBuffer<Integer> buffer = new ChangeBuffer<>(3, HOUR_MS, recorder, "test-flusher");
    for (int row = 0; row < 7; row++) buffer.add(row);
    Eventually.holds("two full chunks shipped", DEADLINE, () -> recorder.flushes.size() == 2);
    assertEquals(List.of(List.of(0, 1, 2), List.of(3, 4, 5)), recorder.flushes); // full: no lingering
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
  void orderIsKeptAcrossManyChunks() throws Exception {
    Recorder recorder = new Recorder();
    // Linger 0: the shipper takes whatever it finds, so chunk sizes vary with the race between threads.
    ChangeBuffer<Integer> buffer = new ChangeBuffer<>(5, 0, recorder, "test-flusher");
    int rows = 0;
    for (int burst = 0; burst < 2_000; burst++) {
      for (int i = 0; i <= burst % 12; i++) buffer.add(rows++);
      if (burst % 100 == 0) buffer.flush();
    }
    buffer.close();
    assertEquals(IntStream.range(0, rows).boxed().toList(), recorder.shipped());
    assertTrue(recorder.flushes.stream().allMatch(flush -> !flush.isEmpty() && flush.size() <= 5));
    assertTrue(recorder.threads.stream().allMatch("test-flusher"::equals), "a chunk was shipped by the task");
  }

  @Test
  void theTaskFillsTheNextChunkWhileOneIsInFlight() throws Exception {
    CountDownLatch release = new CountDownLatch(1);
    Recorder recorder = new Recorder();
    ChangeBuffer<Integer> buffer = new ChangeBuffer<>(2, 0, rows -> {
      recorder.ship(rows);
      release.await(); // the store's round trip
    }, "test-flusher");
    buffer.add(1);
    Eventually.holds("the first chunk in flight", DEADLINE, () -> recorder.flushes.size() == 1);
    buffer.add(2); // returns at once: the next chunk fills while the first is in flight
    buffer.add(3);
    assertEquals(3, buffer.pending());
    // The next chunk is full: a fourth row waits for the chunk in flight (back-pressure).
    Thread adder = new Thread(() -> {
      try {
        buffer.add(4);
      } catch (Exception e) {
        throw new IllegalStateException(e);
      }
    });
    adder.start();
    Eventually.holds("add waiting on a full buffer", DEADLINE, () -> adder.getState() == Thread.State.WAITING);
    assertEquals(List.of(List.of(1)), recorder.flushes);
    release.countDown();
    adder.join(DEADLINE.toMillis());
    buffer.close();
    assertEquals(List.of(List.of(1), List.of(2, 3), List.of(4)), recorder.flushes);
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
  void aFailedShipWakesATaskWaitingOnAFullBuffer() throws Exception {
    IllegalStateException boom = new IllegalStateException("boom");
    CountDownLatch release = new CountDownLatch(1);
    ChangeBuffer<Integer> buffer = new ChangeBuffer<>(1, 0, rows -> {
      release.await();
      throw boom;
    }, "test-flusher");
    buffer.add(1); // in flight, held by the latch
    buffer.add(2); // the next chunk, full (it waits for the shipper to take the first)
    AtomicReference<Throwable> thrown = new AtomicReference<>();
    Thread adder = new Thread(() -> {
      try {
        buffer.add(3);
      } catch (Throwable t) {
        thrown.set(t);
      }
    });
    adder.start();
    Eventually.holds("add waiting on a full buffer", DEADLINE, () -> adder.getState() == Thread.State.WAITING);
    release.countDown();
    adder.join(DEADLINE.toMillis());
    assertSame(boom, thrown.get());
    assertSame(boom, assertThrows(IllegalStateException.class, buffer::close));
  }
}
