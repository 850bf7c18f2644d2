package dev.tideline.writers;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** Builds search changes as writer_rows does (the same JSON fragments), for one table "orders". */
final class Changes {

  static final String ALIAS = "orders";
  static final String TOMBSTONES = "tideline-tombstones";
  static final String WATERMARKS = "tideline-watermarks";

  private final String rowId;
  private final Version version;
  private final Map<String, String> columns = new LinkedHashMap<>(); // column → raw JSON value
  private final boolean delete;
  private String target = ALIAS;
  private boolean moved;
  private String oldRowId;
  private List<String> unavailable = List.of();
  private boolean keepsObjects;
  private List<String> touches = List.of();
  private long offset;

  private Changes(String rowId, Version version, boolean delete) {
    this.rowId = rowId;
    this.version = version;
    this.delete = delete;
  }

  static Changes upsert(String rowId, long major, long minor) {
    return new Changes(rowId, new Version(major, minor), false);
  }

  static Changes delete(String rowId, long major, long minor) {
    return new Changes(rowId, new Version(major, minor), true);
  }

  /** A column of the document, its value as raw JSON. */
  Changes column(String name, String json) {
    columns.put(name, json);
    return this;
  }

  /** Unchanged-TOAST columns: their stored values are kept (the document carries them as null). */
  Changes keeping(String... names) {
    unavailable = List.of(names);
    for (String name : names) columns.putIfAbsent(name, "null");
    return this;
  }

  Changes keepsObjects() {
    keepsObjects = true;
    return this;
  }

  Changes target(String index) {
    target = index;
    return this;
  }

  Changes moved() {
    moved = true;
    return this;
  }

  Changes movedFrom(String oldId) {
    oldRowId = oldId;
    return this;
  }

  Changes touches(String... values) {
    touches = List.of(values);
    return this;
  }

  Changes offset(long kafkaOffset) {
    offset = kafkaOffset;
    return this;
  }

  SearchChange build() {
    String doc = delete ? null : source(version, columns, List.of());
    String partial = delete || unavailable.isEmpty() ? null : source(version, columns, unavailable);
    String tombDoc = "{\"alias\":\"" + ALIAS + "\",\"id\":\"" + rowId + "\"," + versionFields(version) + "}";
    return new SearchChange(new Origin("tideline.public.orders", 0, offset), moved, ALIAS, target, version, rowId,
        oldRowId, unavailable, keepsObjects, doc, partial, tombDoc, head(target, rowId), tombHead(rowId),
        oldRowId == null ? null : head(target, oldRowId), oldRowId == null ? null : tombHead(oldRowId), touches);
  }

  static String head(String index, String id) {
    return "\"_index\":\"" + index + "\",\"_id\":\"" + id + "\"";
  }

  static String tombHead(String id) {
    return head(TOMBSTONES, ALIAS + "/" + id);
  }

  /** A stored document's or tombstone's _source: the columns, then the version. */
  static String source(Version version, Map<String, String> columns, List<String> without) {
    List<String> fields = new ArrayList<>();
    columns.forEach((name, json) -> {
      if (!without.contains(name)) fields.add("\"" + name + "\":" + json);
    });
    fields.add(versionFields(version));
    return "{" + String.join(",", fields) + "}";
  }

  static String stored(long major, long minor, String columns) {
    return "{" + (columns.isEmpty() ? "" : columns + ",") + versionFields(new Version(major, minor)) + "}";
  }

  private static String versionFields(Version version) {
    return "\"tl_version_major\":" + version.major() + ",\"tl_version_minor\":" + version.minor();
  }
}
