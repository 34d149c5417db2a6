# Two entry points: `make demo` (train PPO on CartPole) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test fuzz lint format venv clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[torch,jax,dev,graphopt,train,onnx,envpool,mujoco,ray,gymnax]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/recurrences.py
	$(BIN)/timerl train ppo --env CartPole-v1 --steps 150000 --log-dir runs/demo-ppo-cartpole --overwrite

test: $(STAMP)
	$(BIN)/ruff check timerl tests bench examples
	$(BIN)/ruff format --check timerl tests bench examples
	$(BIN)/python -m pytest -n 2 tests

# the differential fuzzer at 2,000 programs, each on numpy, torch and jax (the default suite
# runs 400); SEED=n draws another set of programs than the suite's
fuzz: $(STAMP)
	TIMERL_FUZZ_EXAMPLES=2000 TIMERL_FUZZ_SEED=$(SEED) $(BIN)/python -m pytest -n 2 tests/fuzz

lint: $(STAMP)
	$(BIN)/ruff check timerl tests bench examples

format: $(STAMP)
	$(BIN)/ruff format timerl tests bench examples
	$(BIN)/ruff check --fix timerl tests bench examples

clean:
	rm -rf $(VENV) build *.egg-info
