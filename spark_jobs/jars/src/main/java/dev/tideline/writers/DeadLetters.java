package dev.tideline.writers;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.function.LongSupplier;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.Producer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * One writer epoch's dead letters: the rows the store refused (built here, as Python's
 * {@code DeadLetter.encode} builds them, with no value) and the letters Spark SQL already built; and
 * the writer's other records on the same producer ({@link #send}, e.g. the search sink's touches).
 * Sends are asynchronous; {@link #awaitSent} waits until every one is acknowledged, which the writer
 * does before its epoch's offsets are committed. Nothing is dropped: a letter sent twice (a replayed
 * epoch) is recognisable by its origin.
 */
public final class DeadLetters {

  /** Sends one letter (the record's value; its key is null) to the dead-letter topic. */
  @FunctionalInterface
  public interface Transport {
    Future<?> send(byte[] letter);
  }

  /** Sends one record (its key is null) to any topic. */
  @FunctionalInterface
  public interface Sender {
    Future<?> send(String topic, byte[] value);
  }

  // One producer per bootstrap per executor JVM: every task's writer, every epoch, shares it.
  private static final ConcurrentHashMap<String, Producer<byte[], byte[]>> PRODUCERS = new ConcurrentHashMap<>();

  private final String stage;
  private final Transport transport;
  private final Sender others;
  private final LongSupplier clock;
  private final List<Future<?>> sent = new ArrayList<>();

  public DeadLetters(String stage, Transport transport, LongSupplier clock) {
    this(stage, transport, (topic, value) -> {
      throw new IllegalStateException("these dead letters send no other records");
    }, clock);
  }

  public DeadLetters(String stage, Transport transport, Sender others, LongSupplier clock) {
    this.stage = stage;
    this.transport = transport;
    this.others = others;
    this.clock = clock;
  }

  /**
   * Letters produced to {@code topic}, other records to theirs; the shared producer is created on the
   * first record only.
   */
  public static DeadLetters kafka(String bootstrap, String topic, String stage) {
    return new DeadLetters(stage, letter -> producer(bootstrap).send(new ProducerRecord<>(topic, null, letter)),
        (other, value) -> producer(bootstrap).send(new ProducerRecord<>(other, null, value)),
        System::currentTimeMillis);
  }

  /** A row the store refused, with its reason. */
  public void refused(Origin origin, String reason) {
    forward(encode(stage, reason, origin, clock.getAsLong()));
  }

  /** A letter built before the writer (a record that could not be decoded or was refused in SQL). */
  public void forward(byte[] letter) {
    track(transport.send(letter));
  }

  /** A record for another topic than the letters' (key null), awaited with them. */
  public void send(String topic, byte[] value) {
    track(others.send(topic, value));
  }

  private void track(Future<?> future) {
    synchronized (sent) {
      sent.add(future);
    }
  }

  /** Waits until every letter and record sent so far is acknowledged (acks=all); throws the first failure. */
  public void awaitSent() throws Exception {
    List<Future<?>> waiting;
    synchronized (sent) {
      waiting = new ArrayList<>(sent);
      sent.clear();
    }
    for (Future<?> future : waiting) {
      try {
        future.get();
      } catch (ExecutionException e) {
        throw e.getCause() instanceof Exception cause ? cause : e;
      }
    }
  }

  /** The letter's JSON, byte for byte what Python's json.dumps gives for DeadLetter.encode (value None). */
  public static byte[] encode(String stage, String reason, Origin origin, long deadAtMs) {
    StringBuilder json = new StringBuilder(128);
    json.append("{\"stage\": ");
    quote(json, stage);
    json.append(", \"reason\": ");
    quote(json, reason);
    json.append(", \"topic\": ");
    quote(json, origin.topic());
    json.append(", \"partition\": ").append(origin.partition());
    json.append(", \"offset\": ").append(origin.offset());
    json.append(", \"value\": null, \"dead_at_ms\": ").append(deadAtMs).append('}');
    return json.toString().getBytes(StandardCharsets.US_ASCII);
  }

  /** A JSON string as Python writes it (ensure_ascii): anything outside ' '..'~' as \\uXXXX, lower case. */
  static void quote(StringBuilder json, String text) {
    if (text == null) {
      json.append("null");
      return;
    }
    json.append('"');
    for (int i = 0; i < text.length(); i++) {
      char c = text.charAt(i);
      switch (c) {
        case '"' -> json.append("\\\"");
        case '\\' -> json.append("\\\\");
        case '\n' -> json.append("\\n");
        case '\r' -> json.append("\\r");
        case '\t' -> json.append("\\t");
        case '\b' -> json.append("\\b");
        case '\f' -> json.append("\\f");
        default -> {
          if (c >= ' ' && c <= '~') json.append(c);
          else json.append(String.format("\\u%04x", (int) c)); // a pair for characters past U+FFFF, as Python
        }
      }
    }
    json.append('"');
  }

  private static Producer<byte[], byte[]> producer(String bootstrap) {
    return PRODUCERS.computeIfAbsent(bootstrap, DeadLetters::newProducer);
  }

  private static Producer<byte[], byte[]> newProducer(String bootstrap) {
    Properties config = new Properties();
    config.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    config.put(ProducerConfig.ACKS_CONFIG, "all");
    config.put(ProducerConfig.LINGER_MS_CONFIG, "5");
    return KafkaClients.create(() -> new KafkaProducer<>(config, new ByteArraySerializer(), new ByteArraySerializer()));
  }
}
