package dev.tideline.writers;

import static dev.tideline.writers.Changes.TOMBSTONES;
import static dev.tideline.writers.Changes.WATERMARKS;
import static dev.tideline.writers.Changes.delete;
import static dev.tideline.writers.Changes.stored;
import static dev.tideline.writers.Changes.upsert;
import static dev.tideline.writers.FakeElasticsearch.MAJOR;
import static dev.tideline.writers.FakeElasticsearch.MINOR;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/** The search writer's decisions and writes (SearchStore, BulkLines, RareLines) against a fake Elasticsearch. */
class SearchStoreTest {

  private static final String VERSION_SOURCE = "\"_source\":[\"tl_version_major\",\"tl_version_minor\"]";

  private final FakeElasticsearch es = new FakeElasticsearch();
  private final List<Set<String>> refreshed = new ArrayList<>();
  private final List<Long> sleeps = new ArrayList<>();
  private final long[] clock = {0};
  private Runnable onSleep = () -> {};
  private final SearchStore store = new SearchStore(es, WATERMARKS, MAJOR, MINOR, 100, refreshed::add, millis -> {
    sleeps.add(millis);
    clock[0] += millis;
    onSleep.run();
  }, () -> clock[0]);

  private Map<Integer, String> apply(Changes... changes) throws Exception {
    return store.apply(Arrays.stream(changes).map(Changes::build).toList());
  }

  private List<String> bulks() {
    return es.calls("/_bulk").stream().map(FakeElasticsearch.Request::body).toList();
  }

  private String source(String index, String id) {
    FakeElasticsearch.Doc doc = es.get(index, id);
    return doc == null ? null : doc.source().toString();
  }

  @Test
  void aNewRowIsCreatedAfterOneReadOfItsDocumentTombstoneAndWatermark() throws Exception {
    assertEquals(Map.of(), apply(upsert("1", 5, 0).column("name", "\"a\"")));
    FakeElasticsearch.Request read = es.calls("/_mget").get(0);
    assertEquals("filter_path=docs.found,docs._seq_no,docs._primary_term,docs._source,docs.error", read.query());
    assertEquals("{\"docs\":[{\"_index\":\"tideline-watermarks\",\"_id\":\"orders\"," + VERSION_SOURCE + "},"
        + "{\"_index\":\"orders\",\"_id\":\"1\"," + VERSION_SOURCE + "},"
        + "{\"_index\":\"tideline-tombstones\",\"_id\":\"orders/1\"," + VERSION_SOURCE + "}]}", read.body());
    assertEquals(List.of("{\"create\":{\"_index\":\"orders\",\"_id\":\"1\",\"require_alias\":true}}\n"
        + "{\"name\":\"a\",\"tl_version_major\":5,\"tl_version_minor\":0}\n"), bulks());
    assertEquals("filter_path=items.*.status,items.*.error.type,items.*.error.reason",
        es.calls("/_bulk").get(0).query());
    assertEquals("{\"name\":\"a\",\"tl_version_major\":5,\"tl_version_minor\":0}", source("orders", "1"));
    assertEquals(List.of(Set.of("orders")), refreshed);
  }

  @Test
  void requireAliasOnlyWhenTheTargetIsTheAlias() throws Exception {
    apply(upsert("1", 5, 0).target("orders-rebuild"));
    assertTrue(bulks().get(0).startsWith("{\"create\":{\"_index\":\"orders-rebuild\",\"_id\":\"1\"}}\n"),
        bulks().get(0));
    assertEquals(List.of(Set.of("orders-rebuild")), refreshed);
  }

  @Test
  void aStoredRowIsIndexedWithCompareAndSet() throws Exception {
    long seqNo = es.put("orders", "1", stored(3, 0, "\"name\":\"old\""));
    apply(upsert("1", 5, 0).column("name", "\"new\""));
    assertEquals(List.of("{\"index\":{\"_index\":\"orders\",\"_id\":\"1\",\"if_seq_no\":" + seqNo
        + ",\"if_primary_term\":1,\"require_alias\":true}}\n"
        + "{\"name\":\"new\",\"tl_version_major\":5,\"tl_version_minor\":0}\n"),
        bulks());
  }

  @Test
  void keptColumnsStayThroughAnUpdateWithThePartialDocument() throws Exception {
    long seqNo = es.put("orders", "1", stored(3, 0, "\"name\":\"old\",\"big\":\"stored\""));
    apply(upsert("1", 5, 0).column("name", "\"new\"").keeping("big"));
    assertEquals(List.of("{\"update\":{\"_index\":\"orders\",\"_id\":\"1\",\"if_seq_no\":" + seqNo
        + ",\"if_primary_term\":1,\"require_alias\":true}}\n{\"doc\":{\"name\":\"new\",\"tl_version_major\":5,"
        + "\"tl_version_minor\":0}}\n"), bulks());
    assertEquals("{\"name\":\"new\",\"big\":\"stored\",\"tl_version_major\":5,\"tl_version_minor\":0}",
        source("orders", "1"));
  }

