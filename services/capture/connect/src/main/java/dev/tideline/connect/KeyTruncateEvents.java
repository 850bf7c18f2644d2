package dev.tideline.connect;

import java.util.Map;

import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.connector.ConnectRecord;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.data.SchemaBuilder;
import org.apache.kafka.connect.data.Struct;
import org.apache.kafka.connect.transforms.Transformation;

/**
 * Gives Debezium's truncate events (op "t") a key: {"truncate": "<table>"}.
 *
 * <p>Why: a truncate event has no key, and a compacted topic rejects keyless records, which
 * kills the connector task. Keeping one key per table is enough for compaction to stay honest:
 * the newest truncate of a table subsumes older ones, because consumers apply a truncate as
 * "delete every row whose version is below the truncate's commit version", not by arrival order.
 * Every other record passes through untouched.
 */
public class KeyTruncateEvents<R extends ConnectRecord<R>> implements Transformation<R> {

    static final Schema KEY_SCHEMA = SchemaBuilder.struct()
            .name("dev.tideline.TruncateKey")
            .field("truncate", Schema.STRING_SCHEMA)
            .build();

    @Override
    public R apply(R record) {
        if (record.key() != null || !(record.value() instanceof Struct value) || !isTruncate(value)) {
            return record;
        }
        Struct key = new Struct(KEY_SCHEMA).put("truncate", value.getStruct("source").getString("table"));
        return record.newRecord(record.topic(), record.kafkaPartition(), KEY_SCHEMA, key,
                record.valueSchema(), record.value(), record.timestamp(), record.headers());
    }

    private static boolean isTruncate(Struct value) {
        return value.schema().field("op") != null && "t".equals(value.getString("op"))
                && value.schema().field("source") != null;
    }

    @Override
    public ConfigDef config() {
        return new ConfigDef();
    }

    @Override
    public void configure(Map<String, ?> configs) {
    }

    @Override
    public void close() {
    }
}
