import gzip
import struct

import numpy as np
import pytest

from dpfl.data.idx import IdxFormatError, parse_idx, read_idx, write_idx


def _labels_bytes(values):
    return struct.pack(">II", 0x00000801, len(values)) + bytes(values)


def test_parses_hand_built_label_file():
    arr = parse_idx(_labels_bytes([3, 0, 9, 255]), ndim=1)
    assert arr.dtype == np.uint8
    assert arr.tolist() == [3, 0, 9, 255]


def test_parses_hand_built_image_file_row_major():
    header = struct.pack(">IIII", 0x00000803, 2, 2, 3)
    arr = parse_idx(header + bytes(range(12)), ndim=3)
    assert arr.shape == (2, 2, 3)
    assert arr[1, 0].tolist() == [6, 7, 8]  # sample 1, row 0
    assert arr[0, 1, 2] == 5


def test_multibyte_types_are_big_endian():
    header = struct.pack(">BBBBI", 0, 0, 0x0B, 1, 2)  # int16, one dimension of 2
    arr = parse_idx(header + struct.pack(">hh", 258, -2))
    assert arr.tolist() == [258, -2]
    assert arr.dtype.isnative


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize("compress", [False, True])
def test_write_read_round_trip(tmp_path, dtype, compress):
    rng = np.random.default_rng(1)
    arr = (rng.standard_normal((4, 3, 2)) * 100).astype(dtype)
    path = write_idx(tmp_path / "a.idx", arr, compress=compress)
    back = read_idx(path)
    assert back.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(back, arr)
    assert back.flags.writeable


def test_compression_is_detected_from_content_not_name(tmp_path):
    labels = np.array([1, 2, 3], dtype=np.uint8)
    gz_named_plain = tmp_path / "plain.gz"
    gz_named_plain.write_bytes(_labels_bytes([1, 2, 3]))
    plain_named_gz = tmp_path / "labels-idx1-ubyte"
    plain_named_gz.write_bytes(gzip.compress(_labels_bytes([1, 2, 3])))
    np.testing.assert_array_equal(read_idx(gz_named_plain), labels)
    np.testing.assert_array_equal(read_idx(plain_named_gz), labels)


def test_bad_magic_is_rejected(tmp_path):
    path = tmp_path / "x"
    path.write_bytes(b"PK\x03\x04" + bytes(20))
    with pytest.raises(IdxFormatError, match="magic"):
        read_idx(path)


def test_unknown_type_byte_is_rejected():
    with pytest.raises(IdxFormatError, match="magic"):
        parse_idx(struct.pack(">BBBBI", 0, 0, 0x07, 1, 0))


def test_truncated_payload_names_expected_and_found_sizes(tmp_path):
    path = tmp_path / "x"
    path.write_bytes(_labels_bytes([1, 2, 3])[:-1])
    with pytest.raises(IdxFormatError, match=r"truncated.*\(3,\).*11 bytes in all.*found 10 bytes"):
        read_idx(path)


def test_trailing_bytes_are_rejected():
    with pytest.raises(IdxFormatError, match="trailing"):
        parse_idx(_labels_bytes([1, 2]) + b"\x00")


def test_truncated_header_is_rejected():
    with pytest.raises(IdxFormatError, match="too short"):
        parse_idx(b"\x00\x00")
    with pytest.raises(IdxFormatError, match="truncated header"):
        parse_idx(struct.pack(">I", 0x00000803) + b"\x00" * 5)


def test_truncated_gzip_stream_is_reported(tmp_path):
    data = gzip.compress(_labels_bytes(list(range(200))))
    path = tmp_path / "labels.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(IdxFormatError, match="corrupt or truncated gzip"):
        read_idx(path)


def test_rank_mismatch_says_what_was_expected(tmp_path):
    path = write_idx(tmp_path / "labels", np.arange(4, dtype=np.uint8))
    with pytest.raises(IdxFormatError, match="expected an idx3 image file.*1 dimensions"):
        read_idx(path, ndim=3)


def test_write_rejects_unsupported_dtype(tmp_path):
    with pytest.raises(ValueError, match="no IDX type"):
        write_idx(tmp_path / "x", np.zeros(3, dtype=np.uint16))
