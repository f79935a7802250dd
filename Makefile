# Each target creates .venv with pip when missing and installs the project into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: demo test bench zoo clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test,llm,model-explorer]'
	@touch $(STAMP)

demo: $(STAMP)  ## export the built-in demo model to out/mps_demo.pte and verify it in the device model
	@mkdir -p out
	$(BIN)/mps-backend export --verify -o out/mps_demo.pte

test: $(STAMP)  ## the whole test suite
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: $(STAMP)  ## every benchmark in benchmarks/ (ratios to yardsticks measured in the same run); exit 1 on a missed target
	$(BIN)/python benchmarks/run.py

ZOO_ARGS ?=
zoo: $(STAMP)  ## the full model zoo, fp32 and fp16, one subprocess per model: writes docs/model-zoo.md, exit 1 on a missed target
	$(BIN)/python -m mps_backend.zoo --out docs/model-zoo.md $(ZOO_ARGS)

clean:
	rm -rf out build *.egg-info .pytest_cache
