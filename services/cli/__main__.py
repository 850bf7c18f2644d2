"""`python -m services.cli`: the `tide` command, as the API's server process and the tests run it."""

from services.cli import app

if __name__ == "__main__":  # importing this module (tests/unit/test_errors.py walks every one) runs nothing
    app()
