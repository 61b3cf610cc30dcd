"""Our Winograd kernels for 3x3x3 convolutions (models/winograd3d.py):
the same function and gradients as TensorFlow's convolution, and where
CosmoFlow's network takes them.

In-process, on the kernels scripts/build_kernels.sh compiled into the
venv: the variant this CPU runs widest, or ENGINE_CPU_KERNELS's, with which
`test_each_variant_passes_these_tests` runs this file again.
"""
import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import keras
import tensorflow as tf

from engine import train as train_lib
from engine.core import cpu
from engine.core.errors import UserError
from engine.tools import make_volumes
import models
from models import winograd3d
from tests import fixtures
from tests import timeouts


def both_ways(inputs, kernel, upstream):
  """[output, input gradient, kernel gradient] by the direct convolution
  and by ours."""
  computed = []
  for convolve in (lambda x, k: tf.nn.conv3d(x, k, [1] * 5, "SAME"),
                   winograd3d.conv3d):
    with tf.GradientTape() as tape:
      tape.watch([inputs, kernel])
      outputs = convolve(inputs, kernel)
    computed.append([outputs, *tape.gradient(outputs, [inputs, kernel],
                                             output_gradients=upstream)])
  return computed


@pytest.mark.parametrize("volume, channels_in, channels_out", [
    ((8, 8, 8), 16, 32),   # the widest vectors both ways
    ((4, 6, 10), 32, 16),  # sides apart, tiles on every edge
    ((2, 2, 2), 48, 64),   # one tile: all but its middle taps on padding
])
def test_the_convolution_and_its_gradients_are_tensorflows(
    volume, channels_in, channels_out):
  inputs = tf.random.stateless_normal((2, *volume, channels_in), (1, 2))
  kernel = tf.random.stateless_normal((3, 3, 3, channels_in, channels_out),
                                      (3, 4)) * 0.1
  upstream = tf.random.stateless_normal((2, *volume, channels_out), (5, 6))
  theirs, ours = both_ways(inputs, kernel, upstream)
  for name, a, b in zip(["output", "input gradient", "kernel gradient"],
                        ours, theirs):
    # The same sums in another order: within float32 rounding of the
    # whole (Winograd's transforms add a few roundings a term).
    assert np.linalg.norm(a - b) <= 1e-5 * np.linalg.norm(b), name


def test_the_kernel_gradient_sums_the_same_way_every_time():
  inputs = tf.random.stateless_normal((2, 8, 8, 8, 16), (1, 2))
  upstream = tf.random.stateless_normal((2, 8, 8, 8, 32), (5, 6))
  ops = winograd3d._ops()
  first = ops.winograd3d_kernel_gradient(inputs, upstream).numpy()
  again = ops.winograd3d_kernel_gradient(inputs, upstream).numpy()
  assert np.array_equal(first, again)


def test_the_untransform_is_the_transforms_gradient():
  # <T(w), g> = <w, T'(g)> for every w and g: T' is T's transpose.
  ops = winograd3d._ops()
  kernel = tf.random.stateless_normal((3, 3, 3, 16, 32), (1, 2))
  gradient = tf.random.stateless_normal((64, 16, 32), (3, 4))
  left = tf.reduce_sum(ops.winograd3d_transform_kernel(kernel) * gradient)
  right = tf.reduce_sum(kernel * ops.winograd3d_untransform_kernel(gradient))
  assert abs(float(left) - float(right)) <= 1e-4 * abs(float(left))


@pytest.mark.parametrize("inputs, kernel, says", [
    ((1, 4, 5, 4, 16), (64, 16, 16), "the volume's sides must be even"),
    ((1, 4, 4, 4, 16), (64, 8, 16), r"the transformed kernel is \[64, 16, "
                                    r"Co\]"),
    # The first block's 4 channels in (the vectors' lanes: 16 with
    # AVX-512, 8 with AVX2); 4 out.
    ((1, 4, 4, 4, 4), (64, 4, 16), "channels in and out must be multiples "
                                   "of (8|16); got 4 and 16"),
    ((1, 4, 4, 4, 16), (64, 16, 4), "channels in and out must be multiples "
                                    "of (8|16); got 16 and 4"),
])
def test_shapes_the_kernels_cannot_take_are_refused(inputs, kernel, says):
  with pytest.raises(tf.errors.InvalidArgumentError, match=says):
    winograd3d._ops().winograd3d_conv(tf.zeros(inputs), tf.zeros(kernel))


def convolutions(model):
  return [l for l in model.layers if isinstance(l, keras.layers.Conv3D)]


