package dev.tideline.writers;

import java.util.function.Predicate;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Retries a call while the store is away (refused, reset, timed out), waiting longer each time, until
 * it succeeds or the thread is interrupted (Spark stopping the query). A store that is away must not
 * fail the query: the same call is sent again, so nothing is skipped and the order is kept. Any other
 * error is thrown at once.
 */
public final class Backoff {

  /** One attempt of the call. */
  @FunctionalInterface
  public interface Attempt<V> {
    V call() throws Exception;
  }

  /** How a wait is spent; a test passes one that records the delays. */
  @FunctionalInterface
  public interface Sleeper {
    void sleep(long millis) throws InterruptedException;
  }

  private static final Logger LOG = LoggerFactory.getLogger(Backoff.class);

  private final long firstMs;
  private final long maxMs;
  private final Predicate<Throwable> away;
  private final Sleeper sleeper;

  public Backoff(long firstMs, long maxMs, Predicate<Throwable> away, Sleeper sleeper) {
    this.firstMs = firstMs;
    this.maxMs = maxMs;
    this.away = away;
    this.sleeper = sleeper;
  }

  /** 0.5 s doubling to 30 s, sleeping for real. */
  public static Backoff standard(Predicate<Throwable> away) {
    return new Backoff(500, 30_000, away, Thread::sleep);
  }

  /** {@code attempt}'s result, after as many retries as the store's absence takes. */
  public <V> V call(String what, Attempt<V> attempt) throws Exception {
    long delay = firstMs;
    for (int failures = 1; ; failures++) {
      try {
        return attempt.call();
      } catch (InterruptedException e) {
        throw e;
      } catch (Exception e) {
        if (!away.test(e)) throw e;
        LOG.warn("{}: the store is away ({}), attempt {} failed; retrying in {} ms", what, e, failures, delay);
        sleeper.sleep(delay); // throws InterruptedException when the task is stopped
        delay = Math.min(maxMs, delay * 2);
      }
    }
  }

  /** {@link #call} for an attempt with no result. */
  public void run(String what, ChangeBuffer.Action attempt) throws Exception {
    call(what, () -> {
      attempt.run();
      return null;
    });
  }
}
