"""The ring allreduce's arithmetic (bench/ring_allreduce.py): nccl-tests'
bus bandwidth, and alpha and beta fitted back from times the model made."""
import pytest

from bench import ring_allreduce
from engine.records import scaling

SIZES = [4096 * 4**i for i in range(8)]  # 4 KB to 64 MB


@pytest.mark.parametrize("processes, factor", [(2, 1.0), (4, 1.5),
                                               (8, 1.75)])
def test_busbw_is_algbw_times_2_n_minus_1_over_n(processes, factor):
  assert ring_allreduce.algbw(1e6, 0.5) == 2e6
  assert ring_allreduce.busbw(1e6, 0.5, processes) == pytest.approx(
      2e6 * factor)


def test_busbw_over_one_process_is_refused():
  with pytest.raises(ValueError, match="2 or more"):
    ring_allreduce.busbw(1e6, 0.5, 1)


@pytest.mark.parametrize("processes", [2, 3, 8])
def test_the_model_counts_2_n_minus_1_latencies_and_the_bus_bytes(
    processes):
  link = scaling.Link(latency=1e-4, bandwidth=1e9)
  assert scaling.ring_allreduce_seconds(0, processes, link) == pytest.approx(
      2 * (processes - 1) * 1e-4)
  # A large message's busbw approaches beta.
  big = 1e12
  assert ring_allreduce.busbw(big, scaling.ring_allreduce_seconds(big, processes, link),
                              processes) == pytest.approx(1e9, rel=1e-6)


@pytest.mark.parametrize("processes", [2, 4])
def test_the_fit_gives_back_the_link_that_made_the_times(processes):
  link = scaling.Link(latency=50e-6, bandwidth=125e6)  # 1 Gbit/s
  times = [scaling.ring_allreduce_seconds(b, processes, link) for b in SIZES]
  fitted = ring_allreduce.fit(SIZES, times, processes)
  assert fitted.latency == pytest.approx(50e-6, rel=1e-9)
  assert fitted.bandwidth == pytest.approx(125e6, rel=1e-9)


def test_the_fit_weighs_each_time_by_itself_so_small_sizes_count():
  # Each time 10% off the model, alternately above and below: a fit of
  # absolute residuals would follow the 64 MB point alone and miss alpha
  # by far more than the relative fit does.
  link = scaling.Link(latency=100e-6, bandwidth=1e9)
  times = [scaling.ring_allreduce_seconds(b, 2, link) * (1.1 if i % 2 else 0.9)
           for i, b in enumerate(SIZES)]
  fitted = ring_allreduce.fit(SIZES, times, 2)
  assert fitted.latency == pytest.approx(100e-6, rel=0.15)
  assert fitted.bandwidth == pytest.approx(1e9, rel=0.15)


def test_times_that_do_not_grow_with_the_size_have_no_bandwidth():
  with pytest.raises(ValueError, match="do not grow"):
    ring_allreduce.fit(SIZES, [1e-3 * (2 - i / 8) for i in range(8)], 2)


@pytest.mark.parametrize("sizes, times, match", [
    ([4096, 4096], [1e-3, 2e-3], "two or more sizes"),
    ([4096, 8192], [1e-3], "2 sizes but 1 times"),
    ([4096, 8192], [1e-3, 0.0], "positive"),
])
def test_a_fit_without_the_data_for_it_is_refused(sizes, times, match):
  with pytest.raises(ValueError, match=match):
    ring_allreduce.fit(sizes, times, 2)

