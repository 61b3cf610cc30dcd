# README's two commands. Each runs the idempotent set-up first (a second when
# everything is in place), so a fresh clone needs nothing else.
#   make train                 the main job: 2 processes, Fashion-MNIST, the
#                              recipe fastest to 93% (flags/fashion_mnist_fast.cfg)
#   make train ARGS=--epochs=1 extra flags for engine.train
#   make test                  the test suite
PROCESSES ?= 2
FLAGFILE ?= flags/fashion_mnist_fast.cfg
ARGS ?=

.PHONY: setup train test
setup:
	@bash scripts/setup.sh

train: setup
	TF_CPP_MIN_LOG_LEVEL=2 .venv/bin/horovodrun --gloo -np $(PROCESSES) \
	  .venv/bin/python -m engine.train --flagfile=$(FLAGFILE) $(ARGS)

# Most tests start a process or two on one core each, so two pytest workers
# (one test file each) keep both cores busy; the tests marked serial (they
# time signals and timeouts, or mount and make namespaces) run after them,
# alone. Both phases run; either failing fails the target.
test: setup
	@status=0; \
	.venv/bin/python -m pytest -n 2 --dist loadfile -m "not serial" || status=$$?; \
	.venv/bin/python -m pytest -m serial || status=$$?; \
	exit $$status
