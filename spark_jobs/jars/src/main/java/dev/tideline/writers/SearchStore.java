package dev.tideline.writers;

import dev.tideline.writers.BulkLines.Line;
import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.function.LongSupplier;

/**
 * The search sink's writes, as the Python shipper's {@code Chunk.apply} makes them. Per round: one
 * {@code _mget} of the aliases' truncate watermarks and the rows' documents and tombstones (versions
 * only), the decisions ({@link BulkLines}, {@link RareLines}), one {@code _bulk} of the lines joined from
 * the rows' prebuilt fragments. Every write is compare-and-set on what was read: a 409 (someone wrote
 * the row in between) sends the row round again, a 400 refuses it. Truncates are {@link Truncation}'s.
 *
 * <p>Why compare-and-set and not {@code version_type=external}: a version is a pair of longs, and the
 * node runs no scripts (spark_jobs/sinks/elasticsearch/_store.py).
 */
public final class SearchStore {

  /** Makes the indices a chunk wrote searchable: the shared {@link Refresher}, or a refresh right away. */
  @FunctionalInterface
  public interface Refresh {
    void written(Set<String> indices) throws Exception;
  }

  static final int MAX_TRIES = 5; // compare-and-set tries per change; only concurrent writers of a row use them

  private final Elastic es;
  private final Truncation truncation;
  private final RareLines rare;
  private final Refresh refresh;

  SearchStore(ElasticHttp http, String watermarksIndex, String majorField, String minorField, long moveWaitMs,
              Refresh refresh, Backoff.Sleeper sleeper, LongSupplier clockMs) {
    this.es = new Elastic(http, majorField, minorField);
    this.truncation = new Truncation(es, watermarksIndex);
    this.rare = new RareLines(es, moveWaitMs, sleeper, clockMs);
    this.refresh = refresh;
  }

  /** The store of a writer: real sleeps and clock; {@code refreshMs <= 0} refreshes after each chunk itself. */
  public static SearchStore of(String url, String watermarksIndex, String majorField, String minorField,
                               long moveWaitMs, long refreshMs) {
    ElasticHttp http = JdkElasticHttp.of(url);
    Refresh refresh;
    if (refreshMs > 0) {
      Refresher refresher = Refresher.of(url, http, refreshMs);
      refresh = refresher::mark;
    } else {
      Elastic es = new Elastic(http, majorField, minorField);
      refresh = indices -> es.refresh(indices, true);
    }
    return new SearchStore(http, watermarksIndex, majorField, minorField, moveWaitMs, refresh, Thread::sleep,
        System::currentTimeMillis);
  }

  /**
   * Applies the rows (one chunk) until every one is decided. Returns {row index: reason} of the rows
   * Elasticsearch refused; throws if rows still conflict after {@link #MAX_TRIES} tries.
   */
  public Map<Integer, String> apply(List<SearchChange> rows) throws Exception {
    if (rows.isEmpty()) return new TreeMap<>();
    Chunk chunk = new Chunk(rows);
    Map<Integer, String> refused = chunk.apply();
    Set<String> written = new TreeSet<>();
    chunk.targets.values().forEach(written::addAll);
    refresh.written(written);
    return refused;
  }

  /**
   * True for an Elasticsearch that is away (connection refused or reset, timeout, 429/502/503/504,
   * shards not started): the writer's {@link Backoff} waits and applies the chunk again.
   */
  public static boolean isAway(Throwable error) {
    return Elastic.isAway(error);
  }

  /** Raises the alias's watermark to {@code version} and sweeps {@code target} below it (a table's truncate). */
  public void truncate(String alias, String target, Version version) throws Exception {
    truncation.truncate(alias, target, version);
    refresh.written(Set.of(target));
  }

  /** One chunk's rows and what its rounds learnt: tries per row, refusals, key moves' deadlines. */
  private final class Chunk {
    final List<SearchChange> rows;
    final Map<String, Set<String>> targets = new TreeMap<>(); // alias → the indices written under it
    final List<String> aliases;
    final int[] tries;
    final Map<Integer, String> refused = new TreeMap<>();
    final Map<Integer, Long> moveDeadlines = new HashMap<>();

    Chunk(List<SearchChange> rows) {
      this.rows = rows;
      for (SearchChange c : rows) targets.computeIfAbsent(c.alias(), alias -> new TreeSet<>()).add(c.target());
      this.aliases = new ArrayList<>(targets.keySet());
      this.tries = new int[rows.size()];
    }

