package dev.tideline.writers;

import java.util.List;

/**
 * One change for the search sink (a writer row of kind "row"), as Spark SQL built it
 * (spark_jobs/sinks/elasticsearch/_documents.py, writer_rows): its version, the prebuilt JSON of its
 * documents and of the request fragments naming them, and what to produce once it is applied.
 *
 * @param origin the Kafka record it came from (its dead letter names it)
 * @param alias the name users query; {@code target} the physical index written (a rebuild's new index)
 * @param rowId the document id; {@code oldRowId} the old key of a primary-key move (on its create only)
 * @param unavailable unchanged-TOAST columns: their stored value is kept
 * @param keepsObjects a json column is among the kept ones: an update would merge it, so write it whole
 * @param doc the whole {@code _source}; null for a delete
 * @param partial {@code _source} without the unavailable columns (null unless doc and unavailable are)
 * @param tombDoc the tombstone's {@code _source}
 * @param head {@code "_index":"<target>","_id":"<row id>"}; {@code tombHead} the same in the tombstones
 * @param oldHead {@code oldTombHead}: the same for {@code oldRowId} (null without one)
 * @param touches record values for the touches topic, produced once the change is applied
 */
public record SearchChange(Origin origin, boolean moved, String alias, String target, Version version, String rowId,
                           String oldRowId, List<String> unavailable, boolean keepsObjects, String doc,
                           String partial, String tombDoc, String head, String tombHead, String oldHead,
                           String oldTombHead, List<String> touches) {

  public boolean upsert() {
    return doc != null;
  }

  /** Stored columns to keep (has_keep of the Python shipper: in Real-Time Mode nothing is filled). */
  public boolean hasKeep() {
    return !unavailable.isEmpty();
  }

  /** The bulk action's {@code require_alias}: a write meant for the alias must not create an index. */
  String aliasOnly() {
    return target.equals(alias) ? ",\"require_alias\":true" : "";
  }
}
