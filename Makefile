# Two entry points: `make demo` (set up, then a streamed speculative generation on the built-in
# default model with its default drafters, n-gram lookup and its corpus table under --k auto, compared with the target alone) and `make test` (set up, install Debian's Chromium for the
# playground's browser tests, lint and format check, then the full suite). `make mutants` (deliberate bugs the suite must catch) runs in CI after `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
DEMO_PROMPT ?= Rewrite this paragraph in the past tense: Every morning I walk to the market. I buy fresh bread, cheese and fruit. I talk with the baker about the weather and the news. Then I walk home along the river, watch the boats, and cook breakfast for my family.

.PHONY: setup browser demo lint test mutants clean

setup: $(INSTALLED)

# torch is pinned to 2.13.0 (the CPU wheel); installed first so nothing pulls a CUDA build.
$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[test]"
	touch $@

demo: $(INSTALLED)
	$(BIN)/quickdraft models fetch smollm2-135m-instruct
	$(BIN)/quickdraft generate --chat --compare --max-new-tokens 96 "$(DEMO_PROMPT)"

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

browser:
	scripts/install_browser.sh

test: lint browser
	$(BIN)/python -m pytest -q

# Deliberate bugs, one at a time: the tests that guard each promise must fail (docs/testing.md).
mutants: $(INSTALLED)
	$(BIN)/python scripts/mutants.py

clean:
	rm -rf $(VENV)
