"""A TensorFlow 2 training engine for data-parallel training with Horovod.

TensorFlow's C++ runtime logs every kernel registration and oneDNN notice at
start-up, once per process; with N processes under horovodrun that buries the
engine's own output. Quiet it unless the user asked otherwise. This must run
before the first `import tensorflow`, which is why it lives here.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
