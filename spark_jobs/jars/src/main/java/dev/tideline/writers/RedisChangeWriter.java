package dev.tideline.writers;

import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.Row;

/**
 * The cache sink's writer in Real-Time Mode ({@link ChangeWriter}'s life cycle). Python built every row
 * with Spark SQL (spark_jobs/sinks/redis/_commands.py, writer_rows); this class only ships them:
 * <ul>
 *   <li>{@code kind = "row"}: buffered ({@link ChangeBuffer}) and applied many per EVALSHA of APPLY_BATCH;
 *       a row Redis refuses becomes a dead letter with its reason. The create of a moved row waits for
 *       the move's delete of its old key ({@link KeyMoves}).
 *   <li>{@code kind = "truncate"}: after every row before it, raise the watermark and prune (RedisStore).
 *   <li>{@code kind = "letter"}: a dead letter already built, produced as it is.
 *   <li>{@code kind = "pass"}: a Kafka tombstone, nothing to apply ({@link ChangeWriter}).
 * </ul>
 * A Redis that is away is waited for ({@link Backoff}); any other failure fails the task, and the epoch
 * is replayed (the scripts' version guards make a replay a no-op). Built from Python through py4j, so
 * the constructor takes Strings and ints only.
 */
public class RedisChangeWriter extends ChangeWriter<RedisChangeWriter.Change> {

  private static final long serialVersionUID = 1L;

  /** One buffered row: its APPLY_BATCH arguments (count first) and its Kafka record. */
  record Change(byte[][] args, Origin origin) {}

  /** Applies rows' arguments; {row index: reason} of those refused (RedisStore.apply, or a fake). */
  @FunctionalInterface
  interface Applier {
    Map<Integer, String> apply(List<byte[][]> rows) throws Exception;
  }

  private final String redisUrl;
  private final String applyScript;
  private final String raiseWatermarkScript;
  private final String pruneScript;
  private final String rowMajorField;
  private final String rowMinorField;
  private final int moveWaitMs;

  // Per executor copy: the store (its pool is shared per JVM) lives as long as the task.
  private transient RedisStore store;
  private transient Backoff backoff;
  private transient KeyMoves moves;

  public RedisChangeWriter(String redisUrl, String applyScript, String raiseWatermarkScript, String pruneScript,
                           String rowMajorField, String rowMinorField, String kafkaBootstrap,
                           String deadLetterTopic, String stage, int maxRows, int lingerMs, int moveWaitMs) {
    super("tideline-redis-writer-", kafkaBootstrap, deadLetterTopic, stage, maxRows, lingerMs);
    this.redisUrl = redisUrl;
    this.applyScript = applyScript;
    this.raiseWatermarkScript = raiseWatermarkScript;
    this.pruneScript = pruneScript;
    this.rowMajorField = rowMajorField;
    this.rowMinorField = rowMinorField;
    this.moveWaitMs = moveWaitMs;
  }

  @Override
  void openStore() {
    if (store != null) return;
    store = new RedisStore(RedisStore.client(redisUrl), RedisStore.Script.of(applyScript),
        RedisStore.Script.of(raiseWatermarkScript), RedisStore.Script.of(pruneScript), rowMajorField,
        rowMinorField);
    backoff = Backoff.standard(RedisStore::isAway);
    moves = new KeyMoves(creates -> backoff.call(stage + ": read moved rows' old keys", () -> store.settled(creates)),
        moveWaitMs, Thread::sleep, System::currentTimeMillis);
  }

  @Override
  Change change(Row row) {
    List<String> args = row.getList(row.fieldIndex("args"));
    byte[][] encoded = new byte[args.size()][];
    for (int i = 0; i < encoded.length; i++) encoded[i] = args.get(i).getBytes(StandardCharsets.UTF_8);
    return new Change(encoded, origin(row));
  }

  @Override
  ChangeBuffer.Action truncate(Row row, DeadLetters letters) {
    RedisStore.Truncate truncate = new RedisStore.Truncate(row.getAs("table"), row.getAs("watermark"),
        row.<Long>getAs("major"), row.<Long>getAs("minor"), row.getAs("row_pattern"), row.getAs("row_prefix"),
        row.getAs("tombstone_pattern"));
    return () -> backoff.run(stage + ": truncate " + truncate.table(), () -> store.truncate(truncate));
  }

  @Override
  Origin originOf(Change change) {
    return change.origin();
  }

  @Override
  void shipChunk(List<Change> chunk, DeadLetters letters) throws Exception {
    ship(chunk, rows -> moves.apply(rows, part -> backoff.call(stage + ": apply " + part.size() + " rows",
        () -> store.apply(part, maxRows))), letters);
  }

  /** Applies the rows, then sends a dead letter for each row Redis refused, naming its origin. */
  static void ship(List<Change> rows, Applier applier, DeadLetters letters) throws Exception {
    Map<Integer, String> refused = applier.apply(rows.stream().map(Change::args).toList());
    for (Map.Entry<Integer, String> entry : refused.entrySet()) {
      letters.refused(rows.get(entry.getKey()).origin(), entry.getValue());
    }
  }
}
