# Two commands: `make lab` opens the product, `make test` runs every test (`make eval`: the diagnosis scoreboard).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# CPU build of torch: a bare `torch` requirement would resolve to a multi-GB CUDA build on CPU machines.
TORCH_PIN ?= torch==2.13.0

.PHONY: lab test venv bench eval clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_PIN)" -e ".[jupyter,test,browser,lightning,transformers]"
	touch $@

venv: $(VENV)/.installed

lab: venv
	$(VENV)/bin/jupyter lab --allow-root notebooks/01_quickstart.ipynb

test: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest --cov --cov-report=term
	$(PY) -m pytest -p no:cacheprovider --nbval-lax --nbval-current-env notebooks/
	$(PY) -m pytest -p no:cacheprovider --nbval --nbval-current-env \
		--nbval-sanitize-with notebooks/nbval_sanitize.cfg notebooks/01_quickstart.ipynb
	$(VENV)/bin/bandit -q -r neuraldbg ndbg_jupyter -ll

# Speed: watched/bare ratios in a script (whole run and steady state), whole cells in a kernel, and
# a multi-process run.
bench: venv
	OMP_NUM_THREADS=1 $(PY) benchmarks/overhead.py
	OMP_NUM_THREADS=1 $(PY) benchmarks/notebook_cell.py
	$(PY) benchmarks/distributed.py

# The fault generator's runs scored against their expected verdicts (minutes on two cores).
eval: venv
	OMP_NUM_THREADS=1 $(PY) benchmarks/diagnosis.py
	OMP_NUM_THREADS=1 $(PY) benchmarks/perturbed_zoo.py

clean:
	rm -rf $(VENV) .pytest_cache .coverage htmlcov
