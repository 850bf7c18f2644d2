"""The apply driver's process around its queries: the Spark session and its scheduler pools, reused
column expressions, checkpoints, the JVM's keep-alive and restarts with back-off, which driver runs
which sink, the Python worker daemon, the control files `tide` writes, and pipeline.yaml reloads.
"""
