"""examples/dcgan.py's DCGAN, narrow enough for the tests' CPU time."""
from examples.dcgan import DCGAN


class TinyDCGAN(DCGAN):
  latent = 8
  width = 4
  # Dropout masks' random state is not checkpointed: without it, a resumed
  # run is the run straight through (docs/checkpoints-and-faults.md).
  dropout = 0.0
