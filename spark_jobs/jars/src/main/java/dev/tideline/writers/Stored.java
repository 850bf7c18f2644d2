package dev.tideline.writers;

import com.fasterxml.jackson.databind.JsonNode;

/**
 * A document as one {@code _mget} entry read it: found or not, its version (the two version fields of
 * its {@code _source}, absent as 0), its {@code _source} as far as it was asked for, and the
 * compare-and-set token ({@code _seq_no}, {@code _primary_term}) a write of it must carry.
 */
record Stored(boolean found, Version version, JsonNode source, long seqNo, long primaryTerm) {

  static final Stored ABSENT = new Stored(false, Version.ZERO, null, -1, -1);

  /** An entry of an {@code _mget} answer that has no {@code error} (the caller checked). */
  static Stored of(JsonNode hit, String majorField, String minorField) {
    if (!hit.path("found").asBoolean(false)) return ABSENT;
    JsonNode source = hit.path("_source");
    Version version = new Version(source.path(majorField).asLong(0), source.path(minorField).asLong(0));
    return new Stored(true, version, source, hit.path("_seq_no").asLong(), hit.path("_primary_term").asLong());
  }

  /** The bulk action's compare-and-set fields, a fragment that follows the head. */
  String cas() {
    return ",\"if_seq_no\":" + seqNo + ",\"if_primary_term\":" + primaryTerm;
  }

  /** The {@code image} a moved delete left in this tombstone: the row as it was just before the move. */
  JsonNode image() {
    JsonNode image = found ? source.path("image") : null;
    return image != null && image.isObject() ? image : Elastic.JSON.createObjectNode();
  }

  /** The document's {@code _source} (empty when not found). */
  JsonNode sourceOrEmpty() {
    return found && source.isObject() ? source : Elastic.JSON.createObjectNode();
  }
}
