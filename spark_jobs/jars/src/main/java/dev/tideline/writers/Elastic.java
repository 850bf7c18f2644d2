package dev.tideline.writers;

import com.fasterxml.jackson.core.JacksonException;
import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.core.StreamReadConstraints;
import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.json.JsonMapper;
import com.fasterxml.jackson.databind.cfg.JsonNodeFeature;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Set;

/**
 * The search writer's Elasticsearch calls below the decisions: {@code _mget} and {@code _bulk} (bodies
 * joined by the caller, answers parsed with Jackson and filtered as the Python shipper filters them),
 * refresh and plain JSON calls, and the rule that sorts a failure into "away, wait and retry" and "an
 * answer, fail the task".
 */
final class Elastic {

  /** Elasticsearch cannot be reached or cannot serve now (down, restarting, overloaded): retry later. */
  static final class Away extends IOException {
    private static final long serialVersionUID = 1L;

    Away(String message) {
      super(message);
    }
  }

  /** Elasticsearch answered and the chunk cannot be applied (index missing, endless conflicts, a bug). */
  static final class Failure extends RuntimeException {
    private static final long serialVersionUID = 1L;

    Failure(String message) {
      super(message);
    }
  }

  /** One bulk item's answer: its status, and its error's type and reason when it has one. */
  record Item(int status, String errorType, String errorReason) {}

  // Numbers as written: a numeric column's digits must survive a document read and written again. And
  // no limits below Elasticsearch's own: a document it stored must be readable here.
  static final ObjectMapper JSON = JsonMapper.builder(JsonFactory.builder().streamReadConstraints(
          StreamReadConstraints.builder().maxStringLength(Integer.MAX_VALUE).maxNumberLength(Integer.MAX_VALUE)
              .maxNestingDepth(Integer.MAX_VALUE).build()).build())
      .enable(DeserializationFeature.USE_BIG_DECIMAL_FOR_FLOATS)
      .disable(JsonNodeFeature.STRIP_TRAILING_BIGDECIMAL_ZEROES).build();
  static final String NDJSON = "application/x-ndjson";
  static final String JSON_TYPE = "application/json";
  private static final String MGET_FILTER = "docs.found,docs._seq_no,docs._primary_term,docs._source,docs.error";
  private static final String BULK_FILTER = "items.*.status,items.*.error.type,items.*.error.reason";
  // Statuses of a node that is there but cannot serve now: a gateway without a node, no master or shards
  // not started yet (503), a full queue (429).
  private static final Set<Integer> AWAY_STATUSES = Set.of(429, 502, 503, 504);
  // The same in an _mget entry, which has no status: shards still starting, no master, a full queue.
  private static final Set<String> AWAY_ERRORS = Set.of("no_shard_available_action_exception",
      "unavailable_shards_exception", "es_rejected_execution_exception", "cluster_block_exception",
      "circuit_breaking_exception");
  private static final int SHOWN = 300;

  final ElasticHttp http;
  final String majorField;
  final String minorField;
  private final String versionSource; // ,"_source":["<major>","<minor>"]

  Elastic(ElasticHttp http, String majorField, String minorField) {
    this.http = http;
    this.majorField = majorField;
    this.minorField = minorField;
    this.versionSource = ",\"_source\":[" + quote(majorField) + "," + quote(minorField) + "]";
  }

  /** The {@code _mget} of these entries (JSON objects), each read as a Stored; any entry's error throws. */
  List<Stored> mget(List<String> entries) throws IOException, InterruptedException {
    StringBuilder body = new StringBuilder(64 * entries.size() + 16).append("{\"docs\":[");
    for (int i = 0; i < entries.size(); i++) body.append(i == 0 ? "" : ",").append(entries.get(i));
    JsonNode docs = call("POST", "/_mget", "filter_path=" + MGET_FILTER, body.append("]}"), JSON_TYPE).path("docs");
    if (docs.size() != entries.size()) {
      throw new Failure("_mget answered " + docs.size() + " documents for " + entries.size());
    }
    List<Stored> stored = new ArrayList<>(entries.size());
    for (JsonNode hit : docs) {
      JsonNode error = hit.get("error");
      if (error != null) {
        String type = error.path("type").asText("");
        String message = "cannot read documents: " + error;
        if (AWAY_ERRORS.contains(type)) throw new Away(message);
        throw new Failure(message);
      }
      stored.add(Stored.of(hit, majorField, minorField));
    }
    return stored;
  }