    Map<Integer, String> apply() throws IOException, InterruptedException {
      Map<String, Version> firstSeen = null;
      List<Integer> pending = BulkLines.unsuperseded(rows);
      while (!pending.isEmpty()) {
        BulkLines.Round round = BulkLines.round(rows, pending);
        List<Stored> read = read(round.active());
        Map<String, Version> marks = new HashMap<>();
        for (int a = 0; a < aliases.size(); a++) marks.put(aliases.get(a), read.get(a).version());
        if (firstSeen == null) firstSeen = marks;
        TreeSet<Integer> next = new TreeSet<>(round.deferred()); // in arrival order: a document's changes stay so
        List<Integer> again = decideAndWrite(round.active(), read, marks, next);
        int stuck = 0;
        for (int row : again) if (++tries[row] >= MAX_TRIES) stuck++;
        if (stuck > 0) throw new Elastic.Failure(stuck + " rows still conflict after " + MAX_TRIES + " tries");
        next.addAll(again);
        pending = new ArrayList<>(next);
      }
      truncation.sweepIfTruncatedMeanwhile(targets, firstSeen);
      return refused;
    }

    /**
     * One round's decisions and bulk request: returns the rows to decide again, adds to {@code later}
     * the creates of moved rows postponed behind the round's other writes.
     */
    private List<Integer> decideAndWrite(List<Integer> active, List<Stored> read, Map<String, Version> marks,
                                         Set<Integer> later) throws IOException, InterruptedException {
      List<Line> lines = new ArrayList<>();
      List<Integer> waiting = new ArrayList<>(); // positions in active
      for (int k = 0; k < active.size(); k++) {
        int row = active.get(k);
        SearchChange c = rows.get(row);
        BulkLines.Outcome outcome = BulkLines.decide(row, c, marks.get(c.alias()), doc(read, k), tomb(read, k), lines);
        if (outcome == BulkLines.Outcome.RARE) decideRare(k, active, read, false, lines, waiting);
      }
      if (lines.isEmpty()) { // nothing of this round for other tasks to wait on: wait for the old keys now
        List<Integer> postponed = List.copyOf(waiting);
        waiting.clear();
        for (int k : postponed) decideRare(k, active, read, true, lines, waiting);
      }
      for (int k : waiting) later.add(active.get(k));
      return bulk(lines);
    }

    private void decideRare(int k, List<Integer> active, List<Stored> read, boolean mayWait, List<Line> lines,
                            List<Integer> waiting) throws IOException, InterruptedException {
      int row = active.get(k);
      if (rare.lines(row, rows.get(row), doc(read, k), tomb(read, k), moveDeadlines, mayWait, lines)
          == RareLines.Outcome.LATER) {
        waiting.add(k);
      }
    }

    private Stored doc(List<Stored> read, int k) {
      return read.get(aliases.size() + 2 * k);
    }

    private Stored tomb(List<Stored> read, int k) {
      return read.get(aliases.size() + 2 * k + 1);
    }

    /** The aliases' watermarks, then each active row's document and tombstone (versions only). */
    private List<Stored> read(List<Integer> active) throws IOException, InterruptedException {
      List<String> entries = new ArrayList<>(aliases.size() + 2 * active.size());
      for (String alias : aliases) entries.add(truncation.watermarkEntry(alias));
      for (int row : active) {
        SearchChange c = rows.get(row);
        // A change that may be decided per row needs the stored columns: read whole, in the same request.
        entries.add(BulkLines.mayBeRare(c) ? Elastic.wholeEntry(c.head()) : es.versionEntry(c.head()));
        entries.add(es.versionEntry(rows.get(row).tombHead()));
      }
      return es.mget(entries);
    }

    /**
     * Sends the lines; returns the rows to decide again (409, or a document gone before its write) and
     * notes those Elasticsearch refused (400). A delete of a document already gone (404) is done; any
     * other failed item throws.
     */
    private List<Integer> bulk(List<Line> lines) throws IOException, InterruptedException {
      if (lines.isEmpty()) return List.of();
      int size = 0;
      for (Line line : lines) size += line.text().length();
      StringBuilder body = new StringBuilder(size);
      for (Line line : lines) body.append(line.text());
      List<Elastic.Item> items = es.bulk(body, lines.size());
      Set<Integer> conflicts = new LinkedHashSet<>();
      Map<Integer, String> bad = new HashMap<>();
      for (int i = 0; i < items.size(); i++) {
        Elastic.Item item = items.get(i);
        Line line = lines.get(i);
        int status = item.status();
        if (status < 300 || (status == 404 && line.delete())) continue;
        if (status == 409 || status == 404) {
          conflicts.add(line.owner());
        } else if (status == 400) {
          bad.putIfAbsent(line.owner(), "elasticsearch " + item.errorType() + ": " + item.errorReason());
        } else {
          Elastic.checkAway(item);
          throw new Elastic.Failure("bulk item failed with " + status + ": " + item.errorType() + ": "
              + item.errorReason());
        }
      }
      refused.putAll(bad);
      List<Integer> again = new ArrayList<>();
      for (int owner : conflicts) if (!bad.containsKey(owner)) again.add(owner);
      return again;
    }
  }
}
