package dev.tideline.writers;

import java.util.Collection;
import java.util.Collections;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Makes what the search writers wrote searchable, for every writer of one Elasticsearch in the JVM: a
 * writer marks the indices a chunk wrote and goes on; one thread ({@link Coalescer}) refreshes everything
 * marked in one request at most every {@code intervalMs} (a refresh per bulk request would cost
 * Elasticsearch more than the writes, under load). A failed refresh is tried again later; it never
 * fails a writer (the node refreshes on its own interval anyway).
 */
public final class Refresher {

  /** Refreshes these indices (ignoring missing ones); {@code Elastic.refresh} in production. */
  @FunctionalInterface
  interface Target {
    void refresh(Set<String> indices) throws Exception;
  }

  private static final ConcurrentHashMap<String, Refresher> REFRESHERS = new ConcurrentHashMap<>();

  // index → System.nanoTime() of its oldest mark not yet refreshed
  private final Coalescer<String, Long> marks;

  Refresher(Target target, long intervalMs, String threadName) {
    this.marks = new Coalescer<>(batch -> {
      target.refresh(new TreeSet<>(batch.keySet()));
      // How long the oldest write of the batch waited to become searchable after its bulk request.
      WriterTimes.record("elasticsearch written to searchable", System.nanoTime() - Collections.min(batch.values()));
    }, Math::min, intervalMs, threadName);
  }

  /** The JVM's refresher of {@code url}; writers asking for a shorter interval than its own shorten it. */
  public static Refresher of(String url, ElasticHttp http, long intervalMs) {
    Refresher refresher = REFRESHERS.computeIfAbsent(url,
        key -> new Refresher(indices -> Elastic.refresh(http, indices, true), intervalMs, "tideline-search-refresher"));
    refresher.marks.shortenTo(intervalMs);
    return refresher;
  }

  /** Marks the indices for the next refresh; never waits for it. */
  public void mark(Collection<String> indices) {
    Map<String, Long> entries = new java.util.HashMap<>();
    long now = System.nanoTime();
    indices.forEach(index -> entries.put(index, now));
    marks.mark(entries);
  }

  /** Stops the thread (tests). */
  void stop() throws InterruptedException {
    marks.stop();
  }
}
