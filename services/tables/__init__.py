"""`tide tables add | remove`: change which tables are captured while everything runs, in one command
(pipeline.yaml, publication, connector, the running queries, the snapshot of existing rows)."""