def test_cosmoflow_takes_them_for_its_second_and_third_blocks():
  # The reference network on 32^3 x 4: the first block has 4 channels in,
  # the fourth 4^3 voxels, the fifth 2^3 (by taps).
  model = models.build("cosmoflow", input_shape=(32, 32, 32, 4),
                       num_classes=4, filters=32, conv_layers=5)
  assert [l._by_winograd for l in convolutions(model)] == [
      False, True, True, False, False]

  volumes = tf.zeros((1, 32, 32, 32, 4))

  def op_types(training, jit_compile=False):
    call = tf.function(lambda v: model(v, training=training),
                       jit_compile=jit_compile)
    graph = call.get_concrete_function(volumes).graph
    return {op.type for op in graph.get_operations()}
  assert "Winograd3DConv" in op_types(training=True)
  # Inference (validation, the exported SavedModel) and XLA take the
  # direct convolution: a SavedModel must load without our kernels, and
  # XLA has none of them.
  assert not any(t.startswith("Winograd") for t in op_types(training=False))
  assert not any(t.startswith("Winograd")
                 for t in op_types(training=True, jit_compile=True))


def test_bfloat16_takes_onednns_convolution():
  keras.mixed_precision.set_global_policy("mixed_bfloat16")
  try:
    model = models.build("cosmoflow", input_shape=(32, 32, 32, 4),
                         num_classes=4, filters=32, conv_layers=3)
  finally:
    keras.mixed_precision.set_global_policy("float32")
  assert not any(l._by_winograd for l in convolutions(model))


def test_missing_kernels_are_one_line(monkeypatch, tmp_path):
  monkeypatch.setattr(winograd3d, "_library", None)
  monkeypatch.setattr(winograd3d, "_path",
                      lambda variant: str(tmp_path / "winograd3d.so"))
  with pytest.raises(UserError, match=r"^the Winograd kernels are not "
                     r"built \(.*winograd3d.so\): run `make setup`"):
    winograd3d.conv3d(tf.zeros((1, 2, 2, 2, 16)), tf.zeros((3, 3, 3, 16, 16)))


def test_cosmoflows_network_trains_as_the_direct_one():
  # The same weights, one batch: outputs and every gradient of the model
  # with Winograd's blocks against the same model with none.
  keras.utils.set_random_seed(0)
  ours = models.build("cosmoflow", input_shape=(32, 32, 32, 4),
                      num_classes=4, filters=16, conv_layers=3)
  direct = models.build("cosmoflow", input_shape=(32, 32, 32, 4),
                        num_classes=4, filters=16, conv_layers=3)
  for layer in convolutions(direct):
    layer._by_winograd = False
  assert [l._by_winograd for l in convolutions(ours)] == [False, True, True]
  direct.set_weights(ours.get_weights())
  # Against the same blocks convolved directly, not the reference's
  # layers: on this many voxels the reference's order, pooling after the
  # bias and LeakyReLU, meets ties that their rounding makes and sends
  # those gradients to another voxel; its gradients then differ from
  # either network's by up to 0.5%.
  volumes = tf.random.stateless_normal((2, 32, 32, 32, 4), (0, 1))
  computed = [fixtures.outputs_and_gradients(network, volumes)
              for network in (ours, direct)]
  for a, b in zip(*computed):
    assert np.linalg.norm(a - b) <= 1e-5 * np.linalg.norm(b)


def test_the_variant_is_the_widest_this_cpu_runs_or_the_one_asked():
  asked = os.environ.get("ENGINE_CPU_KERNELS")
  widest = "avx512" if "avx512f" in cpu.features() else "avx2"
  assert winograd3d.variant() == (asked or widest)
  winograd3d.conv3d(tf.zeros((1, 2, 2, 2, 16)), tf.zeros((3, 3, 3, 16, 16)))
  assert winograd3d.loaded() == (asked or widest)


VARIANTS = [pytest.param(variant, marks=pytest.mark.skipif(
    not needs <= cpu.features(), reason=f"the CPU has no {variant}"))
            for variant, needs in winograd3d.VARIANTS.items()]


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_passes_these_tests(variant):
  """Each build this CPU runs, loaded by a process of its own (a process
  holds one: both register the same ops), passes every other test here."""
  ran = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
       __file__, "-k", "not each_variant and not trains_on_tensorflows"],
      env=fixtures.engine_env(ENGINE_CPU_KERNELS=variant), cwd=fixtures.REPO,
      capture_output=True, text=True, timeout=timeouts.bound(300))
  assert ran.returncode == 0, ran.stdout[-3000:]
  assert " passed" in ran.stdout.splitlines()[-1]


def test_the_portable_build_has_no_avx512_instruction():
  """What a node without AVX-512 loads holds none of its registers: the
  build's flags, not the set-up machine, decided its instructions."""
  code = {variant: subprocess.run(
      ["objdump", "-d", "--no-show-raw-insn", winograd3d._path(variant)],
      capture_output=True, text=True, check=True,
      timeout=timeouts.bound(60)).stdout for variant in winograd3d.VARIANTS}
  assert "%zmm" not in code["avx2"] and "%ymm" in code["avx2"]
  assert "%zmm" in code["avx512"]


