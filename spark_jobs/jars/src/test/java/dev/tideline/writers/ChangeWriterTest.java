package dev.tideline.writers;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

class ChangeWriterTest {

  private static Origin at(long offset) {
    return new Origin("tideline.public.orders", 0, offset);
  }

  @Test
  void aChunkShipsItsChangesAndPublishesEveryRecordThoseWithNothingToShipToo() throws Exception {
    List<ChangeWriter.Buffered<String>> chunk = List.of(new ChangeWriter.Buffered<>("update 10", at(10)),
        new ChangeWriter.Buffered<>(null, at(11)), new ChangeWriter.Buffered<>("delete 12", at(12)),
        new ChangeWriter.Buffered<>(null, at(13)));
    List<List<String>> shipped = new ArrayList<>();
    List<List<Origin>> published = new ArrayList<>();
    ChangeWriter.shipThenPublish(chunk, shipped::add, published::add);
    assertEquals(List.of(List.of("update 10", "delete 12")), shipped);
    assertEquals(List.of(List.of(at(10), at(11), at(12), at(13))), published);
  }

  @Test
  void aChunkOfTombstonesOnlyShipsNothingAndStillPublishesTheirPositions() throws Exception {
    List<List<String>> shipped = new ArrayList<>();
    List<List<Origin>> published = new ArrayList<>();
    ChangeWriter.shipThenPublish(List.of(new ChangeWriter.Buffered<String>(null, at(7))), shipped::add,
        published::add);
    assertEquals(List.of(), shipped);
    assertEquals(List.of(List.of(at(7))), published);
  }

  @Test
  void aFailedShipPublishesNothing() {
    List<List<Origin>> published = new ArrayList<>();
    assertThrows(IllegalStateException.class, () -> ChangeWriter.shipThenPublish(
        List.of(new ChangeWriter.Buffered<>("update 1", at(1))), rows -> {
          throw new IllegalStateException("store away");
        }, published::add));
    assertEquals(List.of(), published);
  }
}