  @Test
  void aDeleteCreatesItsTombstoneAndDeletesTheDocumentWithCompareAndSet() throws Exception {
    long seqNo = es.put("orders", "1", stored(3, 0, "\"name\":\"a\""));
    apply(delete("1", 5, 0));
    assertEquals(List.of("{\"create\":{\"_index\":\"tideline-tombstones\",\"_id\":\"orders/1\"}}\n"
        + "{\"alias\":\"orders\",\"id\":\"1\",\"tl_version_major\":5,\"tl_version_minor\":0}\n"
        + "{\"delete\":{\"_index\":\"orders\",\"_id\":\"1\",\"if_seq_no\":" + seqNo + ",\"if_primary_term\":1}}\n"),
        bulks());
    assertNull(source("orders", "1"));
    assertEquals("{\"alias\":\"orders\",\"id\":\"1\",\"tl_version_major\":5,\"tl_version_minor\":0}",
        source(TOMBSTONES, "orders/1"));
  }

  @Test
  void aTombstoneThereIsIndexedWithCompareAndSet() throws Exception {
    long tombSeqNo = es.put(TOMBSTONES, "orders/1", stored(2, 0, "\"alias\":\"orders\",\"id\":\"1\""));
    apply(delete("1", 5, 0)); // the document is already gone: no delete line
    assertEquals(List.of("{\"index\":{\"_index\":\"tideline-tombstones\",\"_id\":\"orders/1\",\"if_seq_no\":"
        + tombSeqNo + ",\"if_primary_term\":1}}\n"
        + "{\"alias\":\"orders\",\"id\":\"1\",\"tl_version_major\":5,\"tl_version_minor\":0}\n"),
        bulks());
  }

  @Test
  void aDocumentOlderThanItsTombstoneIsDeletedAsStale() throws Exception {
    long seqNo = es.put("orders", "1", stored(3, 0, "\"name\":\"a\""));
    es.put(TOMBSTONES, "orders/1", stored(6, 0, "\"alias\":\"orders\",\"id\":\"1\""));
    apply(upsert("1", 4, 0).column("name", "\"b\"")); // older than the tombstone: only the stale document goes
    assertEquals(List.of("{\"delete\":{\"_index\":\"orders\",\"_id\":\"1\",\"if_seq_no\":" + seqNo
        + ",\"if_primary_term\":1}}\n"), bulks());
    assertNull(source("orders", "1"));
  }

  @Test
  void anEqualOrOlderVersionWritesNothing() throws Exception {
    es.put("orders", "1", stored(5, 0, "\"name\":\"a\""));
    es.put(WATERMARKS, "orders", "{\"alias\":\"orders\",\"tl_version_major\":4,\"tl_version_minor\":0}");
    assertEquals(Map.of(), apply(upsert("1", 5, 0).column("name", "\"same\"")));
    assertEquals(Map.of(), apply(upsert("1", 4, 9).column("name", "\"older\"")));
    assertEquals(Map.of(), apply(upsert("2", 3, 9).column("name", "\"below the watermark\"")));
    assertEquals(Map.of(), apply(delete("1", 4, 0)));
    assertEquals(List.of(), bulks());
    assertEquals("{\"name\":\"a\",\"tl_version_major\":5,\"tl_version_minor\":0}", source("orders", "1"));
    assertNull(source("orders", "2"));
  }

  @Test
  void aConflictIsReadAndDecidedAgain() throws Exception {
    es.before = request -> {
      if (request.path().equals("/_bulk") && es.calls("/_bulk").size() == 1) {
        es.put("orders", "1", stored(2, 0, "\"name\":\"racing\"")); // another writer, between read and write
      }
    };
    apply(upsert("1", 5, 0).column("name", "\"mine\""));
    assertEquals(2, bulks().size());
    assertTrue(bulks().get(1).startsWith("{\"index\":{\"_index\":\"orders\",\"_id\":\"1\",\"if_seq_no\":"),
        bulks().get(1));
    assertEquals("{\"name\":\"mine\",\"tl_version_major\":5,\"tl_version_minor\":0}", source("orders", "1"));
  }

