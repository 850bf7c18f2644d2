"""Capture: PostgreSQL's WAL → Debezium in Kafka Connect → one change topic per table.

- `objects`: the capture objects in the source database (CDC role, publication, replication slot);
- `source/`: the source database as Tideline sees it: preflight, what `tide init`/`tide tables` can capture;
- `connector/`: the Debezium connector at run time: registration, change topics, snapshots, slot safety;
- `connect/`: the Kafka Connect worker's configuration and its one JVM transform (Maven module).

The connector's configuration template is `connectors/tideline-postgres.json` (a top-level folder).
"""
