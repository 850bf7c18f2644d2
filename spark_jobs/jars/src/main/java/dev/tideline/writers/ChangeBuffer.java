package dev.tideline.writers;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;

/**
 * Groups one task's changes into few store calls, shipped by a thread of this buffer while the task goes
 * on reading: a chunk goes out when {@code maxRows} rows are waiting, when the oldest has waited
 * {@code lingerMs}, or when the task asks for everything ({@link #flush}, {@link #close}). In Real-Time
 * Mode Spark calls the writer only when a record arrives, so the shipper sleeps on a condition (no CPU
 * while idle) until the oldest row's time is up.
 *
 * <p>One chunk is in flight at a time and chunks leave in arrival order, so the partition's order is
 * kept. While a chunk is in flight the next one fills: under load chunks grow to {@code maxRows} and
 * the store's round trip is paid once per chunk instead of once per few rows. When the next chunk is
 * full too, {@link #add} waits (back-pressure), which also holds the task while the store is away and
 * the shipper retries. A ship that fails is kept and thrown again by every later call, so the task
 * fails and the epoch is replayed.
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

  // How long close waits for the shipper thread to end; it is a daemon, so a stuck one never holds the JVM.
  private static final long JOIN_MS = 10_000;

  private final String timedAs;
  private final int maxRows;
  private final long lingerNanos;
  private final Shipper<T> shipper;
  private final ReentrantLock lock = new ReentrantLock();
  private final Condition changed = lock.newCondition(); // rows added or taken, a ship done, a failure
  private final Thread shipping;
  private List<T> pending = new ArrayList<>();
  private int inFlight; // rows of the chunk being shipped now
  private long oldestAt; // System.nanoTime() when the oldest pending row arrived
  private boolean draining; // the task waits for everything: ship without lingering
  private volatile boolean stopping;
  private volatile Throwable failure;

  public ChangeBuffer(int maxRows, long lingerMs, Shipper<T> shipper, String threadName) {
    this(maxRows, lingerMs, shipper, threadName, null);
  }

  /** {@code timedAs}: the name {@link WriterTimes} records this buffer's waits and ships under (null: none). */
  public ChangeBuffer(int maxRows, long lingerMs, Shipper<T> shipper, String threadName, String timedAs) {
    if (maxRows < 1) throw new IllegalArgumentException("maxRows must be at least 1, not " + maxRows);
    this.timedAs = timedAs;
    this.maxRows = maxRows;
    this.lingerNanos = TimeUnit.MILLISECONDS.toNanos(Math.max(0, lingerMs));
    this.shipper = shipper;
    // Created by the task's thread, so it inherits the task's context class loader (Spark's jars).
    this.shipping = new Thread(this::runShipper, threadName);
    shipping.setDaemon(true);
    shipping.start();
  }

  /** Buffers one row; waits while a full chunk is already waiting behind the one in flight. */
  public void add(T row) throws Exception {
    lock.lockInterruptibly();
    try {
      check();
      while (pending.size() >= maxRows) {
        changed.await();
        check();
      }
      pending.add(row);
      if (pending.size() == 1) oldestAt = System.nanoTime();
      if (pending.size() == 1 || pending.size() >= maxRows) changed.signalAll(); // the shipper's wait changes
    } finally {
      lock.unlock();
    }
  }

  /** Returns once everything buffered now is shipped. */
  public void flush() throws Exception {
    flushThen(null);
  }

  /** Ships everything buffered, then runs {@code action} under the buffer's lock (nothing overtakes it). */
  public void flushThen(Action action) throws Exception {
    lock.lockInterruptibly();
    try {
      awaitShipped();
      if (action != null) action.run();
    } finally {
      lock.unlock();
    }
  }

  /** Throws what a ship failed with, if one did. */
  public void check() throws Exception {
    Throwable failed = failure;
    if (failed == null) return;
    if (failed instanceof Exception e) throw e;
    throw (Error) failed;
  }

  /** The epoch ends well: ships every buffered row, then stops the shipper. */
  public void close() throws Exception {
    lock.lockInterruptibly();
    try {
      awaitShipped();
    } finally {
      stopping = true;
      changed.signalAll();
      lock.unlock();
    }
    join();
  }

  /** The epoch failed and will be replayed: drops the buffer and stops the shipper, mid-retry if need be. */
  public void abort() {
    stopping = true;
    shipping.interrupt(); // ends a back-off sleep or a wait
    join();
    lock.lock(); // the shipper never holds the lock while it ships
    try {
      pending = new ArrayList<>();
    } finally {
      lock.unlock();
    }
  }

  /** Rows buffered or in flight, not yet shipped (for tests and logs). */
  public int pending() {
    lock.lock();
    try {
      return pending.size() + inFlight;
    } finally {
      lock.unlock();
    }
  }

  /** Under the lock: waits until nothing is pending or in flight, or throws the shipper's failure. */
  private void awaitShipped() throws Exception {
    check();
    draining = true;
    changed.signalAll();
    try {
      while (!pending.isEmpty() || inFlight > 0) {
        changed.await();
        check();
      }
    } finally {
      draining = false;
    }
  }

  private void runShipper() {
    lock.lock();
    try {
      while (!stopping) {
        if (pending.isEmpty()) {
          changed.await();
          continue;
        }
        long wait = oldestAt + lingerNanos - System.nanoTime();
        if (wait > 0 && pending.size() < maxRows && !draining) {
          changed.awaitNanos(wait);
          continue;
        }
        shipNext();
      }
    } catch (InterruptedException e) {
      if (!stopping) failure = e; // nobody else interrupts it: rows would stay stuck, so fail the task
    } catch (Throwable t) {
      failure = t;
    } finally {
      changed.signalAll(); // a task waiting in add or flush sees the failure or the end
      lock.unlock();
    }
  }

  /** Under the lock: takes the pending rows as the next chunk and ships them with the lock released. */
  private void shipNext() throws Exception {
    List<T> chunk = pending;
    pending = new ArrayList<>();
    inFlight = chunk.size();
    long start = System.nanoTime();
    if (timedAs != null) WriterTimes.record(timedAs + " wait", start - oldestAt); // the chunk's oldest row
    changed.signalAll(); // a task waiting on a full buffer goes on filling the next chunk
    lock.unlock();
    try {
      shipper.ship(chunk);
      if (timedAs != null) WriterTimes.record(timedAs + " ship", System.nanoTime() - start);
    } finally {
      lock.lock();
      inFlight = 0;
      changed.signalAll();
    }
  }

  private void join() {
    if (Thread.currentThread() == shipping) return;
    try {
      shipping.join(JOIN_MS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt(); // the task is being killed: leave the daemon to end on its own
    }
  }
}
