package dev.tideline.writers;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;

/**
 * Groups one task's changes into few store calls: rows go out when {@code maxRows} are waiting, or
 * when the oldest has waited {@code lingerMs}. In Real-Time Mode Spark calls the writer only when a
 * record arrives, so a lone row is sent by a flusher thread of this buffer, which sleeps on a condition
 * (no CPU while idle) until the oldest row's time is up.
 *
 * <p>Every flush, from the task's thread or the flusher, runs under one lock with the rows in arrival
 * order, so the partition's order is kept. A flush holds the lock while it retries (a store away):
 * the task then waits in {@link #add}, which is the back-pressure we want. A flush that fails is kept
 * and thrown again by the next call, so the task fails and the epoch is replayed.
 *
 * @param <T> one buffered change
 */
public final class ChangeBuffer<T> {

  /** Ships rows to the store, in the order given; throws if they could not all be applied. */
  @FunctionalInterface
  public interface Shipper<T> {
    void ship(List<T> rows) throws Exception;
  }

  /** Work that must run after everything buffered before it (a truncate). */
  @FunctionalInterface
  public interface Action {
    void run() throws Exception;
  }

  // How long close waits for the flusher thread to end; it is a daemon, so a stuck one never holds the JVM.
  private static final long JOIN_MS = 10_000;

  private final int maxRows;
  private final long lingerNanos;
  private final Shipper<T> shipper;
  private final ReentrantLock lock = new ReentrantLock();
  private final Condition changed = lock.newCondition();
  private final Thread flusher;
  private List<T> pending = new ArrayList<>();
  private long oldestAt; // System.nanoTime() when the oldest pending row arrived
  private volatile boolean stopping;
  private volatile Throwable failure;

  public ChangeBuffer(int maxRows, long lingerMs, Shipper<T> shipper, String threadName) {
    if (maxRows < 1) throw new IllegalArgumentException("maxRows must be at least 1, not " + maxRows);
    this.maxRows = maxRows;
    this.lingerNanos = TimeUnit.MILLISECONDS.toNanos(Math.max(0, lingerMs));
    this.shipper = shipper;
    // Created by the task's thread, so it inherits the task's context class loader (Spark's jars).
    this.flusher = new Thread(this::runFlusher, threadName);
    flusher.setDaemon(true);
    flusher.start();
  }

  /** Buffers one row; ships the buffer at once when it holds {@code maxRows}. */
  public void add(T row) throws Exception {
    lock.lockInterruptibly();
    try {
      check();
      pending.add(row);
      if (pending.size() == 1) {
        oldestAt = System.nanoTime();
        changed.signal(); // the flusher starts its linger wait
      }
      if (pending.size() >= maxRows) flushLocked();
    } finally {
      lock.unlock();
    }
  }

  /** Ships everything buffered now. */
  public void flush() throws Exception {
    flushThen(null);
  }

  /** Ships everything buffered, then runs {@code action} under the same lock (nothing overtakes it). */
  public void flushThen(Action action) throws Exception {
    lock.lockInterruptibly();
    try {
      check();
      flushLocked();
      if (action != null) action.run();
    } finally {
      lock.unlock();
    }
  }

  /** Throws what a flush (the flusher's or the task's) failed with, if one did. */
  public void check() throws Exception {
    Throwable failed = failure;
    if (failed == null) return;
    if (failed instanceof Exception e) throw e;
    throw (Error) failed;
  }

  /** The epoch ends well: ships every buffered row, then stops the flusher. */
  public void close() throws Exception {
    lock.lockInterruptibly();
    try {
      check();
      flushLocked();
    } finally {
      stopping = true;
      changed.signalAll();
      lock.unlock();
    }
    join();
  }

  /** The epoch failed and will be replayed: drops the buffer and stops the flusher, mid-retry if need be. */
  public void abort() {
    stopping = true;
    flusher.interrupt(); // ends a back-off sleep or a wait
    join();
    if (lock.tryLock()) { // a flusher still in a socket read keeps the lock; the buffer is discarded anyway
      try {
        pending = new ArrayList<>();
      } finally {
        lock.unlock();
      }
    }
  }

  /** Rows buffered and not yet shipped (for tests and logs). */
  public int pending() {
    lock.lock();
    try {
      return pending.size();
    } finally {
      lock.unlock();
    }
  }

  private void flushLocked() throws Exception {
    if (pending.isEmpty()) return;
    try {
      shipper.ship(pending);
    } catch (InterruptedException e) {
      throw e; // stopping: the rows stay buffered for close() or are dropped by abort()
    } catch (Throwable t) {
      failure = t; // the flusher stops, and every later call throws it
      throw t;
    }
    pending = new ArrayList<>();
  }

  private void runFlusher() {
    lock.lock();
    try {
      while (!stopping && failure == null) {
        if (pending.isEmpty()) {
          changed.await();
          continue;
        }
        long wait = oldestAt + lingerNanos - System.nanoTime();
        if (wait > 0) {
          changed.awaitNanos(wait);
        } else {
          flushLocked();
        }
      }
    } catch (InterruptedException e) {
      if (!stopping) failure = e; // nobody else interrupts it: rows would stay stuck, so fail the task
    } catch (Throwable t) {
      if (failure == null) failure = t;
    } finally {
      lock.unlock();
    }
  }

  private void join() {
    if (Thread.currentThread() == flusher) return;
    try {
      flusher.join(JOIN_MS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt(); // the task is being killed: leave the daemon to end on its own
    }
  }
}
