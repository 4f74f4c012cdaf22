# `make run` and `make test` bootstrap .venv themselves; re-running is quick once installed.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.iobench-installed

.PHONY: run test lint sysdeps sysdeps-run bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
	@# An editable install leaves our own modules without .pyc files, and where PYTHONDONTWRITEBYTECODE
	@# is set (as on these machines) every `iobench` process compiled all of them again at start-up.
	$(PY) -m compileall -q iobench formats checkpointing gds > /dev/null
	touch $(STAMP)

# The core install is small; `make run` and `make test` add the extras they use (see pyproject).
EXTRAS := s3,s3fast,server,parquet,hdf5,report,images,dev,mpi

sysdeps:
	@bash scripts/install-system-deps.sh

# fio only: Chromium renders reports in the tests, `make run` does not need it.
sysdeps-run:
	@IOBENCH_SYSDEPS=fio bash scripts/install-system-deps.sh

run: $(STAMP) sysdeps-run
	$(VENV)/bin/iobench run --out reports/latest

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

test: $(STAMP) sysdeps lint
	@$(PY) -m pytest -q -ra; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: the setup is broken" >&2; fi; exit $$rc

# Every benchmark against its peers (each writes reports/reference/NAME.json and NAME.rows.json),
# then one table of every ratio against its target (reports/reference/summary.md).
bench: $(STAMP) sysdeps
	$(PY) -m pip install -q -e '.[$(EXTRAS),s3crt]'   # the benchmarks' optional peers (AWS CRT S3 client)
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done
	@$(PY) benchmarks/summary.py

clean:
	rm -rf $(VENV) build *.egg-info reports/latest