  /** An {@code _mget} entry for the document a head names, with only its version fields. */
  String versionEntry(String head) {
    return "{" + head + versionSource + "}";
  }

  /** An {@code _mget} entry for the document a head names, with its whole {@code _source}. */
  static String wholeEntry(String head) {
    return "{" + head + "}";
  }

  /** Sends {@code count} bulk actions (ndjson); their items in order. A whole-request failure throws. */
  List<Item> bulk(CharSequence body, int count) throws IOException, InterruptedException {
    JsonNode items = call("POST", "/_bulk", "filter_path=" + BULK_FILTER, body, NDJSON).path("items");
    if (items.size() != count) throw new Failure("_bulk answered " + items.size() + " items for " + count);
    List<Item> found = new ArrayList<>(count);
    for (JsonNode item : items) {
      JsonNode result = item.elements().hasNext() ? item.elements().next() : item; // {"<action>": {...}}
      JsonNode error = result.path("error");
      found.add(new Item(result.path("status").asInt(0), error.path("type").asText(null),
          error.path("reason").asText(null)));
    }
    return found;
  }

  /** Throws {@link Away} for a bulk item that only says "not now" (429, 503); other statuses are the caller's. */
  static void checkAway(Item item) throws Away {
    if (AWAY_STATUSES.contains(item.status())) {
      throw new Away("bulk item answered " + item.status() + ": " + item.errorType() + ": " + item.errorReason());
    }
  }

  /** Makes the indices' writes searchable; with {@code ignoreUnavailable} a missing index is skipped. */
  void refresh(Collection<String> indices, boolean ignoreUnavailable) throws IOException, InterruptedException {
    refresh(http, indices, ignoreUnavailable);
  }

  static void refresh(ElasticHttp http, Collection<String> indices, boolean ignoreUnavailable)
      throws IOException, InterruptedException {
    if (indices.isEmpty()) return;
    List<String> names = new ArrayList<>();
    for (String index : indices) names.add(URLEncoder.encode(index, StandardCharsets.UTF_8));
    call(http, "POST", "/" + String.join(",", names) + "/_refresh", ignoreUnavailable ? "ignore_unavailable=true" : "",
        null, null);
  }

  /** One request; its body as JSON. Statuses of a node away throw {@link Away}, other errors {@link Failure}. */
  JsonNode call(String method, String path, String query, CharSequence body, String contentType)
      throws IOException, InterruptedException {
    return call(http, method, path, query, body, contentType);
  }

  private static JsonNode call(ElasticHttp http, String method, String path, String query, CharSequence body,
                               String contentType) throws IOException, InterruptedException {
    byte[] bytes = body == null ? null : body.toString().getBytes(StandardCharsets.UTF_8);
    long start = System.nanoTime();
    ElasticHttp.Reply reply = http.send(method, path, query, bytes, contentType);
    WriterTimes.record("elasticsearch " + endpoint(path), System.nanoTime() - start);
    String what = method + " " + path;
    String answered = what + " answered " + reply.status() + ": ";
    if (AWAY_STATUSES.contains(reply.status())) throw new Away(answered + reply.text(SHOWN));
    if (reply.status() >= 300) throw new Failure(answered + reply.text(SHOWN));
    return reply.body().length == 0 ? JSON.missingNode() : JSON.readTree(reply.body());
  }

  /** A request's endpoint for {@link WriterTimes}: {@code _mget}, {@code _bulk}, {@code _refresh}, …; "other". */
  static String endpoint(String path) {
    String last = path.substring(path.lastIndexOf('/') + 1);
    return last.startsWith("_") ? last : "other";
  }

  /** {@code text} as a JSON string literal. */
  static String quote(String text) {
    try {
      return JSON.writeValueAsString(text);
    } catch (JsonProcessingException e) {
      throw new UncheckedIOException(e);
    }
  }

  /**
   * True for an Elasticsearch that is away (connection refused or reset, timeout, 429/502/503/504,
   * shards not ready): worth waiting for. An answer that cannot be parsed is not an absence.
   */
  static boolean isAway(Throwable error) {
    for (Throwable t = error; t != null; t = t.getCause()) {
      if (t instanceof JacksonException) return false;
      if (t instanceof IOException) return true;
    }
    return false;
  }
}
