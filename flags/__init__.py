"""The engine's command-line flags, one module per concern.

Importing this package defines them all. `--helpfull` lists them grouped by
these modules: flags.data, flags.model, flags.optimization, flags.training,
flags.devices. Their defaults are the CPU preset (flags/fashion_mnist_cpu.cfg):
with no flags at all, the engine trains a small CNN on Fashion-MNIST to over
90% test accuracy in minutes.
"""
from flags import data, devices, model, optimization, training  # noqa: F401
