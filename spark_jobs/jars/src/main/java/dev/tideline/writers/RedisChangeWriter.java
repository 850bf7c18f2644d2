package dev.tideline.writers;

import java.util.List;
import java.util.Map;
import org.apache.spark.sql.ForeachWriter;
import org.apache.spark.sql.Row;

/**
 * The cache sink's writer in Real-Time Mode: Spark calls {@link #process} as each Kafka record arrives,
 * and {@link #open}/{@link #close} around each epoch of a long-running task. Python built every row
 * with Spark SQL (spark_jobs/sinks/redis/_commands.py, writer_rows); this class only ships them:
 * <ul>
 *   <li>{@code kind = "row"}: buffered ({@link ChangeBuffer}) and applied many per EVALSHA of APPLY_BATCH;
 *       a row Redis refuses becomes a dead letter with its reason.
 *   <li>{@code kind = "truncate"}: after every row before it, raise the watermark and prune (RedisStore).
 *   <li>{@code kind = "letter"}: a dead letter already built, produced as it is.
 * </ul>
 * A Redis that is away is waited for ({@link Backoff}); any other failure fails the task, and the epoch
 * is replayed (the scripts' version guards make a replay a no-op). Built from Python through py4j, so
 * the constructor takes Strings and ints only.
 */
public class RedisChangeWriter extends ForeachWriter<Row> {

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
  private final String kafkaBootstrap;
  private final String deadLetterTopic;
  private final String stage;
  private final int maxRows;
  private final int lingerMs;

  // Per executor copy: the store (its pool is shared per JVM) lives as long as the task; the rest per epoch.
  private transient RedisStore store;
  private transient Backoff backoff;
  private transient DeadLetters letters;
  private transient ChangeBuffer<Change> buffer;

  public RedisChangeWriter(String redisUrl, String applyScript, String raiseWatermarkScript, String pruneScript,
                           String rowMajorField, String rowMinorField, String kafkaBootstrap,
                           String deadLetterTopic, String stage, int maxRows, int lingerMs) {
    if (maxRows < 1) throw new IllegalArgumentException("maxRows must be at least 1, not " + maxRows);
    this.redisUrl = redisUrl;
    this.applyScript = applyScript;
    this.raiseWatermarkScript = raiseWatermarkScript;
    this.pruneScript = pruneScript;
    this.rowMajorField = rowMajorField;
    this.rowMinorField = rowMinorField;
    this.kafkaBootstrap = kafkaBootstrap;
    this.deadLetterTopic = deadLetterTopic;
    this.stage = stage;
    this.maxRows = maxRows;
    this.lingerMs = lingerMs;
  }

  @Override
  public boolean open(long partitionId, long epochId) {
    if (buffer != null) buffer.abort(); // an epoch that was never closed: its rows are replayed
    if (store == null) {
      store = new RedisStore(RedisStore.client(redisUrl), RedisStore.Script.of(applyScript),
          RedisStore.Script.of(raiseWatermarkScript), RedisStore.Script.of(pruneScript), rowMajorField,
          rowMinorField);
      backoff = Backoff.standard(RedisStore::isAway);
    }
    letters = DeadLetters.kafka(kafkaBootstrap, deadLetterTopic, stage);
    Applier applier = rows -> backoff.call(stage + ": apply " + rows.size() + " rows", () -> store.apply(rows, maxRows));
    DeadLetters epochLetters = letters;
    buffer = new ChangeBuffer<>(maxRows, lingerMs, rows -> ship(rows, applier, epochLetters),
        "tideline-redis-writer-" + partitionId);
    return true;
  }

  @Override
  public void process(Row row) {
    try {
      String kind = row.getAs("kind");
      switch (kind) {
        case "row" -> buffer.add(new Change(arguments(row), origin(row)));
        case "truncate" -> {
          RedisStore.Truncate truncate = truncate(row);
          buffer.flushThen(() -> backoff.run(stage + ": truncate " + truncate.table(), () -> store.truncate(truncate)));
        }
        case "letter" -> {
          buffer.check();
          letters.forward(row.getAs("letter"));
        }
        default -> throw new IllegalArgumentException("a writer row of unknown kind " + kind);
      }
    } catch (Exception e) {
      throw sneaky(e);
    }
  }

  @Override
  public void close(Throwable error) {
    ChangeBuffer<Change> closing = buffer;
    buffer = null;
    if (closing == null) return;
    if (error != null) {
      closing.abort(); // the epoch is replayed: what is buffered will come again
      return;
    }
    try {
      closing.close(); // every row applied (or its letter sent) ...
      letters.awaitSent(); // ... and every letter acknowledged, before Spark commits the epoch
    } catch (Exception e) {
      closing.abort();
      throw sneaky(e);
    }
  }

  /** Applies the rows, then sends a dead letter for each row Redis refused, naming its origin. */
  static void ship(List<Change> rows, Applier applier, DeadLetters letters) throws Exception {
    Map<Integer, String> refused = applier.apply(rows.stream().map(Change::args).toList());
    for (Map.Entry<Integer, String> entry : refused.entrySet()) {
      letters.refused(rows.get(entry.getKey()).origin(), entry.getValue());
    }
  }

  private static byte[][] arguments(Row row) {
    List<byte[]> args = row.getList(row.fieldIndex("args"));
    return args.toArray(new byte[0][]);
  }

  private static Origin origin(Row row) {
    Row origin = row.getStruct(row.fieldIndex("origin"));
    return new Origin(origin.getAs("topic"), origin.<Integer>getAs("partition"), origin.<Long>getAs("offset"));
  }

  private static RedisStore.Truncate truncate(Row row) {
    return new RedisStore.Truncate(row.getAs("table"), row.getAs("watermark"), row.<Long>getAs("major"),
        row.<Long>getAs("minor"), row.getAs("row_pattern"), row.getAs("row_prefix"), row.getAs("tombstone_pattern"));
  }

  /** Throws a checked exception unchanged (Spark's process/close declare none), e.g. an InterruptedException. */
  @SuppressWarnings("unchecked")
  private static <E extends Throwable> E sneaky(Throwable error) throws E {
    throw (E) error;
  }
}
