package dev.tideline.writers;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.function.LongSupplier;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Applies a chunk of cache rows (APPLY_BATCH arguments) so that the create of a moved row's new key,
 * when it keeps unchanged-TOAST columns, is applied after the move's delete of the old key. That delete
 * (op 'm', same version) comes on another Kafka partition, so another task, and leaves the row's image
 * in the old key's tombstone; applied before it, the create would take the columns from whatever the
 * old key holds then: a row deleted and re-inserted just before its move would give the value from
 * before the delete, or nothing (search's RareLines waits the same way).
 *
 * <p>Rows of other keys go first, so a task never waits while holding rows another task may be waiting
 * for; the waiting create and the later rows of its key keep their order. A create waits at most
 * {@code moveWaitMs}, then takes what the old key holds.
 */
final class KeyMoves {

  /** Per create: true when it need not wait (RedisStore.settled). */
  @FunctionalInterface
  interface Reader {
    boolean[] settled(List<byte[][]> creates) throws Exception;
  }

  private static final Logger LOG = LoggerFactory.getLogger(KeyMoves.class);
  private static final long POLL_MS = 20;
  // APPLY_BATCH's fixed arguments (spark_jobs/sinks/redis/_scripts.py, ROW_ARGS), count first.
  static final int ROW = 1;
  static final int TOMB = 2;
  static final int MARK = 3;
  static final int FROM_ROW = 4;
  static final int FROM_TOMB = 5;
  static final int OP = 6;
  static final int MAJOR = 7;
  static final int MINOR = 8;
  static final int KEPT_COUNT = 11;

  private final Reader reader;
  private final long moveWaitMs;
  private final Backoff.Sleeper sleeper;
  private final LongSupplier clockMs;

  KeyMoves(Reader reader, long moveWaitMs, Backoff.Sleeper sleeper, LongSupplier clockMs) {
    this.reader = reader;
    this.moveWaitMs = moveWaitMs;
    this.sleeper = sleeper;
    this.clockMs = clockMs;
  }

  /** True for the create of a moved row that keeps columns: it may have to wait for the old key. */
  static boolean keepsFromOldKey(byte[][] args) {
    return args[FROM_ROW].length > 0 && text(args[OP]).equals("u") && !text(args[KEPT_COUNT]).equals("0");
  }

  /** Applies every row, in rounds; returns {row index in {@code rows}: reason} of the rows refused. */
  Map<Integer, String> apply(List<byte[][]> rows, RedisChangeWriter.Applier applier) throws Exception {
    Map<Integer, String> refused = new TreeMap<>();
    Map<Integer, Long> deadlines = new HashMap<>(); // of the creates that waited; Long.MAX_VALUE: gave up
    List<Integer> pending = new ArrayList<>(rows.size());
    for (int i = 0; i < rows.size(); i++) pending.add(i);
    while (!pending.isEmpty()) {
      Set<Integer> waiting = waiting(rows, pending, deadlines);
      List<Integer> now = new ArrayList<>();
      List<Integer> later = new ArrayList<>();
      Set<ByteBuffer> heldKeys = new HashSet<>();
      for (int i : pending) {
        ByteBuffer key = ByteBuffer.wrap(rows.get(i)[ROW]);
        if (waiting.contains(i) || heldKeys.contains(key)) {
          heldKeys.add(key);
          later.add(i);
        } else {
          now.add(i);
        }
      }
      if (now.isEmpty()) {
        sleeper.sleep(POLL_MS);
      } else {
        List<byte[][]> batch = new ArrayList<>(now.size());
        for (int i : now) batch.add(rows.get(i));
        applier.apply(batch).forEach((index, reason) -> refused.put(now.get(index), reason));
      }
      pending = later;
    }
    return refused;
  }

  /** The pending creates whose old key is not settled yet and whose wait has not run out. */
  private Set<Integer> waiting(List<byte[][]> rows, List<Integer> pending, Map<Integer, Long> deadlines)
      throws Exception {
    List<Integer> candidates = new ArrayList<>();
    for (int i : pending) {
      if (keepsFromOldKey(rows.get(i)) && deadlines.getOrDefault(i, 0L) != Long.MAX_VALUE) candidates.add(i);
    }
    if (candidates.isEmpty()) return Set.of();
    List<byte[][]> creates = new ArrayList<>(candidates.size());
    for (int i : candidates) creates.add(rows.get(i));
    boolean[] settled = reader.settled(creates);
    Set<Integer> waiting = new HashSet<>();
    long now = clockMs.getAsLong();
    for (int c = 0; c < candidates.size(); c++) {
      if (settled[c]) continue;
      int row = candidates.get(c);
      long deadline = deadlines.computeIfAbsent(row, r -> now + moveWaitMs);
      if (now < deadline) {
        waiting.add(row);
      } else {
        deadlines.put(row, Long.MAX_VALUE);
        byte[][] args = rows.get(row);
        LOG.warn("the create of {} (moved from {}) waited {} ms for the old key's delete; taking the kept columns "
            + "from what the old key holds", text(args[ROW]), text(args[FROM_ROW]), moveWaitMs);
      }
    }
    return waiting;
  }

  private static String text(byte[] value) {
    return new String(value, StandardCharsets.UTF_8);
  }
}
