"""bench/allreduce_link.py's reading of --links (what the benchmark
measures runs only as root, across simulated hosts, and is timed: it is not
tested here)."""
import pytest

from bench import allreduce_link


@pytest.mark.parametrize("link, bits", [("1gbit", 1e9), ("10gbit", 1e10),
                                        ("500mbit", 5e8), ("2.5gbit", 2.5e9)])
def test_a_rate_is_read_in_bits_per_second(link, bits):
  assert allreduce_link.link_rate(link) == bits


def test_unshaped_has_no_rate():
  assert allreduce_link.link_rate("unshaped") is None


@pytest.mark.parametrize("link", ["1gb", "fast", "1 gbit", "gbit", ""])
def test_anything_else_is_refused_naming_the_flag(link):
  with pytest.raises(ValueError, match="--links"):
    allreduce_link.link_rate(link)
