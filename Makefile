# LazyKV Chat. The two commands a user needs: `make run` and `make test`.
# Every target sets up what is missing first: a venv, the patched engine (from
# the wheel cache, or built), the app, and the default/test models.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: run test test-fast setup engine native-tools hub-versions models app bench lint screenshots sysdeps clean-engine-build dist dist-check gpu-pack gpu-check vulkan-check

run: setup
	$(PY) -m lazykv $(ARGS)

# OMP_WAIT_POLICY=PASSIVE: engine threads sleep at barriers instead of spinning, so tests keep
# their pace when other processes share the cores (timings live in `make bench`, which spins).
# Two pytest-xdist workers, a test file per worker at a time, each engine context on one thread
# (tests/conftest.py): the suite waits on Qt, child processes and single-token decodes much of the
# time, so two workers keep both cores busy (TEST_JOBS=0 runs everything in this process)
TEST_JOBS ?= 2
test: setup native-tools hub-versions
	OMP_WAIT_POLICY=PASSIVE QT_QPA_PLATFORM=offscreen $(PY) -m pytest \
		$(if $(filter-out 0,$(TEST_JOBS)),-n $(TEST_JOBS) --dist loadfile) $(PYTEST_ARGS)

# everything but the real-model tests (marked slow in tests/conftest.py): under 2 minutes. Those
# tests mostly wait (Qt event loops, child processes, keyring time-outs), so they run in two
# pytest-xdist workers, a test file per worker at a time (FAST_JOBS=0 runs them in this process)
FAST_JOBS ?= 2
test-fast: setup native-tools
	OMP_WAIT_POLICY=PASSIVE QT_QPA_PLATFORM=offscreen $(PY) -m pytest -m "not slow" \
		$(if $(filter-out 0,$(FAST_JOBS)),-n $(FAST_JOBS) --dist loadfile) $(PYTEST_ARGS)

setup: sysdeps engine app models

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# the patched llama-cpp-python: cached wheel keyed by its inputs, else built
engine: | $(PY)
	$(PY) native/build.py ensure

# llama.cpp's test programs (its state suite on every architecture, tests/native): built once per
# patch series into $XDG_CACHE_HOME/lazykv/tools (minutes cold, instant warm)
native-tools: | $(PY)
	$(PY) native/build.py tools

# after the engine, so that pip finds the patched build already satisfying the pin
app: engine $(VENV)/.app-installed

$(VENV)/.app-installed: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e ".[test]"
	@touch $@

# huggingface_hub's oldest allowed release (pyproject.toml's lower bound) and its newest, beside the
# venv's own, for tests/core/models/test_hub_versions.py: the downloads run on both (no network in tests)
HUB_OLDEST := $(shell sed -n 's/^ *"huggingface_hub>=\([0-9.]*\)".*/\1/p' pyproject.toml)
hub-versions: $(VENV)/.hub-versions
$(VENV)/.hub-versions: pyproject.toml | $(PY)
	rm -rf $(VENV)/hub-oldest $(VENV)/hub-newest
	$(PY) -m pip install --quiet --target $(VENV)/hub-oldest "huggingface_hub==$(HUB_OLDEST).*"
	$(PY) -m pip install --quiet --target $(VENV)/hub-newest huggingface_hub
	@touch $@

models: | $(PY)
	$(PY) app/lazykv/core/models/model_fetch.py

# shared libraries Qt needs (offscreen and on X11), Xvfb and a window manager for the xcb tests,
# on Debian/Ubuntu, when missing
sysdeps:
	@sh tools/sysdeps.sh

bench: setup native-tools
	@sh tools/sysdeps.sh doc
	QT_QPA_PLATFORM=offscreen $(PY) -m bench
	QT_QPA_PLATFORM=offscreen $(PY) -m bench.gui_stall
	$(PY) -m bench.resume
	$(PY) -m bench.branches
	$(PY) -m bench.swa
	$(PY) -m bench.frontier
	$(PY) -m bench.server_restart
	$(PY) -m bench.store_cost
	$(PY) -m bench.turn_save_cost
	$(PY) -m bench.device
	$(PY) -m bench.plan_accuracy
	$(PY) -m bench.realistic
	$(MAKE) dist && QT_QPA_PLATFORM=offscreen $(PY) -m bench.startup

# the Linux bundle: dist/LazyKV-Chat-<version>-linux-<arch>.tar.gz (installers/README.md)
dist: setup $(VENV)/.dist-installed
	PY=$(PY) bash installers/linux/build.sh

# unpack it into a temp prefix, install, self-test the installed binary offscreen, start it on a
# real X display (Xvfb + openbox), uninstall
dist-check: dist
	bash installers/linux/dist_check.sh

$(VENV)/.dist-installed: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e ".[test,dist]"
	@touch $@

# the lazy cache on an NVIDIA GPU (native/README.md, "GPU check"): gpu-pack here (the patched sources,
# ~2 MB, into native/work/gpu), then gpu-check on the GPU machine: CUDA build for that GPU only, the
# lazy subset and the conversion benchmark, report in native/work/gpu/out/gpu-check.md (or $$OUT)
gpu-pack: engine
	bash native/gpu_check/pack.sh

gpu-check:
	bash native/gpu_check/gpu_check.sh

# the lazy cache on Vulkan, a second GPU API, on Mesa's lavapipe where there is no GPU: Debian's Vulkan
# packages, the Vulkan engine (cached; its own build dir; the CPU engine in .venv stays), then on the
# Vulkan device lazy_check, the ladder, a refused restore and the plan's accuracy; report in
# bench/results/vulkan_check.md (bench/vulkan_check.py). Not part of `make test`: its lazy_check alone
# takes many minutes on lavapipe
vulkan-check: setup
	@sh tools/sysdeps.sh vulkan
	$(PY) -m bench.vulkan_check

# the README's pictures: the real app on a private Xvfb display (offscreen without one), written to docs/
screenshots: setup
	$(PY) tools/screenshots.py

lint: app
	$(PY) -m ruff check app tests bench tools native/build.py

clean-engine-build:
	rm -rf native/work/build
