"""The query API over the views (FastAPI): `create_app` in services.api.app, served by `tide api`."""