def test_auto_takes_the_widest_variant_built_that_the_cpu_runs(monkeypatch,
                                                               tmp_path):
  monkeypatch.setattr(winograd3d, "_choice", "auto")
  monkeypatch.setattr(winograd3d, "_path",
                      lambda variant: str(tmp_path / f"{variant}.so"))
  for variant in winograd3d.VARIANTS:
    (tmp_path / f"{variant}.so").touch()
  monkeypatch.setattr(cpu, "features", lambda: {"avx2", "fma"})
  assert winograd3d.variant() == "avx2"
  monkeypatch.setattr(cpu, "features", lambda: {"avx2", "fma", "avx512f"})
  assert winograd3d.variant() == "avx512"
  # A compiler that could not build AVX-512's: AVX2's on every node.
  (tmp_path / "avx512.so").unlink()
  assert winograd3d.variant() == "avx2"
  monkeypatch.setattr(cpu, "features", lambda: {"sse4_2"})
  assert winograd3d.variant() is None
  assert not winograd3d.available()


def test_a_variant_the_cpu_cannot_run_is_refused_in_one_line(monkeypatch):
  monkeypatch.setattr(winograd3d, "_choice", "auto")
  monkeypatch.setattr(cpu, "features", lambda: {"avx2", "fma"})
  with pytest.raises(UserError, match=r"^--cpu_kernels=avx512: this CPU "
                     r"lacks avx512f; use --cpu_kernels=auto$"):
    winograd3d.use("avx512")
  assert winograd3d._choice == "auto"


def test_off_takes_tensorflows_convolution(monkeypatch):
  monkeypatch.setattr(winograd3d, "_choice", "auto")
  winograd3d.use("off")
  model = models.build("cosmoflow", input_shape=(32, 32, 32, 4),
                       num_classes=4, filters=32, conv_layers=5)
  assert [l.fits_winograd for l in convolutions(model)] == [
      False, True, True, False, False]
  assert not any(l._by_winograd for l in convolutions(model))
  assert winograd3d.blocks(model) == (2, 0)
  graph = tf.function(lambda v: model(v, training=True)).get_concrete_function(
      tf.zeros((1, 32, 32, 32, 4))).graph
  assert "Conv3D" in {op.type for op in graph.get_operations()}
  assert not any(op.type.startswith("Winograd")
                 for op in graph.get_operations())


@pytest.mark.parametrize("library", ["missing", "unloadable"])
def test_a_build_that_does_not_load_is_one_warning_and_no_kernels(
    monkeypatch, tmp_path, caplog, library):
  path = tmp_path / "winograd3d.so"
  if library == "unloadable":
    path.write_bytes(b"not a shared library")
  monkeypatch.setattr(winograd3d, "_library", None)
  monkeypatch.setattr(winograd3d, "_library_variant", None)
  monkeypatch.setattr(winograd3d, "_warned", False)
  monkeypatch.setattr(winograd3d, "_path", lambda variant: str(path))
  with caplog.at_level(logging.WARNING):
    model = models.build("cosmoflow", input_shape=(32, 32, 32, 4),
                         num_classes=4, filters=32, conv_layers=3)
  assert winograd3d.blocks(model) == (2, 0)
  warnings = [r.getMessage() for r in caplog.records
              if r.levelno == logging.WARNING]
  says = {"missing": "are not built", "unloadable": "do not load"}[library]
  assert len(warnings) == 1 and says in warnings[0], warnings
  assert warnings[0].endswith("CosmoFlow's 3x3x3 blocks take TensorFlow's "
                              "convolution")
  assert "\n" not in warnings[0]


def test_a_run_whose_kernels_do_not_load_trains_on_tensorflows(
    monkeypatch, tmp_path, caplog):
  """A whole CosmoFlow run, in this process, with a build that does not
  load: it trains, says so once, and its record names what ran."""
  path = tmp_path / "winograd3d.so"
  path.write_bytes(b"not a shared library")
  monkeypatch.setattr(winograd3d, "_library", None)
  monkeypatch.setattr(winograd3d, "_library_variant", None)
  monkeypatch.setattr(winograd3d, "_warned", False)
  monkeypatch.setattr(winograd3d, "_path", lambda variant: str(path))
  make_volumes.write(str(tmp_path / "volumes"), size=16, channels=2, train=8,
                     validation=4, samples_per_file=4, seed=3)
  defaults = fixtures.train_config()
  config = fixtures.train_config(
      data=dict(name="tfrecord", dir=str(tmp_path / "volumes"),
                params={**defaults.data.params, "log_transform": True}),
      task=dict(name="regression", params={**defaults.task.params,
                                           "standardize_targets": False}),
      model=dict(name="cosmoflow",
                 params={**defaults.model.params, "filters": 16}),
      training=dict(batch_size=4, epochs=1, progress="none",
                    model_dir=str(tmp_path / "run")))
  with caplog.at_level(logging.WARNING):
    train_lib.train(config)
  warnings = [r.getMessage() for r in caplog.records
              if "Winograd kernels" in r.getMessage()]
  assert len(warnings) == 1 and "do not load" in warnings[0]
  with open(tmp_path / "run" / "metrics.jsonl") as f:
    records = [json.loads(line) for line in f]
  kernels, = [r for r in records if r.get("event") == "cpu_kernels"]
  assert kernels["by_rank"] == ["tensorflow"] and kernels["blocks"] == 1
  assert [r["epoch"] for r in records if "epoch" in r] == [1]
