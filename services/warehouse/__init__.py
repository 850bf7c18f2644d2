"""`tide warehouse ...`: maintenance of the Delta sinks' tables (warehouse and analytics)."""
