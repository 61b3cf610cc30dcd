"""Flags: the model and its size. Each model is given the flags it declares;
one set that the run's model does not declare is refused (flags/reached.py)."""
from absl import flags

import models
from models import cosmoflow, resnet9

flags.DEFINE_string(
    "model", "cnn",
    f"Model to train: one of {', '.join(models.names())} (cnn: small, fast, "
    "for CPUs; wrn: WideResNet-depth-width), or your own builder as "
    "package.module:function or path/to/file.py:function, called with "
    "input_shape, num_classes and whichever of this module's flags its "
    "signature declares, returning a keras.Model with float32 logits "
    "[batch, num_classes] (docs/your-model.md).")
flags.register_validator(
    "model", models.is_known,
    f"value should be one of {', '.join(models.names())}, or "
    "package.module:function or path/to/file.py:function")
flags.DEFINE_integer("depth", 16, "wrn: depth, 6n+4 (16 in WRN-16-10).",
                     lower_bound=10)
flags.DEFINE_integer("width", 10, "wrn: widening factor (10 in WRN-16-10).",
                     lower_bound=1)
flags.DEFINE_integer("filters", 32,
                     "cnn, unet, cosmoflow: filters of the first convolution "
                     "(doubled in the next; cosmoflow: in each next block).",
                     lower_bound=1)
flags.DEFINE_enum("stem", "conv", resnet9.STEMS,
                  "resnet9: its first layer. conv: a learnt 3x3 "
                  "convolution of --filters channels, BatchNorm and ReLU "
                  "(Page). whitened: a frozen 2x2 convolution that "
                  "whitens the images' patches, computed from the first "
                  "training images before training, then ReLU (Jordan's "
                  "airbench): the first epochs learn faster, and it is "
                  "cheaper.",
                  case_sensitive=False)
flags.DEFINE_bool("pool_first", False,
                  "resnet9: max-pool each stage right after its "
                  "convolution, before BatchNorm and ReLU (airbench), "
                  "which then run on a quarter of the pixels: about 5% "
                  "faster on CPU, as accurate (bench/RESULTS.md); Page's "
                  "ResNet-9 pools last.")
flags.DEFINE_integer("conv_layers", 0,
                     "cosmoflow: convolution blocks (Conv3D, LeakyReLU, "
                     "MaxPool3D); 0: as many as the volume's size allows, "
                     "at most 5 (the reference's).", lower_bound=0)
flags.DEFINE_integer("kernel_size", cosmoflow.KERNEL_SIZE,
                     "cosmoflow: the side of each Conv3D's cubic kernel (3, "
                     "the MLPerf HPC reference's today; its v0.7 built 2).",
                     lower_bound=1)
flags.DEFINE_float("dropout", 0.0, "Dropout rate inside the model.",
                   lower_bound=0.0, upper_bound=0.95)
flags.DEFINE_float("weight_decay", 0.0,
                   "L2 penalty on every kernel, added to the loss (so it "
                   "applies the same way under every optimizer); under "
                   "--optimizer=adamw, AdamW's decoupled decay instead.",
                   lower_bound=0.0)
