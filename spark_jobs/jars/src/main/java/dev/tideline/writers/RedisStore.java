package dev.tideline.writers;

import java.io.IOException;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.Callable;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.Function;
import redis.clients.jedis.ConnectionPoolConfig;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.Pipeline;
import redis.clients.jedis.RedisClient;
import redis.clients.jedis.Response;
import redis.clients.jedis.exceptions.JedisConnectionException;
import redis.clients.jedis.exceptions.JedisDataException;
import redis.clients.jedis.exceptions.JedisNoScriptException;
import redis.clients.jedis.params.ScanParams;
import redis.clients.jedis.resps.ScanResult;
import redis.clients.jedis.util.JedisURIHelper;

/**
 * The cache's Redis calls, as spark_jobs/sinks/redis/_ship.py's Shipper makes them: APPLY_BATCH over
 * many rows per EVALSHA, and a truncate (raise the watermark, prune what is below it). Connections
 * come from one pool per URL per JVM, so long-running tasks and each epoch's writer reuse sockets.
 */
public final class RedisStore {

  /** A Lua script and its SHA-1, the name EVALSHA calls it by (what SCRIPT LOAD returns). */
  public record Script(String source, byte[] sha) {
    public static Script of(String source) {
      try {
        byte[] digest = MessageDigest.getInstance("SHA-1").digest(source.getBytes(StandardCharsets.UTF_8));
        return new Script(source, HexFormat.of().formatHex(digest).getBytes(StandardCharsets.US_ASCII));
      } catch (NoSuchAlgorithmException e) {
        throw new IllegalStateException(e);
      }
    }
  }

  /** One truncate: the table's watermark key, its new version, and the SCAN patterns of its keys. */
  public record Truncate(String table, String watermark, long major, long minor, String rowPattern,
                         String rowPrefix, String tombstonePattern) {}

  private static final int CONNECT_TIMEOUT_MS = 10_000;
  // As the Python shipper's: a chunk of rows with aggregates can keep Redis busy for a while.
  private static final int SOCKET_TIMEOUT_MS = 120_000;
  private static final int SCAN_COUNT = 1000;
  private static final ConcurrentHashMap<String, RedisClient> CLIENTS = new ConcurrentHashMap<>();

  private final RedisClient client;
  private final Script apply;
  private final Script raiseWatermark;
  private final Script prune;
  private final byte[] rowMajor;
  private final byte[] rowMinor;

  public RedisStore(RedisClient client, Script apply, Script raiseWatermark, Script prune, String rowMajorField,
                    String rowMinorField) {
    this.client = client;
    this.apply = apply;
    this.raiseWatermark = raiseWatermark;
    this.prune = prune;
    this.rowMajor = bytes(rowMajorField);
    this.rowMinor = bytes(rowMinorField);
  }

  /** The JVM's pooled client for {@code url} (redis://[:password@]host:port/db), created on first use. */
  public static RedisClient client(String url) {
    return CLIENTS.computeIfAbsent(url, key -> {
      ConnectionPoolConfig pool = new ConnectionPoolConfig();
      // A writer holds one connection at a time (its flushes are serialised); a dozen tasks and their
      // flushers fit, and idle sockets stay open for the next epoch.
      pool.setMaxTotal(128);
      pool.setMaxIdle(128);
      pool.setJmxEnabled(false);
      URI uri = URI.create(key);
      DefaultJedisClientConfig config = DefaultJedisClientConfig.builder(uri) // password, database, TLS
          .connectionTimeoutMillis(CONNECT_TIMEOUT_MS).socketTimeoutMillis(SOCKET_TIMEOUT_MS).build();
      return RedisClient.builder().hostAndPort(JedisURIHelper.getHostAndPort(uri)).clientConfig(config)
          .poolConfig(pool).build();
    });
  }

