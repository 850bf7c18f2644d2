"""The source database as Tideline sees it: preflight checks, the capture objects it needs (stated one
by one, or written out as SQL for a DBA), and the tables `tide init` and `tide tables` can capture.

The same code serves Tideline's own PostgreSQL (the demo) and one the user brings (TIDE_POSTGRES_URL):
what differs is only who owns the tables, and so what Tideline may do to them (never alter them).
"""
