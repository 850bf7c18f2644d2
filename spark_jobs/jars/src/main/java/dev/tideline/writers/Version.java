package dev.tideline.writers;

/**
 * A change's version, (major, minor) = (commit LSN, change LSN), compared lexicographically: the order
 * every guard of the search sink decides by. A version Elasticsearch does not hold reads as {@link #ZERO}.
 */
public record Version(long major, long minor) implements Comparable<Version> {

  public static final Version ZERO = new Version(0, 0);

  @Override
  public int compareTo(Version other) {
    int byMajor = Long.compare(major, other.major);
    return byMajor != 0 ? byMajor : Long.compare(minor, other.minor);
  }

  /** This version is strictly newer than {@code other}. */
  public boolean above(Version other) {
    return compareTo(other) > 0;
  }

  public static Version max(Version a, Version b) {
    return a.compareTo(b) >= 0 ? a : b;
  }

  @Override
  public String toString() {
    return "(" + major + ", " + minor + ")";
  }
}
