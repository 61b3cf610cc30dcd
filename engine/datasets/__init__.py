"""Data sets by name: each loader returns its splits and what the model needs.

A loader returns raw examples, uint8 images and int64 labels, and the
statistics to normalize them; sharding, shuffling, augmentation and batching
are the input pipeline's job (`engine/data.py`). In-memory data sets return
`Examples`; data sets too large for memory return `RecordFiles`, read by the
pipeline file by file. Loaders declare the options they take in their
signatures and receive only those (engine/registry.py).
"""
from engine.datasets import cifar10, fashion_mnist, synthetic, tfrecord
from engine.datasets.splits import (DatasetInfo, Examples, RecordFiles,  # noqa: F401
                                    Splits)
from engine.registry import Registry

_DATASETS = Registry("dataset", {
    "cifar10": cifar10.load,
    "fashion_mnist": fashion_mnist.load,
    "synthetic": synthetic.load,
    "tfrecord": tfrecord.load,
})
names = _DATASETS.names
load = _DATASETS.build
