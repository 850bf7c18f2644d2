package dev.tideline.writers;

import java.util.Collection;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Makes what the search writers wrote searchable, for every writer of one Elasticsearch in the JVM. A
 * writer marks the indices a chunk wrote and goes on; one daemon thread refreshes everything marked in
 * one request, then sleeps {@code intervalMs}, so the chunks written meanwhile share the next refresh
 * (a refresh per bulk request would cost Elasticsearch more than the writes, under load). While nothing
 * is marked it waits on a condition: no CPU when idle. A failed refresh is logged and tried again later;
 * it never fails a writer (the node refreshes on its own interval anyway).
 */
public final class Refresher {

  /** Refreshes these indices (ignoring missing ones); {@code Elastic.refresh} in production. */
  @FunctionalInterface
  interface Target {
    void refresh(Set<String> indices) throws Exception;
  }

  private static final Logger LOG = LoggerFactory.getLogger(Refresher.class);
  private static final long MAX_RETRY_MS = 30_000;
  private static final ConcurrentHashMap<String, Refresher> REFRESHERS = new ConcurrentHashMap<>();

  private final Target target;
  private final ReentrantLock lock = new ReentrantLock();
  private final Condition marked = lock.newCondition();
  private final Set<String> dirty = new TreeSet<>();
  private final Thread thread;
  private volatile long intervalMs;
  private volatile boolean stopped;

  Refresher(Target target, long intervalMs, String threadName) {
    this.target = target;
    this.intervalMs = intervalMs;
    this.thread = new Thread(this::run, threadName);
    thread.setDaemon(true);
    thread.start();
  }

  /** The JVM's refresher of {@code url}; writers asking for a shorter interval than its own shorten it. */
  public static Refresher of(String url, ElasticHttp http, long intervalMs) {
    Refresher refresher = REFRESHERS.computeIfAbsent(url,
        key -> new Refresher(indices -> Elastic.refresh(http, indices, true), intervalMs, "tideline-search-refresher"));
    if (intervalMs < refresher.intervalMs) refresher.intervalMs = intervalMs;
    return refresher;
  }

  /** Marks the indices for the next refresh; never waits for it. */
  public void mark(Collection<String> indices) {
    if (indices.isEmpty()) return;
    lock.lock();
    try {
      dirty.addAll(indices);
      marked.signal();
    } finally {
      lock.unlock();
    }
  }

  /** Stops the thread (tests; the JVM's refreshers live as long as the executor). */
  void stop() throws InterruptedException {
    stopped = true;
    thread.interrupt();
    thread.join(5_000);
  }

  private void run() {
    long retryMs = intervalMs;
    try {
      while (!stopped) {
        Set<String> batch = next();
        try {
          target.refresh(batch);
          retryMs = intervalMs;
          Thread.sleep(intervalMs); // the chunks written meanwhile wait for the next refresh together
        } catch (InterruptedException e) {
          throw e;
        } catch (Exception e) {
          retryMs = Math.min(MAX_RETRY_MS, Math.max(2 * retryMs, 100));
          LOG.warn("refresh of {} failed ({}); trying again in {} ms", batch, e, retryMs);
          mark(batch);
          Thread.sleep(retryMs);
        }
      }
    } catch (InterruptedException e) {
      // stopped
    }
  }

  /** Waits until something is marked; takes it all. */
  private Set<String> next() throws InterruptedException {
    lock.lockInterruptibly();
    try {
      while (dirty.isEmpty()) marked.await();
      Set<String> batch = new TreeSet<>(dirty);
      dirty.clear();
      return batch;
    } finally {
      lock.unlock();
    }
  }
}
