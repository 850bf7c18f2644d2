package dev.tideline.writers;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;

class WriterTimesTest {

  private static final Pattern STEP = Pattern.compile("(\\S+ \\S+) n=(\\d+) p50=([\\d.]+)ms p99=([\\d.]+)ms max=([\\d.]+)ms");

  @Test
  void aStepSummarisesItsSamplesOnceThenStartsAgain() {
    WriterTimes.drain(); // steps other tests recorded
    for (int ms = 1; ms <= 100; ms++) WriterTimes.record("test step", ms * 1_000_000L);
    Matcher summary = STEP.matcher(WriterTimes.drain());
    assertTrue(summary.matches(), summary.toString());
    assertEquals("test step", summary.group(1));
    assertEquals("100", summary.group(2));
    assertEquals(51.0, Double.parseDouble(summary.group(3)));
    assertEquals(100.0, Double.parseDouble(summary.group(4)));
    assertEquals(100.0, Double.parseDouble(summary.group(5)));
    assertEquals("", WriterTimes.drain());
  }

  @Test
  void beyondTheKeptSamplesEverySampleIsCountedAndTheMaximumKept() {
    WriterTimes.drain();
    int count = WriterTimes.KEPT * 3;
    for (int i = 0; i < count; i++) WriterTimes.record("many samples", 1_000_000L);
    WriterTimes.record("many samples", 9_000_000L);
    Matcher summary = STEP.matcher(WriterTimes.drain());
    assertTrue(summary.matches(), summary.toString());
    assertEquals(String.valueOf(count + 1), summary.group(2));
    assertEquals(1.0, Double.parseDouble(summary.group(3)));
    assertEquals(9.0, Double.parseDouble(summary.group(5)));
  }

  @Test
  void aTimedBufferRecordsHowLongItsChunksWaitedAndShipped() throws Exception {
    WriterTimes.drain();
    ChangeBuffer<Integer> buffer = new ChangeBuffer<>(100, 3_600_000, rows -> Thread.sleep(20), "test-timed",
        "test buffer");
    buffer.add(1);
    buffer.add(2);
    buffer.close();
    String line = WriterTimes.drain();
    assertTrue(line.contains("test buffer ship n=1 "), line);
    assertTrue(line.contains("test buffer wait n=1 "), line);
    Matcher ship = Pattern.compile("test buffer ship n=1 p50=([\\d.]+)ms").matcher(line);
    assertTrue(ship.find(), line);
    assertTrue(Double.parseDouble(ship.group(1)) >= 20.0, line);
  }

  @Test
  void elasticsearchRequestsAreNamedByTheirEndpoint() {
    assertEquals("_bulk", Elastic.endpoint("/_bulk"));
    assertEquals("_refresh", Elastic.endpoint("/a,b/_refresh"));
    assertEquals("other", Elastic.endpoint("/index/_doc/42"));
  }
}
