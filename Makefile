# README's two commands. Each runs the idempotent set-up first (a second when
# everything is in place), so a fresh clone needs nothing else.
#   make train                 the main job: 2 processes, Fashion-MNIST, CPU preset
#   make train ARGS=--epochs=1 extra flags for engine.train
#   make test                  the test suite
PROCESSES ?= 2
FLAGFILE ?= flags/fashion_mnist_cpu.cfg
ARGS ?=

.PHONY: setup train test
setup:
	@bash scripts/setup.sh

train: setup
	TF_CPP_MIN_LOG_LEVEL=2 .venv/bin/horovodrun -np $(PROCESSES) \
	  .venv/bin/python -m engine.train --flagfile=$(FLAGFILE) $(ARGS)

test: setup
	.venv/bin/python -m pytest
