"""tests/shaped_links.py's arithmetic: a --links entry's rate, and tbf's
bucket (shaping itself needs root and simulated hosts: test_multihost.py
shapes them, and bench/allreduce_link.py)."""
import pytest

from tests import shaped_links


@pytest.mark.parametrize("link, bits", [("1gbit", 1e9), ("10gbit", 1e10),
                                        ("500mbit", 5e8), ("2.5gbit", 2.5e9)])
def test_a_rate_is_read_in_bits_per_second(link, bits):
  assert shaped_links.link_rate(link) == bits


def test_unshaped_has_no_rate():
  assert shaped_links.link_rate("unshaped") is None


@pytest.mark.parametrize("link", ["1gb", "fast", "1 gbit", "gbit", ""])
def test_anything_else_is_refused_naming_the_flag(link):
  with pytest.raises(ValueError, match="--links"):
    shaped_links.link_rate(link)


@pytest.mark.parametrize("bits, burst_ms, expected", [
    (1e9, 2.0, 250_000), (1e10, 2.0, 2_500_000),
    (1e8, 2.0, 64 * 1024),  # never below a 64 KB GSO packet
])
def test_the_bucket_holds_burst_ms_at_the_rate(bits, burst_ms, expected):
  assert shaped_links.burst_bytes(bits, burst_ms) == expected
