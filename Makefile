# The two commands in the README: `make run` (install everything, bring the whole pipeline up
# with the demo data set: `tide up --demo`) and `make test` (install everything, run the test
# suite). Both are safe to run twice.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
TIDE := $(VENV)/bin/tide
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PG_MAJOR := $(shell python3 -c 'import tomllib;print(tomllib.load(open("pyproject.toml","rb"))["tool"]["tideline"]["versions"]["postgresql"])')
# The clients `tide up` prints lines for (psql, redis-cli, curl) are installed too; Chromium for the dashboard test.
DEBIAN_PACKAGES := postgresql-$(PG_MAJOR) postgresql-client-$(PG_MAJOR) redis-server redis-tools curl \
	openjdk-17-jdk-headless maven python3-venv docker-compose chromium chromium-driver

.PHONY: run test setup system python jars env down clean

run: setup
	$(TIDE) up --demo

test: setup
	$(VENV)/bin/pytest

setup: system python env jars

# Debian packages: install only what is missing (apt-get update once, only then).
system:
	@missing=$$(for p in $(DEBIAN_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages: $$missing"; \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q $$missing; \
	fi

python: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml requirements.lock
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps -e .
	touch $@

# Secrets live in .env (git-ignored); a first run generates random ones.
env: .env

.env:
	python3 -c 'import re,secrets,sys;sys.stdout.write(re.sub("(?m)(?<==)CHANGE_ME$$",lambda m:secrets.token_hex(16),open(".env.example").read()))' > .env
	chmod 600 .env

jars: python
	$(TIDE) stack fetch

down:
	$(TIDE) down

clean:
	$(TIDE) stack down --purge
