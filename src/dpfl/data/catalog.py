"""What each file-backed dataset consists of, where it is conventionally found, and where to download it.

Checksums are those of the official files. Fashion-MNIST's archive digests (MD5 from the
fashion-mnist README; SHA-256 as listed by independent downloaders) identify the exact ``.gz`` bytes
served by the official URL. Debian's ``dataset-fashion-mnist`` recompresses the files, so its ``.gz``
bytes differ; their *decompressed* content matches ``raw_sha256`` (whose MD5s,
f4a8712d..., 9018921c..., 8181f547..., 15d48437..., are the published MD5s of the uncompressed
official files). A file is accepted when either digest matches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

FASHION_MNIST_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"


@dataclass(frozen=True)
class RemoteFile:
    """One official file: its name on the server and the digests that identify its content."""

    filename: str
    md5: str  # of the archive bytes, as published
    sha256: str  # of the archive bytes
    raw_sha256: str | None = None  # of the decompressed content


@dataclass(frozen=True)
class SourceSpec:
    """The files a dataset needs and the conventional places to look for them."""

    name: str
    files: tuple[str, ...]  # relative names; "x" also matches "x.gz"
    subdirs: tuple[str, ...]  # folder names tried under a data root, in order
    system_dirs: tuple[Path, ...] = ()
    base_url: str | None = None
    remote: tuple[RemoteFile, ...] = ()
    manual: str = ""  # how to get the files when there is no download
    options: dict[str, str] = field(default_factory=dict)  # e.g. {"split": "letters"}

    @property
    def fetchable(self) -> bool:
        return self.base_url is not None and bool(self.remote)


# Directories installed by OS packages; a module-level table so tests can point it elsewhere.
SYSTEM_LOCATIONS: dict[str, tuple[Path, ...]] = {
    "fashion_mnist": (Path("/usr/share/datasets/fashion-mnist"),),
}

_IDX_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)

_FASHION_MNIST_REMOTE = (
    RemoteFile(
        "train-images-idx3-ubyte.gz",
        md5="8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        sha256="08dc20ab1689590a0bcd66e874647b6ee8464e2d501b5a3f1f78831db19a3fdc",
        raw_sha256="c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
    ),
    RemoteFile(
        "train-labels-idx1-ubyte.gz",
        md5="25c81989df183df01b3e8a0aad5dffbe",
        sha256="b0197879cbda89f3dc7b894f9fd52b858e68ea4182b6947c9d8c2b67e5f18dcc",
        raw_sha256="bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
    ),
    RemoteFile(
        "t10k-images-idx3-ubyte.gz",
        md5="bef4ecab320f06d8554ea6380940ec79",
        sha256="78dcbbfb5a27efaf1b6c1d616caca68560be8766c5bffcb2791df9273a534229",
        raw_sha256="5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
    ),
    RemoteFile(
        "t10k-labels-idx1-ubyte.gz",
        md5="bb300cfdad3c16e7a12a480ee83cd310",
        sha256="42bd18137a62d5998cdeae52bf3a0676ac6b706f5cf8439b47bb5b151ae3dccf",
        raw_sha256="0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
    ),
)

EMNIST_SPLITS: dict[str, int] = {  # split -> number of classes
    "balanced": 47,
    "byclass": 62,
    "bymerge": 47,
    "digits": 10,
    "letters": 26,
    "mnist": 10,
}

# Datasets that need no files: the loader builds them in memory.
EMBEDDED = {"digits": "embedded", "synthetic": "generated"}

FILE_BACKED = ("fashion_mnist", "mnist", "emnist", "cifar10", "cifar100")


def source_spec(name: str, split: str | None = None) -> SourceSpec:
    """The spec of a file-backed dataset; ``split`` selects the EMNIST split (default ``letters``)."""
    if name not in FILE_BACKED:
        raise ValueError(f"dataset must be one of {', '.join(FILE_BACKED)} (file-backed), got {name!r}")
    if split is not None and name != "emnist":
        raise ValueError(f"split is an option of emnist only, got split={split!r} for {name!r}")
    system = SYSTEM_LOCATIONS.get(name, ())
    if name == "fashion_mnist":
        return SourceSpec(
            name,
            files=_IDX_FILES,
            subdirs=("fashion_mnist", "fashion-mnist", "FashionMNIST/raw"),
            system_dirs=system,
            base_url=FASHION_MNIST_URL,
            remote=_FASHION_MNIST_REMOTE,
        )
    if name == "mnist":
        return SourceSpec(
            name,
            files=_IDX_FILES,
            subdirs=("mnist", "MNIST/raw"),
            system_dirs=system,
            manual="download the four MNIST IDX files (train/t10k images/labels, .gz or not) "
            "and put them in one of the mnist directories above",
        )
    if name == "emnist":
        split = "letters" if split is None else split
        if split not in EMNIST_SPLITS:
            raise ValueError(f"split must be one of {', '.join(EMNIST_SPLITS)}, got {split!r}")
        return SourceSpec(
            name,
            files=tuple(f"emnist-{split}-{f.replace('t10k', 'test')}" for f in _IDX_FILES),
            subdirs=("emnist", "emnist/gzip", "EMNIST/raw", "gzip"),
            system_dirs=system,
            manual="download the EMNIST 'gzip.zip' archive from NIST (https://www.nist.gov/itl/products-and-services/"
            f"emnist-dataset), unzip it and put the emnist-{split}-* files in one of the emnist directories above",
            options={"split": split},
        )
    if name == "cifar10":
        return SourceSpec(
            name,
            files=tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",),
            subdirs=("cifar10/cifar-10-batches-py", "cifar10", "cifar-10-batches-py"),
            system_dirs=system,
            manual="download cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html and "
            "extract it so that cifar-10-batches-py/ sits in one of the directories above",
        )
    return SourceSpec(
        name,
        files=("train", "test"),
        subdirs=("cifar100/cifar-100-python", "cifar100", "cifar-100-python"),
        system_dirs=system,
        manual="download cifar-100-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html and "
        "extract it so that cifar-100-python/ sits in one of the directories above",
    )
