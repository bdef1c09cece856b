# LazyKV Chat. The two commands a user needs: `make run` and `make test`.
# Every target sets up what is missing first: a venv, the patched engine (from
# the wheel cache, or built), the app, and the default/test models.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: run test setup engine models app bench lint screenshots sysdeps clean-engine-build

run: setup
	$(PY) -m lazykv $(ARGS)

test: setup
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest $(PYTEST_ARGS)

setup: sysdeps engine app models

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# the patched llama-cpp-python: cached wheel keyed by its inputs, else built
engine: | $(PY)
	$(PY) native/build.py ensure

# after the engine, so that pip finds the patched build already satisfying the pin
app: engine $(VENV)/.app-installed

$(VENV)/.app-installed: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e ".[test]"
	@touch $@

models: | $(PY)
	$(PY) app/lazykv/core/model_fetch.py

# shared libraries Qt needs even offscreen, on Debian/Ubuntu, when missing
sysdeps:
	@sh tools/sysdeps.sh

bench: setup
	QT_QPA_PLATFORM=offscreen $(PY) -m bench
	QT_QPA_PLATFORM=offscreen $(PY) -m bench.gui_stall
	$(PY) -m bench.resume

# the README's pictures: the real app offscreen, written to docs/
screenshots: setup
	QT_QPA_PLATFORM=offscreen $(PY) tools/screenshots.py

lint: app
	$(PY) -m ruff check app tests bench tools native/build.py

clean-engine-build:
	rm -rf native/work/build
