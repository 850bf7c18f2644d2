"""The cluster profile (docs/cluster.md): the local stack's jobs on a Spark standalone cluster."""
