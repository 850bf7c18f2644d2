"""The lines `tide up` prints are built from the settings and pipeline.yaml, and never hold a secret."""

from services.settings import StackSettings
from services.up.usage import EXAMPLE_INSERT, sections
from spark_jobs.model.config import load


def _commands(settings: StackSettings, env_file) -> list[str]:
    return [command for section in sections(settings, load(), env_file) for command in section.commands]


def test_every_line_carries_the_real_ports_user_and_database_and_no_password(tmp_path):
    env_file = tmp_path / ".env"
    env_file.write_text("TIDE_POSTGRES_PASSWORD=s3cret\n")
    settings = StackSettings(host="127.0.0.1", postgres_port=15432, redis_port=16379, api_port=18000,
                             postgres_user="ada", postgres_db="shop", postgres_password="s3cret", job_redis_db=4)
    commands = _commands(settings, env_file)
    assert commands[:3] == [
        f"source {env_file}",
        'PGPASSWORD="$TIDE_POSTGRES_PASSWORD" psql -h 127.0.0.1 -p 15432 -U ada shop',
        EXAMPLE_INSERT,
    ]
    assert [c.split("   #")[0] for c in commands[3:]] == [
        "curl -s 'http://127.0.0.1:18000/search/customers?q=ada'",
        "curl -s http://127.0.0.1:18000/cache/customers/1",
        "curl -s 'http://127.0.0.1:18000/warehouse/customers?limit=5'",
        "redis-cli -h 127.0.0.1 -p 16379 -n 4 HGETALL customers:1",
    ]
    assert not any("s3cret" in command for command in commands)


def test_without_an_env_file_the_password_is_expected_in_the_shell(tmp_path):
    commands = _commands(StackSettings(host="127.0.0.1", redis_port=16379, job_redis_db=0), tmp_path / "absent.env")
    assert not any(command.startswith("source ") for command in commands)
    assert commands[0].startswith('PGPASSWORD="$TIDE_POSTGRES_PASSWORD" psql ')
    assert any(command.startswith("redis-cli -h 127.0.0.1 -p 16379 HGETALL") for command in commands)


def test_with_your_own_database_the_lines_use_its_url_and_your_first_table(tmp_path):
    from spark_jobs.model.config import PipelineConfig

    pipeline = PipelineConfig.model_validate({"tables": {"accounts": {"search": {}, "cache": {}, "warehouse": {}}}})
    settings = StackSettings(host="127.0.0.1", api_port=18000, postgres_url="postgresql://app:pw@db:5432/shop")
    commands = [c for section in sections(settings, pipeline, tmp_path / "absent.env") for c in section.commands]
    assert [c.split("   #")[0] for c in commands] == [
        'psql "$TIDE_POSTGRES_URL"',
        "curl -s 'http://127.0.0.1:18000/search/accounts?size=1'",
        "curl -s 'http://127.0.0.1:18000/warehouse/accounts?limit=5'",
        "# cache view: curl -s http://127.0.0.1:18000/cache/accounts/<primary key>",
    ]
    assert not any("pw" in command.split("   #")[0].replace("psql", "") for command in commands)
