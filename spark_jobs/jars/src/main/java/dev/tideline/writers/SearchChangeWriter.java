package dev.tideline.writers;

import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.Row;

/**
 * The search sink's writer in Real-Time Mode ({@link ChangeWriter}'s life cycle). Python built every row
 * with Spark SQL (spark_jobs/sinks/elasticsearch/_documents.py, writer_rows); this class only ships them:
 * <ul>
 *   <li>{@code kind = "row"}: buffered ({@link ChangeBuffer}) and applied a chunk at a time with
 *       compare-and-set ({@link SearchStore}); a row Elasticsearch refuses becomes a dead letter.
 *   <li>{@code kind = "truncate"}: after every row before it, raise the watermark and sweep.
 *   <li>{@code kind = "letter"}: a dead letter already built, produced as it is.
 *   <li>{@code kind = "pass"}: a Kafka tombstone, nothing to apply ({@link ChangeWriter}).
 * </ul>
 * Once a row or truncate is applied, its {@code touches} (what it means for the nested views) are
 * produced to {@code touchesTopic}; a refused row has none. An Elasticsearch that is away is waited for
 * ({@link Backoff}); any other failure fails the task and the epoch is replayed (the version guards
 * make a replay a no-op, and its touches are produced again). Built from Python through py4j, so the
 * constructor takes Strings and ints only.
 */
public class SearchChangeWriter extends ChangeWriter<SearchChange> {

  private static final long serialVersionUID = 1L;

  /** Applies one chunk of rows; {row index: reason} of those refused (SearchStore.apply, or a fake). */
  @FunctionalInterface
  interface Applier {
    Map<Integer, String> apply(List<SearchChange> rows) throws Exception;
  }

  private final String esUrl;
  private final String watermarksIndex;
  private final String majorField;
  private final String minorField;
  private final String touchesTopic;
  private final int refreshMs;
  private final int moveWaitMs;

  // Per executor copy: the store (its HTTP client and refresher are shared per JVM) lives as long as the
  // task.
  private transient SearchStore store;
  private transient Backoff backoff;

  // No tombstones index: the rows' tomb_head and old_tomb_head fragments name it.
  public SearchChangeWriter(String esUrl, String watermarksIndex, String majorField,
                            String minorField, String kafkaBootstrap, String deadLetterTopic, String touchesTopic,
                            String stage, int maxRows, int lingerMs, int refreshMs, int moveWaitMs) {
    super("tideline-search-writer-", kafkaBootstrap, deadLetterTopic, stage, maxRows, lingerMs);
    this.esUrl = esUrl;
    this.watermarksIndex = watermarksIndex;
    this.majorField = majorField;
    this.minorField = minorField;
    this.touchesTopic = touchesTopic == null ? "" : touchesTopic;
    this.refreshMs = refreshMs;
    this.moveWaitMs = moveWaitMs;
  }

  @Override
  void openStore() {
    if (store != null) return;
    store = SearchStore.of(esUrl, watermarksIndex, majorField, minorField, moveWaitMs, refreshMs);
    backoff = Backoff.standard(SearchStore::isAway);
  }

  /** A row of kind "row" (the columns writer_rows selects). */
  @Override
  SearchChange change(Row row) {
    return new SearchChange(origin(row), flag(row, "moved"), row.getAs("alias"), row.getAs("target"), version(row),
        row.getAs("row_id"), row.getAs("old_row_id"), strings(row, "unavailable"), flag(row, "keeps_objects"),
        row.getAs("doc"), row.getAs("partial"), row.getAs("tomb_doc"), row.getAs("head"), row.getAs("tomb_head"),
        row.getAs("old_head"), row.getAs("old_tomb_head"), strings(row, "touches"));
  }

  /** Raises the watermark and sweeps, then produces the truncate's touches. */
  @Override
  ChangeBuffer.Action truncate(Row row, DeadLetters out) {
    String alias = row.getAs("alias");
    String target = row.getAs("target");
    Version version = version(row);
    List<String> touches = strings(row, "touches");
    return () -> {
      backoff.run(stage + ": truncate " + alias + " at " + version, () -> store.truncate(alias, target, version));
      touch(out, touchesTopic, touches);
    };
  }

  @Override
  Origin originOf(SearchChange change) {
    return change.origin();
  }

  @Override
  void shipChunk(List<SearchChange> chunk, DeadLetters out) throws Exception {
    ship(chunk, rows -> backoff.call(stage + ": apply " + rows.size() + " rows", () -> store.apply(rows)), out,
        touchesTopic);
  }

  /**
   * Applies the rows, then, in their order, sends a dead letter for each row Elasticsearch refused and
   * the touches of every other one (applied now, or already held by a newer version).
   */
  static void ship(List<SearchChange> rows, Applier applier, DeadLetters out, String touchesTopic) throws Exception {
    Map<Integer, String> refused = applier.apply(rows);
    for (int i = 0; i < rows.size(); i++) {
      String reason = refused.get(i);
      if (reason != null) out.refused(rows.get(i).origin(), reason);
      else touch(out, touchesTopic, rows.get(i).touches());
    }
  }

  /** Produces the touches (key null) unless the writer has no touches topic. */
  static void touch(DeadLetters out, String touchesTopic, List<String> touches) {
    if (touchesTopic.isEmpty()) return;
    for (String value : touches) {
      if (value != null) out.send(touchesTopic, value.getBytes(StandardCharsets.UTF_8));
    }
  }

  private static Version version(Row row) {
    Row version = row.getStruct(row.fieldIndex("version"));
    return new Version(version.<Long>getAs("major"), version.<Long>getAs("minor"));
  }

  private static boolean flag(Row row, String name) {
    int index = row.fieldIndex(name);
    return !row.isNullAt(index) && row.getBoolean(index);
  }

  private static List<String> strings(Row row, String name) {
    int index = row.fieldIndex(name);
    return row.isNullAt(index) ? List.of() : row.getList(index);
  }
}
