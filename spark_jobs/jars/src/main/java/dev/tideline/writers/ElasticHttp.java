package dev.tideline.writers;

import java.io.IOException;
import java.nio.charset.StandardCharsets;

/**
 * The search writer's way to Elasticsearch's REST API: one request, its status and body. In production
 * {@link JdkElasticHttp} (one HTTP client per JVM and URL); unit tests pass a fake.
 */
public interface ElasticHttp {

  /** An answer: the HTTP status and the body's bytes. */
  record Reply(int status, byte[] body) {
    /** The start of the body, for error messages. */
    public String text(int max) {
      String text = new String(body, StandardCharsets.UTF_8);
      return text.length() <= max ? text : text.substring(0, max) + "...";
    }
  }

  /**
   * Sends {@code method path?query} with {@code body} (none if null). A connection refused, reset or
   * timed out throws an IOException: Elasticsearch is away.
   */
  Reply send(String method, String path, String query, byte[] body, String contentType)
      throws IOException, InterruptedException;

  default Reply post(String path, String query, byte[] body, String contentType)
      throws IOException, InterruptedException {
    return send("POST", path, query, body, contentType);
  }
}
