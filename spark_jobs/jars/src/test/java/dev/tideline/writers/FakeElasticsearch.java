package dev.tideline.writers;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.function.Consumer;

/**
 * An in-memory Elasticsearch for the search writer's tests: the calls the writer makes (_mget, _bulk
 * with compare-and-set, _refresh, a scroll of the sweep's query), their answers as the node gives them
 * after filter_path, and every request kept for the tests to look at. {@link #before} runs before each
 * request (another writer racing), {@link #item} can answer a bulk item instead of applying it.
 */
final class FakeElasticsearch implements ElasticHttp {

  /** A request as sent. */
  record Request(String method, String path, String query, String body) {}

  /** A stored document. */
  record Doc(ObjectNode source, long seqNo) {}

  /** Answers a bulk item instead of the store: {status, error type, reason}, or null to apply it. */
  @FunctionalInterface
  interface ItemAnswer {
    Object[] answer(String action, String index, String id);
  }

  static final String MAJOR = "tl_version_major";
  static final String MINOR = "tl_version_minor";

  final Map<String, Map<String, Doc>> indices = new TreeMap<>();
  final List<Request> requests = new CopyOnWriteArrayList<>();
  Consumer<Request> before = request -> {};
  ItemAnswer item = (action, index, id) -> null;
  private long seqNo;
  private final Map<String, Iterator<JsonNode>> scrolls = new TreeMap<>();

  // ---- the test's view of the store --------------------------------------------------------------

  /** Stores the document; returns its _seq_no, which a compare-and-set write of it must name. */
  long put(String index, String id, String source) {
    try {
      Doc doc = new Doc((ObjectNode) Elastic.JSON.readTree(source), ++seqNo);
      indices.computeIfAbsent(index, name -> new TreeMap<>()).put(id, doc);
      return doc.seqNo();
    } catch (IOException e) {
      throw new IllegalArgumentException(e);
    }
  }

  Doc get(String index, String id) {
    return indices.getOrDefault(index, Map.of()).get(id);
  }

  void remove(String index, String id) {
    indices.getOrDefault(index, new TreeMap<>()).remove(id);
  }

  List<Request> calls(String path) {
    return requests.stream().filter(request -> request.path().equals(path)).toList();
  }

  // ---- the REST API ------------------------------------------------------------------------------

  @Override
  public Reply send(String method, String path, String query, byte[] body, String contentType) throws IOException {
    Request request = new Request(method, path, query, body == null ? null : new String(body, StandardCharsets.UTF_8));
    requests.add(request);
    before.accept(request);
    JsonNode json = body == null ? null : Elastic.JSON.readTree(body);
    JsonNode answer;
    if (path.equals("/_mget")) answer = mget(json);
    else if (path.equals("/_bulk")) answer = bulk(request.body());
    else if (path.endsWith("/_refresh")) answer = Elastic.JSON.createObjectNode();
    else if (path.endsWith("/_search") && query.startsWith("scroll=")) answer = search(path, json);
    else if (path.equals("/_search/scroll") && method.equals("POST")) answer = scroll(json.path("scroll_id").asText());
    else if (path.equals("/_search/scroll")) answer = Elastic.JSON.createObjectNode().put("succeeded", true);
    else return new Reply(400, ("no fake for " + method + " " + path).getBytes(StandardCharsets.UTF_8));
    return new Reply(200, Elastic.JSON.writeValueAsBytes(answer));
  }

  private JsonNode mget(JsonNode body) {
    ObjectNode answer = Elastic.JSON.createObjectNode();
    ArrayNode docs = answer.putArray("docs");
    for (JsonNode entry : body.path("docs")) {
      Doc doc = get(entry.path("_index").asText(), entry.path("_id").asText());
      ObjectNode hit = docs.addObject();
      hit.put("found", doc != null);
      if (doc == null) continue;
      hit.put("_seq_no", doc.seqNo()).put("_primary_term", 1);
      JsonNode fields = entry.get("_source");
      if (fields == null) {
        hit.set("_source", doc.source().deepCopy());
      } else {
        ObjectNode source = hit.putObject("_source");
        for (JsonNode field : fields) {
          JsonNode value = doc.source().get(field.asText());
          if (value != null) source.set(field.asText(), value);
        }
      }
    }
    return answer;
  }

