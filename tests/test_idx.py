import gzip

import numpy as np
import pytest

from engine.core.errors import UserError
from engine.datasets.fashion_mnist import encode_idx, parse_idx, read_idx


def test_round_trip_of_images_and_labels(tmp_path):
  images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
  labels = np.array([7, 1, 0], np.uint8)
  (tmp_path / "images.gz").write_bytes(gzip.compress(encode_idx(images)))
  (tmp_path / "labels").write_bytes(encode_idx(labels))
  np.testing.assert_array_equal(read_idx(str(tmp_path / "images.gz")), images)
  np.testing.assert_array_equal(read_idx(str(tmp_path / "labels")), labels)


def test_header_is_big_endian_as_in_the_mnist_files():
  raw = encode_idx(np.zeros((60000, 28, 28), np.uint8))
  assert raw[:16] == bytes.fromhex("00000803 0000ea60 0000001c 0000001c")


@pytest.mark.parametrize("raw, message", [
    (b"\x01\x00\x08\x01\x00\x00\x00\x01\x05", "bad magic"),
    (b"\x00\x00\x0d\x01\x00\x00\x00\x01\x05", "not supported"),
    (b"\x00\x00\x08\x03\x00\x00", "truncated idx header"),
])
def test_malformed_headers_are_named(raw, message):
  with pytest.raises(UserError, match=message):
    parse_idx(raw, "x")


def test_truncated_data_is_caught_against_the_header():
  raw = encode_idx(np.ones((10, 28, 28), np.uint8))
  with pytest.raises(UserError, match=r"^t10k: .* file has 7756; .*truncated"):
    parse_idx(raw[:-100], "t10k")


def test_truncated_gzip_stream(tmp_path):
  path = tmp_path / "train-labels-idx1-ubyte.gz"
  path.write_bytes(gzip.compress(encode_idx(np.ones(5000, np.uint8)))[:-20])
  with pytest.raises(UserError, match="truncated or corrupt gzip"):
    read_idx(str(path))


def test_garbage_that_is_not_gzip(tmp_path):
  path = tmp_path / "train-labels-idx1-ubyte.gz"
  path.write_bytes(b"<html>not found</html>")
  with pytest.raises(UserError, match="corrupt gzip"):
    read_idx(str(path))
