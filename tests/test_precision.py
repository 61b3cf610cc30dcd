"""--mixed_precision=auto: the precision the hardware computes natively."""
import pytest
import tensorflow as tf

from engine import precision


def test_an_explicit_mode_is_kept():
  for mode in ("none", "float16", "bfloat16"):
    assert precision.resolve(mode) == (mode, "")


@pytest.mark.parametrize("flags, expected", [
    ({"avx2", "avx512f", "avx512_bf16"}, ("bfloat16", "CPU with AVX512_BF16")),
    ({"avx2", "amx_bf16", "amx_tile"}, ("bfloat16", "CPU with AMX_BF16")),
    ({"avx2", "fma"}, ("none", "CPU without AVX512_BF16 or AMX: 16 bits "
                               "would be emulated")),
])
def test_auto_on_a_cpu_follows_its_bfloat16_instructions(flags, expected):
  assert precision.resolve("auto", cpu_flags=flags) == expected


@pytest.mark.parametrize("capability, mode", [
    ((9, 0), "bfloat16"), ((8, 0), "bfloat16"), ((7, 5), "float16"),
    ((7, 0), "float16"), ((6, 1), "none")])
def test_auto_on_a_gpu_follows_its_compute_capability(monkeypatch,
                                                      capability, mode):
  gpu = tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")
  monkeypatch.setattr(tf.config, "list_physical_devices",
                      lambda kind=None: [gpu] if kind == "GPU" else [])
  monkeypatch.setattr(tf.config.experimental, "get_device_details",
                      lambda device: {"compute_capability": capability})
  chosen, why = precision.resolve("auto", cpu_flags={"avx512_bf16"})
  assert chosen == mode
  assert why.startswith(f"GPU of compute capability {capability[0]}."
                        f"{capability[1]}")