  /**
   * Applies the rows (each its APPLY_BATCH arguments, count first), {@code chunkRows} rows per EVALSHA,
   * all chunks pipelined. Returns {row index in {@code rows}: reason} for the rows Redis refused.
   */
  public Map<Integer, String> apply(List<byte[][]> rows, int chunkRows) throws Exception {
    List<byte[][]> calls = new ArrayList<>();
    List<Integer> starts = new ArrayList<>();
    for (int start = 0; start < rows.size(); start += chunkRows) {
      List<byte[][]> chunk = rows.subList(start, Math.min(rows.size(), start + chunkRows));
      int total = 0;
      for (byte[][] args : chunk) total += args.length;
      byte[][] params = new byte[total][];
      int at = 0;
      for (byte[][] args : chunk) {
        System.arraycopy(args, 0, params, at, args.length);
        at += args.length;
      }
      calls.add(params);
      starts.add(start);
    }
    if (calls.isEmpty()) return Map.of();
    return refusals(guarded(() -> run(apply, 0, calls)), starts);
  }

  /**
   * Per create of a moved row (its APPLY_BATCH arguments): true when it need not wait for the move's
   * delete (KeyMoves), that is when any of the old key's tombstone or row, the new key's row or
   * tombstone, or the table's watermark holds its version or a newer one. One pipelined round trip.
   */
  public boolean[] settled(List<byte[][]> creates) throws Exception {
    byte[] major = bytes("major");
    byte[] minor = bytes("minor");
    return guarded(() -> {
      List<List<Response<List<byte[]>>>> reads = new ArrayList<>(creates.size());
      try (Pipeline pipeline = client.pipelined()) {
        for (byte[][] args : creates) {
          reads.add(List.of(pipeline.hmget(args[KeyMoves.FROM_TOMB], major, minor),
              pipeline.hmget(args[KeyMoves.FROM_ROW], rowMajor, rowMinor),
              pipeline.hmget(args[KeyMoves.ROW], rowMajor, rowMinor), pipeline.hmget(args[KeyMoves.TOMB], major, minor),
              pipeline.hmget(args[KeyMoves.MARK], major, minor)));
        }
        pipeline.sync();
      }
      boolean[] settled = new boolean[creates.size()];
      for (int c = 0; c < creates.size(); c++) {
        byte[][] args = creates.get(c);
        Version incoming = new Version(number(args[KeyMoves.MAJOR]), number(args[KeyMoves.MINOR]));
        for (Response<List<byte[]>> read : reads.get(c)) settled[c] |= !incoming.above(versionOf(read.get()));
      }
      return settled;
    });
  }

  /** A hash's version fields as HMGET returned them; (0, 0) when the key or a field is missing. */
  static Version versionOf(List<byte[]> fields) {
    return new Version(number(fields.get(0)), number(fields.get(1)));
  }

  private static long number(byte[] text) {
    return text == null ? 0 : (long) Double.parseDouble(text(text)); // Lua may store a version as a float
  }

  /**
   * Raises the table's watermark, then deletes its rows and tombstones below it (Shipper.truncate).
   * Pruning runs even when the watermark did not rise: a replayed truncate finishes a prune an earlier
   * attempt left half done. Any error reply throws; the epoch is replayed, and pruning is idempotent.
   */
  public void truncate(Truncate t) throws Exception {
    byte[] watermark = bytes(t.watermark());
    guarded(() -> {
      byte[][] raise = {watermark, bytes(Long.toString(t.major())), bytes(Long.toString(t.minor()))};
      failOnError(run(raiseWatermark, 1, List.<byte[][]>of(raise)));
      byte[] table = bytes(t.table());
      // A row leaves the aggregates as it goes, so the script needs its table and id.
      pruneMatching(t.rowPattern(), key -> new byte[][] {key, watermark, rowMajor, rowMinor, table,
          bytes(new String(key, StandardCharsets.UTF_8).substring(t.rowPrefix().length()))});
      // A tombstone below the watermark guards nothing the watermark does not: reclaim it.
      byte[] major = bytes("major");
      byte[] minor = bytes("minor");
      pruneMatching(t.tombstonePattern(), key -> new byte[][] {key, watermark, major, minor});
      return null;
    });
  }