  @Test
  void rowsStillConflictingAfterFiveTriesFailTheChunk() {
    es.item = (action, index, id) -> new Object[] {409, "version_conflict_engine_exception", "conflict"};
    Elastic.Failure failure = assertThrows(Elastic.Failure.class, () -> apply(upsert("1", 5, 0), upsert("2", 5, 0)));
    assertEquals("2 rows still conflict after 5 tries", failure.getMessage());
    assertEquals(5, bulks().size());
    assertEquals(List.of(), refreshed);
  }

  @Test
  void aRowElasticsearchRefusesIsReturnedWithItsReason() throws Exception {
    es.item = (action, index, id) -> id.equals("2")
        ? new Object[] {400, "document_parsing_exception", "failed to parse field [n] of type [long]"} : null;
    Map<Integer, String> refused = apply(upsert("1", 5, 0), upsert("2", 5, 0), upsert("3", 5, 0));
    assertEquals(Map.of(1, "elasticsearch document_parsing_exception: failed to parse field [n] of type [long]"),
        refused);
    assertEquals(1, bulks().size());
    assertTrue(source("orders", "1") != null && source("orders", "3") != null);
  }

  @Test
  void aDeleteOfADocumentAlreadyGoneIsDone() throws Exception {
    es.put("orders", "1", stored(3, 0, ""));
    es.item = (action, index, id) -> action.equals("delete") ? new Object[] {404} : null;
    assertEquals(Map.of(), apply(delete("1", 5, 0)));
    assertEquals(1, bulks().size());
  }

  @Test
  void anotherFailedItemFailsTheChunk() {
    es.item = (action, index, id) -> new Object[] {500, "illegal_state_exception", "boom"};
    Elastic.Failure failure = assertThrows(Elastic.Failure.class, () -> apply(upsert("1", 5, 0)));
    assertEquals("bulk item failed with 500: illegal_state_exception: boom", failure.getMessage());
  }

  @Test
  void aMovedDeleteKeepsTheRowsImageInItsTombstone() throws Exception {
    long seqNo = es.put("orders", "1", stored(3, 0, "\"name\":\"a\",\"big\":\"x\""));
    apply(delete("1", 5, 0).moved());
    assertEquals(List.of("{\"create\":{\"_index\":\"tideline-tombstones\",\"_id\":\"orders/1\"}}\n"
        + "{\"alias\":\"orders\",\"id\":\"1\",\"tl_version_major\":5,\"tl_version_minor\":0,\"image\":{\"name\":\"a\","
        + "\"big\":\"x\",\"tl_version_major\":3,\"tl_version_minor\":0}}\n"
        + "{\"delete\":{\"_index\":\"orders\",\"_id\":\"1\",\"if_seq_no\":" + seqNo + ",\"if_primary_term\":1}}\n"),
        bulks());
    assertNull(source("orders", "1"));
  }

  @Test
  void theCreateOfAMovedRowWaitsForTheOldKeysTombstone() throws Exception {
    es.put("orders", "1", stored(3, 0, "\"name\":\"a\",\"big\":\"before\""));
    onSleep = () -> { // the move's delete of the old key, applied by the task of another partition
      es.put(TOMBSTONES, "orders/1", stored(5, 0, "\"alias\":\"orders\",\"id\":\"1\",\"image\":{\"big\":\"imaged\"}"));
      es.remove("orders", "1");
    };
    apply(upsert("2", 5, 0).column("name", "\"a\"").keeping("big").movedFrom("1"));
    assertEquals(List.of(20L), sleeps);
    assertEquals(List.of("{\"create\":{\"_index\":\"orders\",\"_id\":\"2\",\"require_alias\":true}}\n"
        + "{\"name\":\"a\",\"big\":\"imaged\",\"tl_version_major\":5,\"tl_version_minor\":0}\n"), bulks());
  }

  @Test
  void theCreateOfAMovedRowWaitsOnlyOnceTheRestOfItsChunkIsWritten() throws Exception {
    es.put("orders", "1", stored(3, 0, "\"big\":\"before\""));
    onSleep = () -> { // both moves' deletes land meanwhile
      es.put(TOMBSTONES, "orders/1", stored(5, 0, "\"image\":{\"big\":\"imaged\"}"));
      es.put(TOMBSTONES, "orders/4", stored(5, 0, "\"image\":{\"big\":\"imaged too\"}"));
    };
    apply(upsert("2", 5, 0).keeping("big").movedFrom("1"), upsert("3", 5, 0),
        upsert("5", 5, 0).keeping("big").movedFrom("4"));
    assertEquals(List.of("{\"create\":{\"_index\":\"orders\",\"_id\":\"3\",\"require_alias\":true}}\n"
        + "{\"tl_version_major\":5,\"tl_version_minor\":0}\n",
        "{\"create\":{\"_index\":\"orders\",\"_id\":\"2\",\"require_alias\":true}}\n"
        + "{\"big\":\"imaged\",\"tl_version_major\":5,\"tl_version_minor\":0}\n"
        + "{\"create\":{\"_index\":\"orders\",\"_id\":\"5\",\"require_alias\":true}}\n"
        + "{\"big\":\"imaged too\",\"tl_version_major\":5,\"tl_version_minor\":0}\n"), bulks());
    assertEquals(List.of(20L), sleeps);
  }

