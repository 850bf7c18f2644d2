package dev.tideline.writers;

import java.util.Arrays;
import java.util.Locale;
import java.util.Map;
import java.util.StringJoiner;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ThreadLocalRandom;

/**
 * How long the steps of the real-time writers take in this JVM, for the driver log: how long a row
 * waited in its buffer before its chunk left, how long a chunk took to ship, and each Elasticsearch
 * request (`_mget`, `_bulk`, `_refresh`). Where a change's time goes between Kafka and the store is
 * otherwise invisible (docs/apply.md, "Writer times"). A local driver's Python side reads and resets
 * it every minute ({@link #drain}); on a cluster the executors keep their own, unread.
 *
 * <p>Each step keeps at most {@link #KEPT} samples per interval (a uniform sample of them beyond that),
 * so recording costs a lock and an array store, and memory stays bounded under any load.
 */
public final class WriterTimes {

  static final int KEPT = 20_000;

  private static final Map<String, Samples> STEPS = new ConcurrentHashMap<>();

  private WriterTimes() {}

  /** Records that {@code step} took {@code nanos}. */
  public static void record(String step, long nanos) {
    STEPS.computeIfAbsent(step, name -> new Samples()).add(nanos);
  }

  /**
   * One line, every step recorded since the last call, in name order: {@code step n=… p50=…ms p99=…ms
   * max=…ms}; empty when nothing was recorded. Resets every step.
   */
  public static String drain() {
    StringJoiner line = new StringJoiner("; ");
    new TreeMap<>(STEPS).forEach((step, samples) -> {
      String summary = samples.drain();
      if (!summary.isEmpty()) line.add(step + " " + summary);
    });
    return line.toString();
  }

  /** One step's samples of the current interval. */
  static final class Samples {
    private long[] kept = new long[64];
    private int size;
    private long seen;
    private long max;

    synchronized void add(long nanos) {
      seen++;
      max = Math.max(max, nanos);
      if (size < KEPT) {
        if (size == kept.length) kept = Arrays.copyOf(kept, Math.min(KEPT, 2 * size));
        kept[size++] = nanos;
      } else {
        long slot = ThreadLocalRandom.current().nextLong(seen); // reservoir sampling: each sample equally likely
        if (slot < KEPT) kept[(int) slot] = nanos;
      }
    }

    synchronized String drain() {
      if (seen == 0) return "";
      long[] sorted = Arrays.copyOf(kept, size);
      Arrays.sort(sorted);
      String summary = String.format(Locale.ROOT, "n=%d p50=%.1fms p99=%.1fms max=%.1fms", seen, ms(at(sorted, 0.50)),
          ms(at(sorted, 0.99)), ms(max));
      size = 0;
      seen = 0;
      max = 0;
      return summary;
    }

    private static long at(long[] sorted, double quantile) {
      return sorted[Math.min(sorted.length - 1, (int) Math.floor(quantile * sorted.length))];
    }

    private static double ms(long nanos) {
      return nanos / 1e6;
    }
  }
}
