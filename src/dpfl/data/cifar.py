"""Reader for the CIFAR "python version" pickle batches.

The batches are pickles, and unpickling runs code; the loader therefore only allows the few
globals a CIFAR batch needs (numpy array reconstruction), so a tampered file cannot execute anything.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np

_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
}


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # noqa: ANN201 (pickle API)
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a CIFAR batch")
        return super().find_class(module, name)


def read_cifar_batch(path: str | Path, label_key: str = "labels") -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 3, 32, 32) uint8 and labels (N,) int64 from one batch file.

    Rows are stored as 1024 red, 1024 green, 1024 blue values, each plane row-major, so a reshape
    gives NCHW directly. ``label_key`` is ``labels`` (CIFAR-10), ``fine_labels`` or ``coarse_labels``
    (CIFAR-100).
    """
    path = Path(path)
    try:
        batch = _SafeUnpickler(io.BytesIO(path.read_bytes()), encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
        raise ValueError(f"{path}: not a readable CIFAR batch ({exc})") from None
    if not isinstance(batch, dict):
        raise ValueError(f"{path}: expected a dict in the CIFAR batch, got {type(batch).__name__}")
    batch = {k.decode() if isinstance(k, bytes) else k: v for k, v in batch.items()}
    if "data" not in batch or label_key not in batch:
        raise ValueError(f"{path}: CIFAR batch lacks 'data' or {label_key!r}; keys: {sorted(batch)}")
    data = np.asarray(batch["data"])
    labels = np.asarray(batch[label_key], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise ValueError(f"{path}: CIFAR 'data' must be uint8 of shape (N, 3072), got {data.dtype} {data.shape}")
    if labels.shape != (data.shape[0],):
        raise ValueError(f"{path}: {data.shape[0]} images but {labels.shape[0]} labels")
    return data.reshape(-1, 3, 32, 32), labels
