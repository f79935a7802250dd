# Each target creates .venv with pip when missing and installs the project into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: demo test bench zoo compat fuzz lint clean

# executorch 1.4.0 (the last release with the MPS delegate runtime) for the runtime compatibility matrix:
# only its package (116 MB, --no-deps) in a folder put first on PYTHONPATH, beside the torch 2.14.1 of .venv
# (which satisfies its torch>=2.13); a second venv would hold a second 5.5 GB torch
COMPAT_DIR   := .runtime-et1.4
COMPAT_STAMP := $(COMPAT_DIR)/.installed-stamp

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test,llm,model-explorer]'
	@touch $(STAMP)

demo: $(STAMP)  ## export the built-in demo model to out/mps_demo.pte and verify it in the device model
	@mkdir -p out
	$(BIN)/mps-backend export --verify -o out/mps_demo.pte

$(COMPAT_STAMP): $(STAMP)
	$(BIN)/pip install -q --disable-pip-version-check --no-deps --target $(COMPAT_DIR) executorch==1.4.0
	@touch $(COMPAT_STAMP)

test: $(STAMP) $(COMPAT_STAMP)  ## the whole test suite (with the executorch 1.4.0 runtime for the compatibility matrix)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(STAMP)  ## every benchmark in benchmarks/ (ratios to yardsticks measured in the same run); exit 1 on a missed target
	$(BIN)/python benchmarks/run.py

ZOO_ARGS ?=
zoo: $(STAMP)  ## the full model zoo, fp32 and fp16, one subprocess per model: writes docs/model-zoo.md, exit 1 on a missed target
	$(BIN)/python -m mps_backend.zoo --out docs/model-zoo.md $(ZOO_ARGS)

compat: $(STAMP) $(COMPAT_STAMP)  ## programs written here, read by executorch 1.4.0's runtime: writes docs/runtime-compat.md
	MPS_BACKEND_COMPAT_REPORT=docs/runtime-compat.md $(BIN)/python -m pytest -q tests/test_runtime_matrix.py

fuzz: $(STAMP)  ## 100,000 mutated .pte files through check/inspect/run, each worker under an address-space limit; crashes saved as regression files
	$(BIN)/python -m mps_backend.testing.fuzz_pte --cases 100000 --seed $${SEED:-1} --crash-dir tests/fixtures/fuzz-regressions

lint: $(STAMP)  ## ruff (pyflakes, pycodestyle, import order, bugbear; config in pyproject.toml); tests/test_lint.py runs it too
	$(BIN)/ruff check .

clean:
	rm -rf out build *.egg-info .pytest_cache
