package dev.tideline.writers;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.junit.jupiter.api.Test;

class KeyMovesTest {

  private static final long WAIT_MS = 100;

  /** A row's APPLY_BATCH arguments up to its kept count; {@code from} is the moved-from key or "". */
  private static byte[][] row(String key, String op, String from, int kept) {
    String[] args = {"11", key, "tomb:" + key, "mark", from, from.isEmpty() ? "" : "tomb:" + from, op, "6", "1",
        "products", key, Integer.toString(kept)};
    byte[][] bytes = new byte[args.length][];
    for (int i = 0; i < args.length; i++) bytes[i] = args[i].getBytes(StandardCharsets.UTF_8);
    return bytes;
  }

  private static String key(byte[][] args) {
    return new String(args[KeyMoves.ROW], StandardCharsets.UTF_8);
  }

  /** The store as the test moves it on: which moved-from keys hold the move's delete, and a clock. */
  private static final class Store {
    final Set<String> settledFrom = new HashSet<>();
    final List<List<String>> calls = new ArrayList<>();
    final List<Long> sleeps = new ArrayList<>();
    long clock;

    KeyMoves moves() {
      return moves(creates -> {
        boolean[] settled = new boolean[creates.size()];
        for (int c = 0; c < creates.size(); c++) {
          settled[c] = settledFrom.contains(new String(creates.get(c)[KeyMoves.FROM_ROW], StandardCharsets.UTF_8));
        }
        return settled;
      });
    }

    /** Moves reading the store through {@code reader}, sleeping on the test's clock. */
    KeyMoves moves(KeyMoves.Reader reader) {
      return new KeyMoves(reader, WAIT_MS, millis -> {
        sleeps.add(millis);
        clock += millis;
      }, () -> clock);
    }

    void applyAlone(KeyMoves moves, byte[][] row) throws Exception {
      moves.apply(List.<byte[][]>of(row), part -> {
        calls.add(part.stream().map(KeyMovesTest::key).toList());
        return Map.of();
      });
    }

    Map<Integer, String> apply(KeyMoves moves, List<byte[][]> rows, String refuse) throws Exception {
      return moves.apply(rows, part -> {
        calls.add(part.stream().map(KeyMovesTest::key).toList());
        // the other task applies the move's delete as soon as this one applied what came before
        settledFrom.add("products:1");
        return part.stream().anyMatch(args -> key(args).equals(refuse))
            ? Map.of(part.stream().map(KeyMovesTest::key).toList().indexOf(refuse), "refused") : Map.of();
      });
    }
  }

  @Test
  void aChunkWithoutMovedCreatesIsAppliedInOneCallWithoutReads() throws Exception {
    Store store = new Store();
    KeyMoves moves = new KeyMoves(creates -> {
      throw new AssertionError("nothing to read");
    }, WAIT_MS, millis -> {}, () -> 0L);
    List<byte[][]> rows = List.of(row("products:1", "u", "", 0), row("products:2", "m", "", 0),
        row("products:3", "u", "products:9", 0)); // a moved create that keeps nothing need not wait
    assertEquals(Map.of(), store.apply(moves, rows, ""));
    assertEquals(List.of(List.of("products:1", "products:2", "products:3")), store.calls);
  }

  @Test
  void aMovedCreateWaitsForTheOldKeysDeleteAfterTheOtherKeysAndBeforeLaterChangesOfItsKey() throws Exception {
    Store store = new Store();
    List<byte[][]> rows = List.of(row("products:7", "u", "", 0), row("products:101", "u", "products:1", 1),
        row("products:8", "u", "", 0), row("products:101", "u", "", 0), row("products:9", "d", "", 0));
    Map<Integer, String> refused = store.apply(store.moves(), rows, "products:9");
    assertEquals(List.of(List.of("products:7", "products:8", "products:9"), List.of("products:101", "products:101")),
        store.calls);
    assertEquals(Map.of(4, "refused"), refused, "a refusal names the row's index in the chunk");
    assertEquals(List.of(), store.sleeps, "settled by the time the other rows were applied: no poll");
  }

  @Test
  void aTaskWithNothingElseToApplyPollsUntilTheDeleteIsApplied() throws Exception {
    Store store = new Store();
    KeyMoves moves = store.moves(creates -> {
      if (store.clock >= 40) store.settledFrom.add("products:1");
      return new boolean[] {store.settledFrom.contains("products:1")};
    });
    store.applyAlone(moves, row("products:101", "u", "products:1", 1));
    assertEquals(List.of(20L, 20L), store.sleeps);
    assertEquals(List.of(List.of("products:101")), store.calls);
  }

  @Test
  void aCreateWhoseOldKeyNeverSettlesGoesAfterTheWait() throws Exception {
    Store store = new Store();
    store.applyAlone(store.moves(creates -> new boolean[creates.size()]), row("products:101", "u", "products:1", 2));
    assertEquals(List.of(List.of("products:101")), store.calls);
    assertEquals(WAIT_MS, store.sleeps.stream().mapToLong(Long::longValue).sum());
    assertTrue(KeyMoves.keepsFromOldKey(row("products:101", "u", "products:1", 2)));
  }
}
