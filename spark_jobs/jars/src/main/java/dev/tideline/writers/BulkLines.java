package dev.tideline.writers;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * The version guard of the Python shipper's {@code _State}, per change, and the bulk lines that follow
 * from it, joined from the change's prebuilt fragments (a document is never parsed here). Pure: what was
 * read comes in, lines go out. The rows it cannot decide from versions alone (json-keeping updates,
 * primary-key moves) are left to {@link RareLines}.
 *
 * <p>Real-Time Mode has no newest-per-row fold, so a chunk can hold several changes of one document.
 * Two compare-and-set writes of one document in one bulk request would conflict with each other, so a
 * round sends one change per document, in arrival order ({@link #round}), and a change that a later
 * one of the chunk overwrites whole is not sent at all ({@link #unsuperseded}), as the fold would drop it.
 */
final class BulkLines {

  /** One bulk action (its action line and source line, if any), the row it is for, and whether it is a delete. */
  record Line(String text, int owner, boolean delete) {}

  /** What a change needs: nothing (already held, or older), the lines written, or a per-row decision. */
  enum Outcome { NOTHING, LINES, RARE }

  /** The pending rows of one round: those sent now, and those behind an earlier change of their document. */
  record Round(List<Integer> active, List<Integer> deferred) {}

  private BulkLines() {}

  /**
   * Decides one change ({@code owner} is its row index) against its document, its tombstone and its
   * alias's truncate watermark as read, adding its lines to {@code out}.
   */
  static Outcome decide(int owner, SearchChange c, Version mark, Stored doc, Stored tomb, List<Line> out) {
    Version guard = Version.max(tomb.version(), mark); // below this a change is stale however it looks
    Version held = Version.max(doc.version(), guard);
    boolean applies = c.version().above(held);
    boolean stale = !applies && doc.found() && guard.above(doc.version());
    if (applies && rare(c, doc.found())) return Outcome.RARE;
    String alias = c.aliasOnly();
    if (applies && c.upsert()) {
      if (!doc.found()) {
        out.add(new Line("{\"create\":{" + c.head() + alias + "}}\n" + c.doc() + "\n", owner, false));
      } else if (!c.hasKeep()) {
        out.add(new Line("{\"index\":{" + c.head() + doc.cas() + alias + "}}\n" + c.doc() + "\n", owner, false));
      } else { // keep the unavailable columns: update with the rest
        String partial = c.partial() != null ? c.partial() : c.doc();
        out.add(new Line("{\"update\":{" + c.head() + doc.cas() + alias + "}}\n{\"doc\":" + partial + "}\n", owner,
            false));
      }
      return Outcome.LINES;
    }
    if (applies) { // a delete: its tombstone guards the row against older changes, then the document goes
      String action = tomb.found() ? "{\"index\":{" + c.tombHead() + tomb.cas() : "{\"create\":{" + c.tombHead();
      out.add(new Line(action + "}}\n" + c.tombDoc() + "\n", owner, false));
      if (doc.found()) out.add(new Line("{\"delete\":{" + c.head() + doc.cas() + "}}\n", owner, true));
      return Outcome.LINES;
    }
    if (stale) { // a document older than its tombstone or the watermark: a write that lost a race
      out.add(new Line("{\"delete\":{" + c.head() + doc.cas() + "}}\n", owner, true));
      return Outcome.LINES;
    }
    return Outcome.NOTHING;
  }

  /**
   * The changes decided per row: an upsert keeping stored columns of a json column (an update would
   * merge the object) or creating a moved row's new key (its kept columns come from the old key), and
   * a delete whose row moved (its tombstone keeps the row's image for the new key).
   */
  static boolean rare(SearchChange c, boolean found) {
    if (!mayBeRare(c)) return false;
    if (!c.upsert()) return c.moved();
    return (found && c.hasKeep() && c.keepsObjects()) || (!found && c.oldRowId() != null && c.hasKeep());
  }

  /** Whether {@link #rare} can hold for the change, whatever is stored: such a change's document is read whole. */
  static boolean mayBeRare(SearchChange c) {
    if (!c.upsert()) return c.moved();
    return c.hasKeep() && (c.keepsObjects() || c.oldRowId() != null);
  }

  /**
   * The rows to apply: all but those a later change of the same document (and tombstone) with a higher
   * version overwrites whole (a whole upsert or a plain delete). A moved delete is always applied, and
   * so is every change before it, for the image its tombstone keeps.
   */
  static List<Integer> unsuperseded(List<SearchChange> rows) {
    Map<String, Version> newestWhole = new HashMap<>();
    boolean[] superseded = new boolean[rows.size()];
    for (int i = rows.size() - 1; i >= 0; i--) {
      SearchChange c = rows.get(i);
      String key = c.head() + "\n" + c.tombHead();
      Version later = newestWhole.get(key);
      if (!c.upsert() && c.moved()) { // its image is the row as the changes before it left it
        newestWhole.remove(key);
        continue;
      }
      superseded[i] = later != null && later.above(c.version());
      boolean whole = !c.upsert() || !c.hasKeep(); // a plain delete, or an upsert of every column
      if (whole && (later == null || c.version().above(later))) newestWhole.put(key, c.version());
    }
    List<Integer> kept = new ArrayList<>();
    for (int i = 0; i < rows.size(); i++) if (!superseded[i]) kept.add(i);
    return kept;
  }

  /**
   * Splits the pending rows (ascending) into this round's and the later rounds': a row waits while an
   * earlier pending row writes its document or tombstone, or (the create of a primary-key move) its
   * old key's document, whose move must land first.
   */
  static Round round(List<SearchChange> rows, List<Integer> pending) {
    Set<String> docs = new HashSet<>();
    Set<String> tombs = new HashSet<>();
    List<Integer> active = new ArrayList<>();
    List<Integer> deferred = new ArrayList<>();
    for (int i : pending) {
      SearchChange c = rows.get(i);
      boolean waits = docs.contains(c.head()) || tombs.contains(c.tombHead())
          || (c.oldHead() != null && docs.contains(c.oldHead()));
      docs.add(c.head());
      tombs.add(c.tombHead());
      (waits ? deferred : active).add(i);
    }
    return new Round(active, deferred);
  }
}
