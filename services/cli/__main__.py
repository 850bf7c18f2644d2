"""`python -m services.cli`: the `tide` command, as the API's server process and the tests run it."""

from services.cli import app

app()
