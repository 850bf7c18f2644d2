"""Tideline's apply side: PySpark Structured Streaming jobs that read the changelog from Kafka."""
