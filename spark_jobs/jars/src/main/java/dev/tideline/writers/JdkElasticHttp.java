package dev.tideline.writers;

import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Base64;
import java.util.concurrent.ConcurrentHashMap;

/**
 * {@link ElasticHttp} over the JDK's HttpClient, one per URL per executor JVM: every task's writer, its
 * refresher and every epoch share its connection pool. A user and password in the URL
 * (http://user:pass@host:9200) become basic authentication, as the Python client does.
 */
public final class JdkElasticHttp implements ElasticHttp {

  private static final Duration CONNECT_TIMEOUT = Duration.ofSeconds(10);
  // As the Python shipper's: a bulk request of a thousand documents can keep a busy node a while.
  private static final Duration REQUEST_TIMEOUT = Duration.ofSeconds(120);
  private static final ConcurrentHashMap<String, JdkElasticHttp> CLIENTS = new ConcurrentHashMap<>();

  private final HttpClient client;
  private final String base;
  private final String authorization;

  private JdkElasticHttp(String url) {
    URI uri = URI.create(url);
    String path = uri.getRawPath() == null ? "" : uri.getRawPath().replaceAll("/+$", "");
    this.base = uri.getScheme() + "://" + uri.getHost() + (uri.getPort() < 0 ? "" : ":" + uri.getPort()) + path;
    String user = uri.getRawUserInfo();
    this.authorization = user == null ? null
        : "Basic " + Base64.getEncoder().encodeToString(
            java.net.URLDecoder.decode(user, StandardCharsets.UTF_8).getBytes(StandardCharsets.UTF_8));
    // HTTP/1.1: Elasticsearch speaks no HTTP/2, and an upgrade attempt on every request is wasted.
    this.client = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).connectTimeout(CONNECT_TIMEOUT)
        .followRedirects(HttpClient.Redirect.NEVER).build();
  }

  /** The JVM's client for {@code url}, created on first use. */
  public static JdkElasticHttp of(String url) {
    return CLIENTS.computeIfAbsent(url, JdkElasticHttp::new);
  }

  @Override
  public Reply send(String method, String path, String query, byte[] body, String contentType)
      throws IOException, InterruptedException {
    String target = base + path + (query == null || query.isEmpty() ? "" : "?" + query);
    HttpRequest.BodyPublisher content = body == null ? HttpRequest.BodyPublishers.noBody()
        : HttpRequest.BodyPublishers.ofByteArray(body);
    HttpRequest.Builder request = HttpRequest.newBuilder(URI.create(target)).timeout(REQUEST_TIMEOUT)
        .method(method, content);
    if (contentType != null) request.header("Content-Type", contentType);
    if (authorization != null) request.header("Authorization", authorization);
    HttpResponse<byte[]> response = client.send(request.build(), HttpResponse.BodyHandlers.ofByteArray());
    return new Reply(response.statusCode(), response.body());
  }
}
