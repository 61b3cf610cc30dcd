"""tensorflow-addons' NovoGrad and LAMB, the reference the engine's own are
held to (tests/test_optimizers.py, bench/optimizers.py).

Addons 0.23.0 is end-of-life, installs on Python 3.11 only
(requirements-no-deps.txt), and imports three Keras internals from
`keras.src`: Keras 3's package since TensorFlow 2.16, which lacks
`engine`. tf_keras has each under the same name, so `keras.src...` points
at tf_keras' modules (and the packages on their paths too, so that Keras 3
is never imported) while addons imports, and back at whatever it was
after: nothing else in the process sees the aliases.
"""
import importlib
import importlib.util
import sys
from types import ModuleType
from typing import Optional
import warnings

_KERAS_MODULES = ("src", "src.backend", "src.engine",
                  "src.engine.keras_tensor", "src.utils", "src.utils.tf_utils")


def optimizers() -> Optional[ModuleType]:
  """`tensorflow_addons.optimizers` on tf_keras, or None where addons is
  not installed."""
  if importlib.util.find_spec("tensorflow_addons") is None:
    return None
  aliases = {f"keras.{name}": importlib.import_module(f"tf_keras.{name}")
             for name in _KERAS_MODULES}
  saved = {name: sys.modules.get(name) for name in aliases}
  sys.modules.update(aliases)
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")  # end-of-life, TensorFlow too new
      return importlib.import_module("tensorflow_addons.optimizers")
  finally:
    for name, module in saved.items():
      if module is None:
        del sys.modules[name]
      else:
        sys.modules[name] = module
