"""`tide db`: the application database's migrations (the code lives in the top-level `migrations` package)."""
