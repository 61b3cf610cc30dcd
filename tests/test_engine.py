"""`import engine` (engine/__init__.py): the settings TensorFlow reads once,
made before it reads them, and its import without the notices that
TF_CPP_MIN_LOG_LEVEL hides."""
import subprocess

from tests import fixtures
from tests import timeouts

KERAS = ("import engine, tensorflow as tf; "
         "print(tf.keras.Model.__module__.split('.')[0])")


def test_tf_keras_is_keras_2_even_where_the_user_asked_for_keras_3():
  ran = fixtures.launch(["-c", KERAS], env={"TF_USE_LEGACY_KERAS": "0"})
  assert ran.returncode == 0, ran.stderr
  assert ran.stdout == "tf_keras\n"


def test_tensorflows_import_prints_nothing_that_its_log_level_hides():
  # (fixtures.launch sets TF_CPP_MIN_LOG_LEVEL=2, as users' runs have it)
  quiet = fixtures.launch(["-c", "import engine, tensorflow"],
                          env={"TF_ENABLE_ONEDNN_OPTS": "1"})
  assert quiet.returncode == 0
  assert quiet.stderr == ""
  # What TensorFlow 2.21 prints before abseil's logging is initialized,
  # shown where the user asks for everything.
  everything = subprocess.run(
      [fixtures.PYTHON, "-c", "import engine, tensorflow"], cwd=fixtures.REPO,
      env=dict(fixtures.engine_env(), TF_CPP_MIN_LOG_LEVEL="0",
               TF_ENABLE_ONEDNN_OPTS="1"),
      text=True, capture_output=True, timeout=timeouts.bound(300))
  assert everything.returncode == 0
  assert "oneDNN custom operations are on" in everything.stderr


def test_a_script_that_used_keras_3_as_tf_keras_first_is_told_what_to_do():
  # (the tests' environment has TF_USE_LEGACY_KERAS=1 from their own import)
  ran = fixtures.launch(["-c", "import tensorflow as tf; tf.keras.layers; "
                         "import engine"], env={"TF_USE_LEGACY_KERAS": "0"})
  assert ran.returncode == 1
  assert ("ImportError: tf.keras is Keras 3: it was used before the engine "
          "was imported, too late for TF_USE_LEGACY_KERAS=1; import engine "
          "before TensorFlow") in ran.stderr
