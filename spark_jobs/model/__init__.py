"""What the pipeline is, free of pyspark: pipeline.yaml (`config`), the job settings (`settings`), the
sinks each declared once (`sink_registry`), the source's column types (`catalogue`), aggregates,
event-time windows and SCD2 columns, and the errors' root (`errors`). `services` and `migrations` read
these without starting a JVM; it imports nothing else of the project (tests/unit/test_import_cycles.py).
"""
