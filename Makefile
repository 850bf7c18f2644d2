# The two commands in the README: `make run` (install everything, bring the whole pipeline up
# with the demo data set: `tide up --demo`) and `make test` (install everything, run the test
# suite). Both are safe to run twice.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
TIDE := $(VENV)/bin/tide
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PG_MAJOR := $(shell python3 -c 'import tomllib;print(tomllib.load(open("pyproject.toml","rb"))["tool"]["tideline"]["versions"]["postgresql"])')
# The clients `tide up` prints lines for (psql, redis-cli, curl) are installed too; Chromium for the dashboard test;
# the Docker engine, Compose and debootstrap for the Docker route (`make images`, docs/docker.md).
DEBIAN_PACKAGES := postgresql-$(PG_MAJOR) postgresql-client-$(PG_MAJOR) redis-server redis-tools curl \
	openjdk-17-jdk-headless maven python3-venv docker.io docker-compose debootstrap chromium chromium-driver

.PHONY: run test setup system python jars env down clean images wheels

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

# The Docker route's image (docs/docker.md), built from what setup resolved here (the jars in .tideline/lib)
# and the locked Python wheels, on a Debian base made with debootstrap. Needs an engine that answers
# (docker/engine.sh start). Then `docker-compose up -d`. Every service runs the one image; postgres is the
# service that carries its build in docker-compose.yml.
images: setup wheels
	docker/base-image.sh
	docker-compose build postgres

wheels: .tideline/wheels/.built

# Every package of the lock whatever its marker says for this Python (the image runs Debian's 3.11.2, which
# needs async-timeout; a newer 3.11 does not); the lock is the whole tree, so no dependencies are resolved.
.tideline/wheels/.built: requirements.lock $(VENV)/.installed
	rm -rf .tideline/wheels
	$(PY) -m pip wheel -q --no-deps -r <(sed -E 's/[[:space:]]*;.*//' requirements.lock) -w .tideline/wheels
	touch $@

down:
	$(TIDE) down

clean:
	$(TIDE) stack down --purge
