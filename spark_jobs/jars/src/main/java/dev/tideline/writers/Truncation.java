package dev.tideline.writers;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * A table's truncate in the search sink (spark_jobs/sinks/elasticsearch/_store.py): the alias's
 * watermark document, raised with compare-and-set, and the sweep of the documents below it. The node
 * has no {@code _delete_by_query}, so a sweep scrolls and deletes in bulk, each delete compare-and-set:
 * a 409 means the document was rewritten meanwhile, and the sweep runs again to judge its new version.
 */
final class Truncation {

  private static final int PAGE = 1000;
  private static final String KEEP_ALIVE = "1m";

  private final Elastic es;
  private final String watermarksIndex;

  Truncation(Elastic es, String watermarksIndex) {
    this.es = es;
    this.watermarksIndex = watermarksIndex;
  }

  /** The {@code _mget} entry of the alias's watermark (versions only). */
  String watermarkEntry(String alias) {
    return es.versionEntry(head(alias));
  }

  /**
   * Raises the alias's watermark to {@code version} (unless it is already there: a replay, or an older
   * truncate), then sweeps {@code target} below it. The sweep runs for a replay too: a rebuild index may
   * still hold rows the live index lost.
   */
  void truncate(String alias, String target, Version version) throws IOException, InterruptedException {
    Stored held = null;
    boolean settled = false;
    for (int attempt = 0; attempt < SearchStore.MAX_TRIES && !settled; attempt++) {
      held = es.mget(List.of(watermarkEntry(alias))).get(0);
      settled = held.found() && !version.above(held.version()) || raise(alias, version, held);
    }
    if (!settled) {
      throw new Elastic.Failure("watermark of " + alias + " still conflicts after " + SearchStore.MAX_TRIES + " tries");
    }
    sweep(target, Version.max(version, held.version()));
  }

  /** Writes the watermark {@code version} over {@code held} (compare-and-set); false on a conflict. */
  private boolean raise(String alias, Version version, Stored held) throws IOException, InterruptedException {
    String action = held.found() ? "{\"index\":{" + head(alias) + held.cas() : "{\"create\":{" + head(alias);
    String mark = "{\"alias\":" + Elastic.quote(alias) + "," + Elastic.quote(es.majorField) + ":" + version.major()
        + "," + Elastic.quote(es.minorField) + ":" + version.minor() + "}";
    Elastic.Item item = es.bulk(action + "}}\n" + mark + "\n", 1).get(0);
    if (item.status() == 409) return false; // another truncate wrote it meanwhile: read it again
    if (item.status() >= 300) {
      Elastic.checkAway(item);
      throw new Elastic.Failure("watermark of " + alias + " answered " + item.status() + ": " + item.errorType() + ": "
          + item.errorReason());
    }
    return true;
  }

  /**
   * A truncate applied by another task between a chunk's first read and its writes would miss what the
   * chunk wrote if its sweep ran first. Reading the watermarks again after the writes closes that
   * window: either one is unchanged (the writes were visible to that sweep) or this chunk sweeps.
   */
  void sweepIfTruncatedMeanwhile(Map<String, Set<String>> targets, Map<String, Version> seen)
      throws IOException, InterruptedException {
    List<String> aliases = List.copyOf(targets.keySet());
    List<Stored> now = es.mget(aliases.stream().map(this::watermarkEntry).toList());
    for (int i = 0; i < aliases.size(); i++) {
      Stored mark = now.get(i);
      Version before = seen.getOrDefault(aliases.get(i), Version.ZERO);
      if (mark.found() && mark.version().above(before)) {
        for (String target : targets.get(aliases.get(i))) sweep(target, mark.version());
      }
    }
  }

  /** Deletes every document of {@code target} whose version is below {@code watermark}. */
  void sweep(String target, Version watermark) throws IOException, InterruptedException {
    String index = "/" + URLEncoder.encode(target, StandardCharsets.UTF_8);
    for (int attempt = 0; attempt < SearchStore.MAX_TRIES; attempt++) {
      es.refresh(List.of(target), false); // the scroll must see every write acknowledged so far
      ObjectNode search = Elastic.JSON.createObjectNode().put("size", PAGE).put("_source", false)
          .put("seq_no_primary_term", true);
      search.set("query", below(watermark));
      search.putArray("sort").add("_doc");
      JsonNode page = es.call("POST", index + "/_search", "scroll=" + KEEP_ALIVE, search.toString(), Elastic.JSON_TYPE);
      int conflicts = 0;
      try {
        while (page.path("hits").path("hits").size() > 0) {
          conflicts += deleteAll(target, page.path("hits").path("hits"));
          ObjectNode next = Elastic.JSON.createObjectNode().put("scroll", KEEP_ALIVE)
              .put("scroll_id", page.path("_scroll_id").asText());
          page = es.call("POST", "/_search/scroll", "", next.toString(), Elastic.JSON_TYPE);
        }
      } finally {
        clear(page.path("_scroll_id").asText(null));
      }
      if (conflicts == 0) return;
    }
    throw new Elastic.Failure("sweep of " + target + " still conflicts after " + SearchStore.MAX_TRIES + " tries");
  }

  /** Deletes the hits (compare-and-set); the number of conflicts. */
  private int deleteAll(String target, JsonNode hits) throws IOException, InterruptedException {
    StringBuilder body = new StringBuilder(128 * hits.size());
    for (JsonNode hit : hits) {
      ObjectNode delete = Elastic.JSON.createObjectNode();
      delete.putObject("delete").put("_index", hit.path("_index").asText()).put("_id", hit.path("_id").asText())
          .put("if_seq_no", hit.path("_seq_no").asLong()).put("if_primary_term", hit.path("_primary_term").asLong());
      body.append(delete).append('\n');
    }
    int conflicts = 0;
    for (Elastic.Item item : es.bulk(body, hits.size())) {
      if (item.status() == 409) conflicts++;
      else if (item.status() >= 300 && item.status() != 404) {
        Elastic.checkAway(item);
        throw new Elastic.Failure("sweep of " + target + " failed with " + item.status() + ": " + item.errorType()
            + ": " + item.errorReason());
      }
    }
    return conflicts;
  }

  /** Frees a scroll's search context now rather than at its keep-alive; a failure only costs memory a while. */
  private void clear(String scrollId) {
    if (scrollId == null) return;
    try {
      ObjectNode body = Elastic.JSON.createObjectNode();
      body.putArray("scroll_id").add(scrollId);
      es.call("DELETE", "/_search/scroll", "", body.toString(), Elastic.JSON_TYPE);
    } catch (Exception e) {
      if (e instanceof InterruptedException) Thread.currentThread().interrupt();
    }
  }

  /** A query for the documents whose (major, minor) version is below {@code watermark} (_store.below). */
  ObjectNode below(Version watermark) {
    ObjectNode query = Elastic.JSON.createObjectNode();
    ObjectNode bool = query.putObject("bool").put("minimum_should_match", 1);
    ArrayNode should = bool.putArray("should");
    should.addObject().putObject("range").putObject(es.majorField).put("lt", watermark.major());
    ArrayNode filter = should.addObject().putObject("bool").putArray("filter");
    filter.addObject().putObject("term").put(es.majorField, watermark.major());
    filter.addObject().putObject("range").putObject(es.minorField).put("lt", watermark.minor());
    return query;
  }

  /** {@code "_index":"<watermarks>","_id":"<alias>"}. */
  private String head(String alias) {
    return "\"_index\":" + Elastic.quote(watermarksIndex) + ",\"_id\":" + Elastic.quote(alias);
  }
}
