# README's two commands. Each runs the idempotent set-up first (a second when
# everything is in place), so a fresh clone needs nothing else.
#   make train                 the main job: 2 processes, Fashion-MNIST, the
#                              recipe fastest to 93% (flags/fashion_mnist_fast.cfg)
#   make train ARGS=--epochs=1 extra flags for engine.train
#   make test                  the test suite
#   make smoke                 2-process training checks alone (CI runs
#                              them on Python 3.13 too, .ci/run)
#   make smoke-next-tensorflow the same on the next TensorFlow (a venv of
#                              its own, .venv-next; BUILD.md, "The next
#                              TensorFlow")
#   make train PYTHON=python3.13
#                              set-up with another supported Python (3.11,
#                              3.12, 3.13); VENV=dir puts that venv elsewhere
#   make train DEVICE=gpu      any target on a GPU node: a venv of its own
#                              (.venv-gpu) with TensorFlow's CUDA build and
#                              Horovod with NCCL (BUILD.md, "GPUs"); train
#                              starts a process per GPU. NCCL=no builds
#                              Horovod without GPU collectives
DEVICE ?= cpu
ifeq ($(DEVICE),gpu)
VENV ?= .venv-gpu
# One process per GPU (none listed: 2, on the CPU).
GPUS := $(shell nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
PROCESSES ?= $(if $(filter-out 0,$(GPUS)),$(GPUS),2)
endif
PROCESSES ?= 2
FLAGFILE ?= flags/fashion_mnist_fast.cfg
ARGS ?=
VENV ?= .venv
export VENV PYTHON DEVICE NCCL

.PHONY: setup train test smoke smoke-next-tensorflow
setup:
	@bash scripts/setup.sh

train: setup
	TF_CPP_MIN_LOG_LEVEL=2 $(VENV)/bin/horovodrun --gloo -np $(PROCESSES) \
	  $(VENV)/bin/python -m engine.train --flagfile=$(FLAGFILE) $(ARGS)

# Most tests start a process or two; two pytest workers run the test files
# (one file each at a time, so a file's shared run is trained once) and a
# third the tests marked serial (they time signals and timeouts, or mount
# and make namespaces), one after another: those mostly wait, and the
# other two fill the cores meanwhile (tests/conftest.py).
test: setup
	$(VENV)/bin/python -m pytest -n 3 --dist loadgroup

SMOKE_CHECKS = tests/test_multiprocess.py -k \
  "identical_on_every_rank or exactly_the_full_test_sets or same_whole_epochs"
# Two processes train, then agree: identical weights on both ranks, every
# validation figure that of the whole test set, the same whole epochs.
smoke: setup
	$(VENV)/bin/python -m pytest $(SMOKE_CHECKS)

# The next TensorFlow before the pin moves: requirements.txt's pins with
# TensorFlow's replaced, in .venv-next, Horovod built against it with our
# patch, our CPU kernels compiled, then the smoke checks.
NEXT_TENSORFLOW ?= 2.22.0rc0
smoke-next-tensorflow:
	@mkdir -p .venv-next
	sed 's/^tensorflow-cpu==.*/tensorflow-cpu==$(NEXT_TENSORFLOW)/' \
	  requirements.txt > .venv-next/requirements.txt
	VENV=.venv-next REQUIREMENTS=.venv-next/requirements.txt bash scripts/setup.sh
	# A release candidate requires keras-nightly, which installs the same
	# `keras` package as our pin over it: our Keras alone, as pinned.
	.venv-next/bin/python -m pip uninstall --quiet --yes keras-nightly
	.venv-next/bin/python -m pip install --quiet --force-reinstall --no-deps \
	  "$$(grep '^keras==' requirements.txt)"
	.venv-next/bin/python -c "import keras, tensorflow as tf; \
	  print('TensorFlow', tf.__version__, 'Keras', keras.__version__)"
	.venv-next/bin/python -m pytest $(SMOKE_CHECKS)