  @Test
  void theCreateOfAMovedRowTakesTheOldDocumentAtTheDeadline() throws Exception {
    es.put("orders", "1", stored(3, 0, "\"name\":\"a\",\"big\":\"before\""));
    apply(upsert("2", 5, 0).column("name", "\"a\"").keeping("big").movedFrom("1"));
    assertEquals(List.of(20L, 20L, 20L, 20L, 20L), sleeps); // moveWaitMs 100
    assertEquals("{\"name\":\"a\",\"big\":\"before\",\"tl_version_major\":5,\"tl_version_minor\":0}",
        source("orders", "2"));
  }

  @Test
  void theCreateOfAMovedRowWithNothingLeftOfTheOldKeyKeepsNothing() throws Exception {
    apply(upsert("2", 5, 0).column("name", "\"a\"").keeping("big").movedFrom("1"));
    assertEquals(5, sleeps.size());
    assertEquals("{\"name\":\"a\",\"big\":null,\"tl_version_major\":5,\"tl_version_minor\":0}", source("orders", "2"));
  }

  @Test
  void theCreateOfAMovedRowTakesAnOldDocumentAsNewAsTheMoveAtOnce() throws Exception {
    es.put("orders", "1", stored(5, 0, "\"big\":\"current\""));
    apply(upsert("2", 5, 0).keeping("big").movedFrom("1"));
    assertEquals(List.of(), sleeps);
    assertEquals("{\"big\":\"current\",\"tl_version_major\":5,\"tl_version_minor\":0}", source("orders", "2"));
  }

  @Test
  void aKeptJsonColumnIsWrittenWholeNotMerged() throws Exception {
    long seqNo = es.put("orders", "1", stored(3, 0, "\"meta\":{\"a\":1,\"b\":2},\"big\":\"x\",\"price\":12.50"));
    apply(upsert("1", 5, 0).column("meta", "{\"a\":1}").keeping("big", "price").keepsObjects());
    assertEquals(List.of("{\"index\":{\"_index\":\"orders\",\"_id\":\"1\",\"if_seq_no\":" + seqNo
        + ",\"if_primary_term\":1,\"require_alias\":true}}\n{\"meta\":{\"a\":1},\"big\":\"x\",\"price\":12.50,"
        + "\"tl_version_major\":5,\"tl_version_minor\":0}\n"), bulks());
  }

  @Test
  void changesOfOneDocumentInOneChunkGoOneARoundInOrder() throws Exception {
    es.put("orders", "1", stored(3, 0, "\"name\":\"a\",\"n\":1,\"big\":\"x\""));
    apply(upsert("1", 4, 0).column("name", "\"b\"").column("n", "1").keeping("big"),
        upsert("1", 5, 0).column("name", "\"b\"").column("n", "2").keeping("big"));
    assertEquals(2, bulks().size());
    assertTrue(bulks().stream().allMatch(body -> body.startsWith("{\"update\"")), bulks().toString());
    assertEquals("{\"name\":\"b\",\"n\":2,\"big\":\"x\",\"tl_version_major\":5,\"tl_version_minor\":0}",
        source("orders", "1"));
  }

  @Test
  void aChangeALaterOneOverwritesWholeIsNotSent() throws Exception {
    apply(upsert("1", 4, 0).column("n", "1"), delete("1", 4, 1), upsert("1", 5, 0).column("n", "3"), upsert("2", 5, 0));
    assertEquals(List.of("{\"create\":{\"_index\":\"orders\",\"_id\":\"1\",\"require_alias\":true}}\n"
        + "{\"n\":3,\"tl_version_major\":5,\"tl_version_minor\":0}\n"
        + "{\"create\":{\"_index\":\"orders\",\"_id\":\"2\",\"require_alias\":true}}\n"
        + "{\"tl_version_major\":5,\"tl_version_minor\":0}\n"), bulks());
  }

