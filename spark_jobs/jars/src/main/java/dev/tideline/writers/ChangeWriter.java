package dev.tideline.writers;

import java.util.List;
import java.util.Objects;
import java.util.function.Consumer;
import org.apache.spark.TaskContext;
import org.apache.spark.sql.ForeachWriter;
import org.apache.spark.sql.Row;

/**
 * The life cycle the sinks' Real-Time Mode writers share: Spark calls {@link #process} as each Kafka
 * record arrives, and {@link #open}/{@link #close} around each epoch of a long-running task. Python built
 * every row with Spark SQL (writer_rows); a writer only ships them, by the row's {@code kind}:
 * <ul>
 *   <li>{@code "row"}: a change, buffered ({@link ChangeBuffer}) and shipped a chunk at a time
 *       ({@link #shipChunk}); a row the store refuses becomes a dead letter with its reason.
 *   <li>{@code "truncate"}: after every row before it, applied to the store ({@link #truncate}).
 *   <li>{@code "letter"}: a dead letter already built, produced as it is.
 *   <li>{@code "pass"}: a Kafka tombstone (a delete's companion): nothing to apply.
 * </ul>
 * An epoch is committed only once every row is shipped and every letter acknowledged; any failure fails
 * the task and the epoch is replayed (the stores' version guards make a replay a no-op). The Kafka
 * positions of every record are published for `tide status` ({@link AppliedPositions}) once the rows
 * before them are shipped, those with nothing to ship too: otherwise a partition whose last record is a
 * tombstone, a letter or a truncate would look behind until the epoch's end (minutes). A subclass
 * keeps what is its own: its store, how a row becomes a change, how a truncate and a chunk are applied.
 *
 * @param <C> one buffered change
 */
public abstract class ChangeWriter<C> extends ForeachWriter<Row> {

  private static final long serialVersionUID = 1L;
  // Spark's StreamExecution.QUERY_ID_KEY: the query's id (kept in its checkpoint), set on its tasks.
  private static final String QUERY_ID_PROPERTY = "sql.streaming.queryId";

  private final String threadPrefix;
  private final String kafkaBootstrap;
  private final String deadLetterTopic;
  final String stage;
  final int maxRows;
  private final int lingerMs;

  // Per executor copy, per epoch: the epoch's letters (and anything else it produces) and its buffer.
  private transient DeadLetters letters;
  private transient ChangeBuffer<Buffered<C>> buffer;

  /** One record in the buffer: a change to ship, or none (a record with nothing to ship) and its origin. */
  record Buffered<C>(C change, Origin origin) {}

  /** {@code threadPrefix} names each task's flusher thread, followed by its partition id. */
  ChangeWriter(String threadPrefix, String kafkaBootstrap, String deadLetterTopic, String stage, int maxRows,
               int lingerMs) {
    if (maxRows < 1) throw new IllegalArgumentException("maxRows must be at least 1, not " + maxRows);
    this.threadPrefix = threadPrefix;
    this.kafkaBootstrap = kafkaBootstrap;
    this.deadLetterTopic = deadLetterTopic;
    this.stage = stage;
    this.maxRows = maxRows;
    this.lingerMs = lingerMs;
  }

  /** Creates the store (and its back-off) unless this executor copy has one: it lives as long as the task. */
  abstract void openStore();

  /** A row of kind "row": the change to buffer. */
  abstract C change(Row row);

  /**
   * Reads a row of kind "truncate" now, and returns what applies it to the store once every row before
   * it is shipped; {@code letters} are the epoch's, for what it produces.
   */
  abstract ChangeBuffer.Action truncate(Row row, DeadLetters letters);

  /** Applies one chunk of changes, in order, and sends a dead letter for each the store refused. */
  abstract void shipChunk(List<C> chunk, DeadLetters letters) throws Exception;

  /** The Kafka record a change came from. */
  abstract Origin originOf(C change);

  @Override
  public boolean open(long partitionId, long epochId) {
    if (buffer != null) buffer.abort(); // an epoch that was never closed: its rows are replayed
    openStore();
    letters = DeadLetters.kafka(kafkaBootstrap, deadLetterTopic, stage);
    DeadLetters epochLetters = letters; // the shipper ships this epoch's chunks with this epoch's letters
    String group = appliedGroup();
    AppliedPositions positions = group == null ? null : AppliedPositions.of(kafkaBootstrap);
    buffer = new ChangeBuffer<>(maxRows, lingerMs, chunk -> shipThenPublish(chunk,
        changes -> shipChunk(changes, epochLetters),
        origins -> { if (positions != null) positions.applied(group, origins); }), threadPrefix + partitionId, stage);
    return true;
  }

  /** Ships a chunk's changes (if it has any), then publishes the origin of every record in it. */
  static <C> void shipThenPublish(List<Buffered<C>> chunk, ChangeBuffer.Shipper<C> ship,
                                  Consumer<List<Origin>> publish) throws Exception {
    List<C> changes = chunk.stream().map(Buffered::change).filter(Objects::nonNull).toList();
    if (!changes.isEmpty()) ship.ship(changes);
    publish.accept(chunk.stream().map(Buffered::origin).toList());
  }

  /** The consumer group this query's positions go to; null outside a streaming query (unit tests). */
  private static String appliedGroup() {
    TaskContext task = TaskContext.get();
    String queryId = task == null ? null : task.getLocalProperty(QUERY_ID_PROPERTY);
    return queryId == null ? null : AppliedPositions.GROUP_PREFIX + queryId;
  }

  @Override
  public void process(Row row) {
    try {
      String kind = row.getAs("kind");
      switch (kind) {
        case "row" -> {
          C change = change(row);
          buffer.add(new Buffered<>(change, originOf(change)));
        }
        case "truncate" -> {
          buffer.flushThen(truncate(row, letters));
          passed(row);
        }
        case "letter" -> {
          buffer.check();
          letters.forward(row.getAs("letter"));
          passed(row);
        }
        case "pass" -> passed(row);
        default -> throw new IllegalArgumentException("a writer row of unknown kind " + kind);
      }
    } catch (Exception e) {
      throw sneaky(e);
    }
  }

  /** A record with nothing (more) to ship: its position counts once the rows before it are shipped. */
  private void passed(Row row) throws Exception {
    buffer.add(new Buffered<>(null, origin(row)));
  }

  @Override
  public void close(Throwable error) {
    ChangeBuffer<Buffered<C>> closing = buffer;
    buffer = null;
    if (closing == null) return;
    if (error != null) {
      closing.abort(); // the epoch is replayed: what is buffered will come again
      return;
    }
    try {
      closing.close(); // every row applied (or its letter sent) ...
      letters.awaitSent(); // ... and everything produced acknowledged, before Spark commits the epoch
    } catch (Exception e) {
      closing.abort();
      throw sneaky(e);
    }
  }

  /** The Kafka record a writer row came from (its {@code origin} column). */
  static Origin origin(Row row) {
    Row origin = row.getStruct(row.fieldIndex("origin"));
    return new Origin(origin.getAs("topic"), origin.<Integer>getAs("partition"), origin.<Long>getAs("offset"));
  }

  /** Throws a checked exception unchanged (Spark's process/close declare none), e.g. an InterruptedException. */
  @SuppressWarnings("unchecked")
  private static <E extends Throwable> E sneaky(Throwable error) throws E {
    throw (E) error;
  }
}