  private JsonNode bulk(String body) throws IOException {
    ObjectNode answer = Elastic.JSON.createObjectNode();
    ArrayNode items = answer.putArray("items");
    String[] lines = body.split("\n");
    for (int i = 0; i < lines.length; i++) {
      JsonNode action = Elastic.JSON.readTree(lines[i]);
      String kind = action.fieldNames().next();
      JsonNode meta = action.get(kind);
      JsonNode source = kind.equals("delete") ? null : Elastic.JSON.readTree(lines[++i]);
      ObjectNode result = items.addObject().putObject(kind);
      Object[] forced = item.answer(kind, meta.path("_index").asText(), meta.path("_id").asText());
      Object[] outcome = forced != null ? forced : apply(kind, meta, source);
      result.put("status", (Integer) outcome[0]);
      if (outcome.length > 1) {
        result.putObject("error").put("type", (String) outcome[1]).put("reason", (String) outcome[2]);
      }
    }
    return answer;
  }

  private Object[] apply(String kind, JsonNode meta, JsonNode source) {
    String index = meta.path("_index").asText();
    String id = meta.path("_id").asText();
    Doc doc = get(index, id);
    boolean cas = meta.has("if_seq_no");
    if (kind.equals("create") && doc != null) return new Object[] {409, "version_conflict_engine_exception", "exists"};
    if (doc == null && (kind.equals("update") || kind.equals("delete") && !cas)) return new Object[] {404};
    if (cas && (doc == null || doc.seqNo() != meta.path("if_seq_no").asLong())) {
      return new Object[] {409, "version_conflict_engine_exception", "seq_no mismatch"};
    }
    switch (kind) {
      case "delete" -> remove(index, id);
      case "update" -> {
        ObjectNode merged = doc.source().deepCopy();
        merged.setAll((ObjectNode) source.get("doc"));
        put(index, id, merged.toString());
      }
      default -> put(index, id, source.toString());
    }
    return new Object[] {kind.equals("create") ? 201 : 200};
  }

  /** The sweep's query: documents below (major, minor), read back from the `below` query's shape. */
  private JsonNode search(String path, JsonNode body) {
    String index = path.substring(1, path.length() - "/_search".length());
    JsonNode should = body.path("query").path("bool").path("should");
    long major = should.path(0).path("range").path(MAJOR).path("lt").asLong();
    long minor = should.path(1).path("bool").path("filter").path(1).path("range").path(MINOR).path("lt").asLong();
    List<JsonNode> hits = new ArrayList<>();
    for (Map.Entry<String, Doc> entry : indices.getOrDefault(index, Map.of()).entrySet()) {
      JsonNode source = entry.getValue().source();
      long docMajor = source.path(MAJOR).asLong();
      if (docMajor < major || docMajor == major && source.path(MINOR).asLong() < minor) {
        hits.add(Elastic.JSON.createObjectNode().put("_index", index).put("_id", entry.getKey())
            .put("_seq_no", entry.getValue().seqNo()).put("_primary_term", 1));
      }
    }
    String id = "scroll-" + scrolls.size();
    scrolls.put(id, paged(hits, body.path("size").asInt()));
    return scroll(id);
  }

  private static Iterator<JsonNode> paged(List<JsonNode> hits, int size) {
    List<JsonNode> pages = new ArrayList<>();
    for (int start = 0; ; start += size) { // the last page is empty, as a scroll's is
      ObjectNode page = Elastic.JSON.createObjectNode();
      ArrayNode array = page.putObject("hits").putArray("hits");
      hits.subList(Math.min(hits.size(), start), Math.min(hits.size(), start + size)).forEach(array::add);
      pages.add(page);
      if (array.isEmpty()) return pages.iterator();
    }
  }

  private JsonNode scroll(String id) {
    ObjectNode page = (ObjectNode) scrolls.get(id).next();
    return page.put("_scroll_id", id);
  }
}