  @Test
  void aTruncateRaisesTheWatermarkAndSweepsBelowIt() throws Exception {
    es.put("orders", "1", stored(1, 0, ""));
    es.put("orders", "2", stored(5, 0, "")); // below (5, 1)
    es.put("orders", "3", stored(6, 0, ""));
    store.truncate("orders", "orders", new Version(5, 1));
    assertEquals("{\"alias\":\"orders\",\"tl_version_major\":5,\"tl_version_minor\":1}", source(WATERMARKS, "orders"));
    assertEquals(Set.of("3"), es.indices.get("orders").keySet());
    List<String> paths = es.requests.stream().map(r -> r.method() + " " + r.path()).toList();
    assertEquals(List.of("POST /_mget", "POST /_bulk", "POST /orders/_refresh", "POST /orders/_search",
        "POST /_bulk", "POST /_search/scroll", "DELETE /_search/scroll"), paths);
    assertEquals(List.of(Set.of("orders")), refreshed);

    // A newer truncate: compare-and-set over the watermark there.
    long seqNo = es.get(WATERMARKS, "orders").seqNo();
    store.truncate("orders", "orders", new Version(7, 0));
    assertTrue(es.calls("/_bulk").get(2).body().startsWith("{\"index\":{\"_index\":\"tideline-watermarks\",\"_id\":"
        + "\"orders\",\"if_seq_no\":" + seqNo + ",\"if_primary_term\":1}}\n"), es.calls("/_bulk").get(2).body());
    assertEquals(Set.of(), es.indices.get("orders").keySet());

    // An older one (a replay): the watermark stays, the sweep below it runs again.
    es.put("orders", "4", stored(6, 0, ""));
    store.truncate("orders", "orders", new Version(2, 0));
    assertEquals("{\"alias\":\"orders\",\"tl_version_major\":7,\"tl_version_minor\":0}", source(WATERMARKS, "orders"));
    assertEquals(Set.of(), es.indices.get("orders").keySet());
  }

  @Test
  void aSweepConflictSweepsAgain() throws Exception {
    es.put("orders", "1", stored(1, 0, ""));
    AtomicInteger conflicts = new AtomicInteger();
    es.item = (action, index, id) -> action.equals("delete") && conflicts.getAndIncrement() == 0
        ? new Object[] {409, "version_conflict_engine_exception", "rewritten"} : null;
    store.truncate("orders", "orders", new Version(5, 0));
    assertEquals(2, es.calls("/orders/_search").size());
    assertEquals(Set.of(), es.indices.get("orders").keySet());
  }

  @Test
  void aTruncateAppliedMeanwhileSweepsWhatTheChunkWrote() throws Exception {
    es.before = request -> {
      if (request.path().equals("/_bulk") && !es.indices.containsKey(WATERMARKS)) { // another task's truncate
        es.put(WATERMARKS, "orders", "{\"alias\":\"orders\",\"tl_version_major\":9,\"tl_version_minor\":0}");
      }
    };
    apply(upsert("1", 5, 0));
    assertNull(source("orders", "1"));
    assertEquals(1, es.calls("/orders/_search").size());
  }

  @Test
  void anElasticsearchAwayIsToldApartFromAFailure() throws Exception {
    SearchStore away = new SearchStore((method, path, query, body, type) -> new ElasticHttp.Reply(503,
        "{\"error\":\"no master\"}".getBytes()), WATERMARKS, MAJOR, MINOR, 100, indices -> {}, millis -> {}, () -> 0);
    Exception error = assertThrows(Exception.class, () -> away.apply(List.of(upsert("1", 5, 0).build())));
    assertTrue(SearchStore.isAway(error), error.toString());
    assertTrue(SearchStore.isAway(new java.net.ConnectException("Connection refused")));
    assertTrue(SearchStore.isAway(new java.net.http.HttpTimeoutException("request timed out")));
    assertTrue(!SearchStore.isAway(new Elastic.Failure("index missing")));
    assertTrue(!SearchStore.isAway(new com.fasterxml.jackson.core.JsonParseException(null, "bad answer")));
  }

  @Test
  void aReadErrorFailsTheChunk() {
    SearchStore missing = new SearchStore((method, path, query, body, type) -> new ElasticHttp.Reply(200,
        ("{\"docs\":[{\"error\":{\"type\":\"index_not_found_exception\",\"reason\":\"no such index\"}},"
            + "{},{}]}").getBytes()),
        WATERMARKS, MAJOR, MINOR, 100, indices -> {}, millis -> {}, () -> 0);
    Elastic.Failure failure = assertThrows(Elastic.Failure.class,
        () -> missing.apply(List.of(upsert("1", 5, 0).build())));
    assertTrue(failure.getMessage().startsWith("cannot read documents: "), failure.getMessage());
  }
}
