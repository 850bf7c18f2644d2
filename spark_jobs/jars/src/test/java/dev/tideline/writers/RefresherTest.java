package dev.tideline.writers;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicBoolean;
import org.junit.jupiter.api.Test;

class RefresherTest {

  private static final Duration DEADLINE = Duration.ofSeconds(5);

  @Test
  void manyMarksShareFewRefreshes() throws Exception {
    List<Set<String>> refreshes = new CopyOnWriteArrayList<>();
    Refresher refresher = new Refresher(refreshes::add, 200, "test-refresher");
    try {
      refresher.mark(List.of("orders"));
      Eventually.holds("the first refresh", DEADLINE, () -> refreshes.size() == 1);
      // Written while the refresher sleeps its interval: all of it goes in the next refresh.
      for (int chunk = 0; chunk < 100; chunk++) refresher.mark(List.of(chunk % 2 == 0 ? "orders" : "customers"));
      Eventually.holds("the second refresh", DEADLINE, () -> refreshes.size() == 2);
      assertEquals(List.of(Set.of("orders"), Set.of("customers", "orders")), refreshes);
    } finally {
      refresher.stop();
    }
  }

  @Test
  void aFailedRefreshIsTriedAgainWithWhatWasMarkedSince() throws Exception {
    List<Set<String>> refreshes = new CopyOnWriteArrayList<>();
    AtomicBoolean failed = new AtomicBoolean();
    Refresher refresher = new Refresher(indices -> {
      refreshes.add(indices);
      if (!failed.getAndSet(true)) throw new java.net.ConnectException("Connection refused");
    }, 1, "test-refresher");
    try {
      refresher.mark(List.of("orders"));
      Eventually.holds("the failed refresh", DEADLINE, failed::get);
      refresher.mark(List.of("customers"));
      Eventually.holds("the refresh again", DEADLINE, () -> {
        Set<String> all = new HashSet<>();
        refreshes.stream().skip(1).forEach(all::addAll);
        return all.containsAll(Set.of("orders", "customers"));
      });
      assertTrue(refreshes.get(0).contains("orders"));
    } finally {
      refresher.stop();
    }
  }

  @Test
  void nothingMarkedNothingRefreshed() throws Exception {
    List<Set<String>> refreshes = new CopyOnWriteArrayList<>();
    Refresher refresher = new Refresher(refreshes::add, 1, "test-refresher");
    refresher.mark(List.of());
    refresher.stop();
    assertEquals(List.of(), refreshes);
  }
}
