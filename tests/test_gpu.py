"""On a GPU node, in the GPU venv (`make test DEVICE=gpu`): one process per
GPU trains with Horovod's collectives on NCCL, and the ranks end
identical. Where TensorFlow finds no GPU (a CPU venv, or any venv on a
CPU node, as on the machines this suite usually runs on) it is skipped,
saying so; `make smoke DEVICE=gpu` then proves the GPU venv on the CPU
(BUILD.md, "GPUs")."""
import json
import os

import pytest
import tensorflow as tf

from engine import distributed
from tests import fixtures

WORKER = os.path.join(fixtures.REPO, "tests", "workers",
                      "multiprocess_checks.py")
GPUS = tf.config.list_physical_devices("GPU")
pytestmark = pytest.mark.skipif(
    not GPUS, reason="TensorFlow finds no GPU here"
    + ("" if tf.test.is_built_with_cuda() else " (a CPU build)"))


def test_one_process_per_gpu_trains_on_nccl_with_identical_ranks(tmp_path):
  assert distributed.nccl_built(), "a GPU venv's Horovod has NCCL"
  data_dir = fixtures.write_fashion_mnist(str(tmp_path / "data"), 601, 101)
  ran = fixtures.launch([WORKER, str(tmp_path), data_dir],
                        processes=len(GPUS), timeout=600)
  assert ran.returncode == 0, ran.stderr[-3000:]
  ranks = [json.loads((tmp_path / f"rank{r}.json").read_text())
           for r in range(len(GPUS))]
  # The multi-process smoke's checks (tests/test_multiprocess.py).
  assert [r["max_weight_difference_across_ranks"] for r in ranks] == [0] * len(
      GPUS)
  for r in ranks:
    assert r["reported_val_loss"] == pytest.approx(r["full_test_loss"],
                                                   rel=1e-5)
    assert [h["world_size"] for h in r["history"]] == [len(GPUS)] * 2