  /** The rows refused in APPLY_BATCH replies ({index, reason} pairs, 1-based within their chunk), in order. */
  static Map<Integer, String> refusals(List<Object> replies, List<Integer> starts) {
    failOnError(replies);
    Map<Integer, String> refused = new TreeMap<>();
    for (int chunk = 0; chunk < replies.size(); chunk++) {
      for (Object entry : (List<?>) replies.get(chunk)) {
        List<?> pair = (List<?>) entry;
        int index = ((Number) pair.get(0)).intValue();
        refused.put(starts.get(chunk) + index - 1, text(pair.get(1)));
      }
    }
    return refused;
  }

  /**
   * True for a store that is away (refused, reset, timed out), still loading its data, or busy with a
   * script past its time limit: worth retrying. Any other error reply is an answer, not an absence.
   */
  public static boolean isAway(Throwable error) {
    for (Throwable t = error; t != null; t = t.getCause()) {
      if (t instanceof JedisConnectionException || t instanceof IOException) return true;
      if (t instanceof JedisDataException && t.getMessage() != null
          && (t.getMessage().startsWith("LOADING ") || t.getMessage().startsWith("BUSY "))) {
        return true;
      }
    }
    return false;
  }

  private void pruneMatching(String pattern, Function<byte[], byte[][]> call) {
    ScanParams params = new ScanParams().match(bytes(pattern)).count(SCAN_COUNT);
    byte[] cursor = ScanParams.SCAN_POINTER_START_BINARY;
    do {
      ScanResult<byte[]> page = client.scan(cursor, params);
      List<byte[][]> calls = new ArrayList<>();
      for (byte[] key : page.getResult()) calls.add(call.apply(key));
      if (!calls.isEmpty()) failOnError(run(prune, 2, calls));
      cursor = page.getCursorAsBytes();
    } while (!lastPage(cursor));
  }

  private static boolean lastPage(byte[] cursor) {
    return cursor.length == 1 && cursor[0] == '0'; // SCAN's last page returns cursor 0
  }

  /**
   * EVALSHA each call in one pipelined round trip; a reply is the script's result or its error. A
   * NOSCRIPT call did nothing, so when the server lost the script (restart, SCRIPT FLUSH) it is loaded
   * and every call sent again (the scripts' version guards make a repeat of an applied call a no-op).
   */
  private List<Object> run(Script script, int keyCount, List<byte[][]> calls) {
    for (int attempt = 0; attempt < 2; attempt++) {
      List<Response<Object>> responses = new ArrayList<>(calls.size());
      try (Pipeline pipeline = client.pipelined()) { // one pooled connection for the round trip
        for (byte[][] params : calls) responses.add(pipeline.evalsha(script.sha(), keyCount, params));
        pipeline.sync();
      }
      List<Object> results = new ArrayList<>(calls.size());
      boolean lost = false;
      for (Response<Object> response : responses) {
        try {
          results.add(response.get());
        } catch (JedisDataException e) {
          lost |= e instanceof JedisNoScriptException;
          results.add(e);
        }
      }
      if (!lost) return results;
      client.scriptLoad(script.source());
    }
    throw new JedisNoScriptException("script " + text(script.sha()) + " still missing after loading it");
  }

  private static void failOnError(List<Object> results) {
    for (Object result : results) {
      if (result instanceof JedisDataException e) throw e;
    }
  }

  private <V> V guarded(Callable<V> call) throws Exception {
    try {
      return call.call();
    } catch (JedisConnectionException e) {
      client.getPool().clear(); // after a restart every idle socket is dead: the retry should open a new one
      throw e;
    }
  }

  private static byte[] bytes(String text) {
    return text.getBytes(StandardCharsets.UTF_8);
  }

  private static String text(Object value) {
    return value instanceof byte[] raw ? new String(raw, StandardCharsets.UTF_8) : String.valueOf(value);
  }
}
