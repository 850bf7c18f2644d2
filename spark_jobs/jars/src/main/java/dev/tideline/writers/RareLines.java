package dev.tideline.writers;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import dev.tideline.writers.BulkLines.Line;
import java.io.IOException;
import java.util.List;
import java.util.Map;
import java.util.function.LongSupplier;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The changes decided per row (the Python shipper's {@code _rare_lines}), which need a document's whole
 * {@code _source}, not only its version: a moved delete keeps the row's image in its tombstone; an
 * upsert that keeps stored columns of a json column, or creates a moved row's new key, copies those
 * columns into its document and writes it whole. Each write carries the compare-and-set token of the
 * round's read, so anything written since makes it a conflict, decided again.
 *
 * <p>The create of a moved row's new key takes the kept columns from the old key as of just before the
 * move. The move's delete of the old key has the same version and comes on another Kafka partition, so
 * it may not be applied yet: the create waits for it (polling) up to {@code moveWaitMs}.
 */
final class RareLines {

  private static final Logger LOG = LoggerFactory.getLogger(RareLines.class);
  private static final long POLL_MS = 20;

  private final Elastic es;
  private final long moveWaitMs;
  private final Backoff.Sleeper sleeper;
  private final LongSupplier clockMs;

  RareLines(Elastic es, long moveWaitMs, Backoff.Sleeper sleeper, LongSupplier clockMs) {
    this.es = es;
    this.moveWaitMs = moveWaitMs;
    this.sleeper = sleeper;
    this.clockMs = clockMs;
  }

  /** What became of a rare change: lines written, or not yet. */
  enum Outcome { LINES, LATER }

  /**
   * Adds the lines of one rare change to {@code out}, given its document (with its whole
   * {@code _source}) and tombstone as the round read them. LATER: the create of a moved row
   * whose old key is not settled yet, in a round with other rows ({@code mayWait} false): those go
   * first, so a task never waits on another while holding writes that task may be waiting for.
   * {@code deadlines}: per row, when a key move's wait ends, kept across the chunk's rounds.
   */
  Outcome lines(int owner, SearchChange c, Stored doc, Stored tomb, Map<Integer, Long> deadlines, boolean mayWait,
                List<Line> out) throws IOException, InterruptedException {
    Stored current = doc; // read whole by the round's _mget (BulkLines.mayBeRare)
    if (!c.upsert()) { // a delete whose row moved to another key: its image goes with the tombstone
      String image = current.found() ? withImage(c.tombDoc(), current.source()) : c.tombDoc();
      String action = tomb.found() ? "{\"index\":{" + c.tombHead() + tomb.cas() : "{\"create\":{" + c.tombHead();
      out.add(new Line(action + "}}\n" + image + "\n", owner, false));
      if (current.found()) out.add(new Line("{\"delete\":{" + c.head() + current.cas() + "}}\n", owner, true));
      return Outcome.LINES;
    }
    JsonNode source = current.found() ? current.source() : oldKeyRow(owner, c, deadlines, mayWait);
    if (source == null) return Outcome.LATER;
    ObjectNode document = (ObjectNode) Elastic.JSON.readTree(c.doc());
    for (String column : c.unavailable()) {
      JsonNode value = source.get(column);
      if (value != null) document.set(column, value);
    }
    String action = current.found() ? "{\"index\":{" + c.head() + current.cas() : "{\"create\":{" + c.head();
    out.add(new Line(action + c.aliasOnly() + "}}\n" + Elastic.JSON.writeValueAsString(document) + "\n", owner,
        false));
    return Outcome.LINES;
  }

  /**
   * The old key's row as of just before the move: the image its moved delete left in the tombstone, or
   * the old document if it is at least as new as the move; waited for until {@code moveWaitMs} has passed.
   * Null when it would have to wait and may not.
   */
  private JsonNode oldKeyRow(int owner, SearchChange c, Map<Integer, Long> deadlines, boolean mayWait)
      throws IOException, InterruptedException {
    if (c.oldHead() == null || c.oldTombHead() == null) return Elastic.JSON.createObjectNode();
    long deadline = deadlines.computeIfAbsent(owner, row -> clockMs.getAsLong() + moveWaitMs);
    while (true) {
      List<Stored> read = es.mget(List.of(Elastic.wholeEntry(c.oldHead()), Elastic.wholeEntry(c.oldTombHead())));
      Stored old = read.get(0);
      Stored tomb = read.get(1);
      if (tomb.found() && !c.version().above(tomb.version())) return tomb.image();
      if (old.found() && !c.version().above(old.version())) return old.sourceOrEmpty();
      if (!mayWait) return null;
      long left = deadline - clockMs.getAsLong();
      if (left <= 0) {
        LOG.warn("the create of {} (moved from {} at {}) waited {} ms for the old key's delete; taking the kept "
            + "columns from the old key's {}", c.rowId(), c.oldRowId(), c.version(), moveWaitMs,
            old.found() ? "document" : tomb.found() ? "tombstone" : "nothing (neither is there)");
        return old.found() ? old.sourceOrEmpty() : tomb.image();
      }
      sleeper.sleep(Math.min(POLL_MS, left));
    }
  }

  /** The tombstone's {@code _source} with {@code "image"}: the document's {@code _source} added. */
  static String withImage(String tombDoc, JsonNode source) throws IOException {
    String body = tombDoc.strip();
    body = body.substring(0, body.lastIndexOf('}')).strip();
    return body + (body.endsWith("{") ? "" : ",") + "\"image\":" + Elastic.JSON.writeValueAsString(source) + "}";
  }
}
