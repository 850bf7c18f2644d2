package dev.tideline.writers;

import java.util.function.Supplier;

/** Creating Kafka clients inside Spark's executors. */
final class KafkaClients {
  private KafkaClients() {}

  /**
   * Creates a client with this module's class loader as the thread's context loader: Kafka loads its
   * plugin classes (serializers, SASL) through it, and a task's context loader may not have Kafka.
   */
  static <T> T create(Supplier<T> client) {
    Thread thread = Thread.currentThread();
    ClassLoader previous = thread.getContextClassLoader();
    thread.setContextClassLoader(KafkaClients.class.getClassLoader());
    try {
      return client.get();
    } finally {
      thread.setContextClassLoader(previous);
    }
  }
}
