# Two commands do everything on a fresh machine:  `make demo`  and  `make test`.
# They create .venv, install torch first (TORCH=... to choose another build),
# then the package with its extras, then run.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
FBGEMM ?= fbgemm-gpu-cpu==1.8.0
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install -q

.PHONY: setup demo test test-fast experiments results clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) "$(TORCH)"
	$(PIP) -e ".[test]"
	-$(PIP) "$(FBGEMM)" || echo "fbgemm not installed: kernels fall back to torch.nn.EmbeddingBag"
	-$(PIP) --no-deps torchrec==1.8.0 && $(PIP) tensordict torchmetrics==1.0.3 pyre-extensions \
	  || echo "torchrec not installed: its planner baseline is skipped"
	touch $@

demo: setup
	$(VENV)/bin/neuroshard demo --out out/demo

# the whole suite (CI runs this: .ci/run)
test: setup
	$(PY) -m pytest tests

# about a minute: no gloo processes, no kernel timing, no TorchRec, nothing slow (markers: pyproject.toml)
test-fast: setup
	$(PY) -m pytest tests -m "not slow and not gloo and not timing and not torchrec"

# a quick look at every algorithm's plans, timed here (one 4-device task per family, a few minutes)
experiments: setup
	$(PY) experiments/plan_benchmark.py --quick --out out/plan_benchmark_quick

# docs/results.md from the stored results in experiments/results (seconds; nothing is timed)
results: setup
	$(PY) experiments/report.py

clean:
	rm -rf $(VENV) out
