# Two entry points: `make demo` (set up, then a streamed speculative generation on the built-in
# default model with its shipped draft head, compared with the target alone) and `make test` (set up, then the full suite).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
DEMO_PROMPT ?= Summarise in two sentences: speculative decoding lets a cheap drafter propose several tokens that the target model verifies in one forward pass, keeping the longest agreeing prefix. The output is exactly what the target alone would write, only faster, because decoding is bound by memory traffic rather than arithmetic.

.PHONY: setup demo test clean

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
	$(BIN)/quickdraft generate --chat --compare --drafter head --max-new-tokens 96 "$(DEMO_PROMPT)"

test: $(INSTALLED)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV)
