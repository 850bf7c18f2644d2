package dev.tideline.writers;

import static org.junit.jupiter.api.Assertions.fail;

import java.time.Duration;
import java.util.concurrent.locks.LockSupport;
import java.util.function.BooleanSupplier;

/** Polls a condition until it holds or the deadline passes: tests wait on outcomes, never on bare sleeps. */
final class Eventually {
  private Eventually() {}

  static void holds(String what, Duration within, BooleanSupplier condition) {
    long deadline = System.nanoTime() + within.toNanos();
    while (!condition.getAsBoolean()) {
      if (System.nanoTime() > deadline) fail(what + " did not happen within " + within);
      LockSupport.parkNanos(1_000_000);
    }
  }
}
