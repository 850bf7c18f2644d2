"""The source database's schema as Alembic revisions; applied by `services.db.migrate` (`tide db`)."""
