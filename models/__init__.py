"""Models by name: `build(name, **params) -> tf.keras.Model`.

Every builder takes `input_shape` and `num_classes` and returns a functional
Keras model whose output is float32 logits. Builders declare the parameters
they use in their signatures and receive only those (engine/registry.py), so
the flags shared by several models (dropout, weight decay) reach the models
that have them and are ignored by the others.
"""
from engine.registry import Registry
from models import cnn, resnet, wrn

_MODELS = Registry("model", {
    "cnn": cnn.build,
    "resnet50": resnet.resnet50,
    "resnet_small": resnet.resnet_small,
    "wrn": wrn.build,
})
names = _MODELS.names
build = _MODELS.build
