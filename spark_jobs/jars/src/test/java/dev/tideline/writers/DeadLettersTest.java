package dev.tideline.writers;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import org.apache.kafka.common.errors.TimeoutException;
import org.junit.jupiter.api.Test;

class DeadLettersTest {

  @Test
  void aLetterIsWhatPythonsDeadLetterEncodeWrites() {
    // The reason has quotes, a backslash pair, control characters, non-ASCII and a character past U+FFFF.
    String reason = "say \"hi\"\\\\ \n\t" + (char) 0x01 + " \u00e9 " + (char) 0x7f + " \uD83D\uDE00 /";
    byte[] letter = DeadLetters.encode("apply:cache", reason, new Origin("tideline.public.orders", 3, 42), 1234);
    // Printed by spark_jobs/dead_letters.py: DeadLetter("apply:cache", reason, topic, 3, 42, None, None).encode()
    // with time.time() = 1.234.
    assertEquals("{\"stage\": \"apply:cache\", \"reason\": \"say \\\"hi\\\"\\\\\\\\ \\n\\t\\u0001 \\u00e9 \\u007f "
        + "\\ud83d\\ude00 /\", \"topic\": \"tideline.public.orders\", \"partition\": 3, \"offset\": 42, "
        + "\"value\": null, \"dead_at_ms\": 1234}", new String(letter, StandardCharsets.US_ASCII));
  }

  @Test
  void lettersAreSentAndAwaited() throws Exception {
    List<String> sent = new CopyOnWriteArrayList<>();
    DeadLetters letters = new DeadLetters("apply:cache", letter -> {
      sent.add(new String(letter, StandardCharsets.UTF_8));
      return CompletableFuture.completedFuture(null);
    }, () -> 7L);
    letters.forward("{\"built\": \"in SQL\"}".getBytes(StandardCharsets.UTF_8));
    letters.refused(new Origin("t", 0, 5), "no");
    letters.awaitSent();
    assertEquals(List.of("{\"built\": \"in SQL\"}", "{\"stage\": \"apply:cache\", \"reason\": \"no\", \"topic\": \"t\", "
        + "\"partition\": 0, \"offset\": 5, \"value\": null, \"dead_at_ms\": 7}"), sent);
  }

  @Test
  void aLetterKafkaDidNotAcknowledgeFailsTheWait() {
    TimeoutException timeout = new TimeoutException("Expiring 1 record(s)");
    DeadLetters letters = new DeadLetters("apply:cache", letter -> CompletableFuture.failedFuture(timeout), () -> 7L);
    letters.refused(new Origin("t", 0, 5), "no");
    assertSame(timeout, assertThrows(TimeoutException.class, letters::awaitSent));
  }
}
