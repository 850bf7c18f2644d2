package dev.tideline.writers;

import java.util.HashMap;
import java.util.Map;
import java.util.function.BinaryOperator;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Side work of every writer in the JVM, done by one daemon thread at most every {@code intervalMs}:
 * writers mark keys (with a value, merged with what is marked already) and go on; the thread takes
 * everything marked in one go, hands it to the action, then sleeps the interval, so what is marked
 * meanwhile goes together next time. While nothing is marked it waits on a condition: no CPU when idle.
 * A failed action is logged and its batch marked again for later; it never fails a writer.
 *
 * @param <K> what is marked (an index to refresh, a partition's position)
 * @param <V> its value; {@code merge} combines an older and a newer one
 */
final class Coalescer<K, V> {

  /** Does the side work for one batch of marks. */
  @FunctionalInterface
  interface Action<K, V> {
    void run(Map<K, V> batch) throws Exception;
  }

  private static final Logger LOG = LoggerFactory.getLogger(Coalescer.class);
  private static final long MAX_RETRY_MS = 30_000;

  private final Action<K, V> action;
  private final BinaryOperator<V> merge;
  private final ReentrantLock lock = new ReentrantLock();
  private final Condition marked = lock.newCondition();
  private final Map<K, V> dirty = new HashMap<>();
  private final Thread thread;
  private volatile long intervalMs;
  private volatile boolean stopped;

  Coalescer(Action<K, V> action, BinaryOperator<V> merge, long intervalMs, String threadName) {
    this.action = action;
    this.merge = merge;
    this.intervalMs = intervalMs;
    this.thread = new Thread(this::run, threadName);
    thread.setDaemon(true);
    thread.start();
  }

  /** Marks every entry for the next batch; never waits for it. */
  void mark(Map<K, V> entries) {
    if (entries.isEmpty()) return;
    lock.lock();
    try {
      entries.forEach((key, value) -> dirty.merge(key, value, merge));
      marked.signal();
    } finally {
      lock.unlock();
    }
  }

  long intervalMs() {
    return intervalMs;
  }

  /** A writer asking for a shorter interval than the current one shortens it. */
  void shortenTo(long ms) {
    if (ms < intervalMs) intervalMs = ms;
  }

  /** Stops the thread (tests; the JVM's coalescers live as long as the executor). */
  void stop() throws InterruptedException {
    stopped = true;
    thread.interrupt();
    thread.join(5_000);
  }

  private void run() {
    long retryMs = intervalMs;
    try {
      while (!stopped) {
        Map<K, V> batch = next();
        try {
          action.run(batch);
          retryMs = intervalMs;
          Thread.sleep(intervalMs); // what is marked meanwhile waits for the next batch
        } catch (InterruptedException e) {
          throw e;
        } catch (Exception e) {
          retryMs = Math.min(MAX_RETRY_MS, Math.max(2 * retryMs, 100));
          LOG.warn("{} of {} failed ({}); trying again in {} ms", thread.getName(), batch.keySet(), e, retryMs);
          mark(batch); // merged with what was marked since: a newer value wins as it would have
          Thread.sleep(retryMs);
        }
      }
    } catch (InterruptedException e) {
      // stopped
    }
  }

  /** Waits until something is marked; takes it all. */
  private Map<K, V> next() throws InterruptedException {
    lock.lockInterruptibly();
    try {
      while (dirty.isEmpty()) marked.await();
      Map<K, V> batch = new HashMap<>(dirty);
      dirty.clear();
      return batch;
    } finally {
      lock.unlock();
    }
  }
}
