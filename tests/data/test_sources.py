import gzip
import hashlib
import io
from pathlib import Path

import pytest

from dpfl.data import DATASETS, ChecksumError, DatasetNotFoundError, available, fetch, locate
from dpfl.data import catalog, download
from dpfl.data.catalog import RemoteFile
from dpfl.data.locations import cache_root

from .fakes import write_mnist_files

pytestmark = pytest.mark.usefixtures("no_system_data")


def _fake_fmnist_remote(tmp_path: Path) -> dict[str, bytes]:
    """Serve-able fake Fashion-MNIST archives keyed by file name."""
    src = tmp_path / "server"
    write_mnist_files(src, compress=True)
    return {p.name: p.read_bytes() for p in src.iterdir()}


def _remotes_for(files: dict[str, bytes], corrupt: str | None = None) -> tuple[RemoteFile, ...]:
    out = []
    for name, data in sorted(files.items()):
        sha = hashlib.sha256(data).hexdigest()
        if name == corrupt:
            sha = "0" * 64
        out.append(RemoteFile(name, md5=hashlib.md5(data).hexdigest(), sha256=sha))
    return tuple(out)


class _Server:
    """Replaces download._open_url: serves bytes by file name and counts requests."""

    def __init__(self, files: dict[str, bytes], fail: bool = False):
        self.files, self.fail, self.requests = files, fail, []

    def __call__(self, url, timeout):
        self.requests.append(url)
        if self.fail:
            raise OSError("network is unreachable")
        return io.BytesIO(self.files[url.rsplit("/", 1)[1]])


# --- resolution order -------------------------------------------------------------------------


def test_resolution_order_explicit_env_cache_system(tmp_path, monkeypatch):
    explicit, env, system = tmp_path / "explicit", tmp_path / "env", tmp_path / "sys"
    for d in (explicit, env / "mnist", cache_root() / "mnist", system):
        write_mnist_files(d)
    monkeypatch.setenv("DPFL_DATA", str(env))
    monkeypatch.setattr(catalog, "SYSTEM_LOCATIONS", {"mnist": (system,)})

    loc = locate("mnist", explicit)
    assert (loc.source, loc.path) == ("explicit", explicit)
    loc = locate("mnist")
    assert (loc.source, loc.path) == ("env", env / "mnist")
    monkeypatch.delenv("DPFL_DATA")
    loc = locate("mnist")
    assert (loc.source, loc.path) == ("cache", cache_root() / "mnist")
    for f in (cache_root() / "mnist").iterdir():
        f.unlink()
    loc = locate("mnist")
    assert (loc.source, loc.path) == ("system", system)


def test_explicit_root_without_files_falls_through_to_next_place(tmp_path):
    write_mnist_files(cache_root() / "mnist")
    assert locate("mnist", tmp_path / "empty").source == "cache"


def test_env_dir_may_hold_files_directly_or_in_known_subfolders(tmp_path, monkeypatch):
    monkeypatch.setenv("DPFL_DATA", str(tmp_path))
    write_mnist_files(tmp_path / "MNIST" / "raw", compress=False)
    loc = locate("mnist")
    assert loc.path == tmp_path / "MNIST" / "raw"
    assert loc.file("train-images-idx3-ubyte").name == "train-images-idx3-ubyte"  # uncompressed name accepted

    direct = tmp_path / "direct"
    write_mnist_files(direct)
    monkeypatch.setenv("DPFL_DATA", str(direct))
    assert locate("mnist").path == direct


def test_incomplete_directory_is_not_used(tmp_path):
    write_mnist_files(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DatasetNotFoundError):
        locate("mnist", tmp_path)


def test_cache_respects_xdg_and_defaults_to_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "dpfl"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "dpfl"


# --- missing datasets -------------------------------------------------------------------------


def test_missing_dataset_lists_every_place_and_the_fetch_command(tmp_path, monkeypatch):
    monkeypatch.setenv("DPFL_DATA", str(tmp_path / "env"))
    monkeypatch.setattr(catalog, "SYSTEM_LOCATIONS", {"fashion_mnist": (tmp_path / "sys",)})
    with pytest.raises(DatasetNotFoundError) as info:
        locate("fashion_mnist", tmp_path / "mine")
    msg = str(info.value)
    assert isinstance(info.value, FileNotFoundError)
    for place in (
        tmp_path / "mine",
        tmp_path / "mine" / "fashion_mnist",
        tmp_path / "env" / "fashion_mnist",
        cache_root() / "fashion_mnist",
        tmp_path / "sys",
    ):
        assert f"{place}\n" in msg + "\n"
    assert "$DPFL_OFFLINE is set" in msg
    assert "dpfl data fetch fashion_mnist" in msg
    assert "apt-get install dataset-fashion-mnist" in msg


def test_missing_dataset_without_download_explains_manual_steps():
    with pytest.raises(DatasetNotFoundError) as info:
        locate("cifar10")
    msg = str(info.value)
    assert "explicit root: not given" in msg and "$DPFL_DATA: not set" in msg
    assert "cs.toronto.edu" in msg and "dpfl data fetch" not in msg


def test_emnist_message_names_the_split():
    with pytest.raises(DatasetNotFoundError, match=r"\(split=digits\).*emnist-digits-train-images"):
        locate("emnist", split="digits")


# --- download ----------------------------------------------------------------------------------


def test_fetch_downloads_verifies_and_is_idempotent(tmp_path, monkeypatch):
    files = _fake_fmnist_remote(tmp_path)
    monkeypatch.setattr(catalog, "_FASHION_MNIST_REMOTE", _remotes_for(files))
    server = _Server(files)
    monkeypatch.setattr(download, "_open_url", server)

    path = fetch("fashion_mnist")
    assert path == cache_root() / "fashion_mnist"
    assert {p.name: p.read_bytes() for p in path.iterdir()} == files
    assert len(server.requests) == 4
    assert all(u.startswith(catalog.FASHION_MNIST_URL) for u in server.requests)
    assert [p.name for p in cache_root().iterdir()] == ["fashion_mnist"]  # no staging left behind

    fetch("fashion_mnist")
    assert len(server.requests) == 4  # nothing re-downloaded
    (path / "t10k-labels-idx1-ubyte.gz").write_bytes(b"garbage")
    fetch("fashion_mnist")
    assert server.requests[4:] == [catalog.FASHION_MNIST_URL + "t10k-labels-idx1-ubyte.gz"]
    assert (path / "t10k-labels-idx1-ubyte.gz").read_bytes() == files["t10k-labels-idx1-ubyte.gz"]


def test_checksum_mismatch_leaves_nothing_in_the_cache(tmp_path, monkeypatch):
    files = _fake_fmnist_remote(tmp_path)
    monkeypatch.setattr(catalog, "_FASHION_MNIST_REMOTE", _remotes_for(files, corrupt="train-labels-idx1-ubyte.gz"))
    monkeypatch.setattr(download, "_open_url", _Server(files))
    with pytest.raises(ChecksumError, match="train-labels-idx1-ubyte.gz"):
        fetch("fashion_mnist")
    assert not cache_root().exists() or list(cache_root().iterdir()) == []


def test_fetch_into_explicit_root_from_file_url(tmp_path, monkeypatch, file_url_opener):
    files = _fake_fmnist_remote(tmp_path)
    monkeypatch.setattr(catalog, "_FASHION_MNIST_REMOTE", _remotes_for(files))
    path = fetch("fashion_mnist", tmp_path / "data", base_url=(tmp_path / "server").as_uri())
    assert path == tmp_path / "data" / "fashion_mnist"
    assert locate("fashion_mnist", tmp_path / "data").source == "explicit"


def test_fetch_rejects_datasets_without_a_url():
    with pytest.raises(ValueError, match="no download URL.*MNIST IDX files"):
        fetch("mnist")


def test_locate_downloads_as_last_resort_when_online(tmp_path, monkeypatch):
    monkeypatch.delenv("DPFL_OFFLINE")
    files = _fake_fmnist_remote(tmp_path)
    monkeypatch.setattr(catalog, "_FASHION_MNIST_REMOTE", _remotes_for(files))
    monkeypatch.setattr(download, "_open_url", _Server(files))
    loc = locate("fashion_mnist")
    assert (loc.source, loc.path) == ("download", cache_root() / "fashion_mnist")
    assert locate("fashion_mnist").source == "cache"


def test_download_failure_is_reported_in_not_found_error(tmp_path, monkeypatch):
    monkeypatch.delenv("DPFL_OFFLINE")
    monkeypatch.setattr(download, "_open_url", _Server({}, fail=True))
    with pytest.raises(DatasetNotFoundError, match="failed: could not download .*network is unreachable"):
        locate("fashion_mnist")
    with pytest.raises(DatasetNotFoundError, match=r"skipped \(download=False\)"):
        locate("fashion_mnist", download=False)


def test_official_checksums_accept_recompressed_or_raw_content(tmp_path):
    raw = b"\x00\x00\x08\x01\x00\x00\x00\x02\x05\x07"
    archive = gzip.compress(raw, mtime=1)
    remote = RemoteFile(
        "x.gz", md5=hashlib.md5(archive).hexdigest(), sha256=hashlib.sha256(archive).hexdigest(),
        raw_sha256=hashlib.sha256(raw).hexdigest(),
    )
    assert download.content_matches(archive, remote)
    assert download.content_matches(gzip.compress(raw, compresslevel=1, mtime=2), remote)  # different bytes
    assert download.content_matches(raw, remote)
    assert not download.content_matches(gzip.compress(raw + b"\x00"), remote)
    assert not download.content_matches(archive[:-3], remote)


@pytest.mark.needs_fmnist
def test_debian_files_match_the_official_content(fmnist_dir, monkeypatch, file_url_opener):
    monkeypatch.setattr(catalog, "SYSTEM_LOCATIONS", {"fashion_mnist": (fmnist_dir,)})
    for remote in catalog.source_spec("fashion_mnist").remote:
        download.verify_file(fmnist_dir / remote.filename, remote)
    # The system copy serves as a file:// mirror: the real checksums accept it.
    path = fetch("fashion_mnist", base_url=fmnist_dir.as_uri())
    expected = sorted(r.filename for r in catalog.source_spec("fashion_mnist").remote)
    assert sorted(p.name for p in path.iterdir()) == expected
    assert locate("fashion_mnist").source == "cache"


def test_verify_file_rejects_other_content(tmp_path):
    remote = catalog.source_spec("fashion_mnist").remote[3]
    (tmp_path / "f").write_bytes(gzip.compress(b"not fashion"))
    with pytest.raises(ChecksumError, match=remote.sha256):
        download.verify_file(tmp_path / "f", remote)


# --- available ---------------------------------------------------------------------------------


def test_available_describes_every_dataset(tmp_path, monkeypatch):
    monkeypatch.setenv("DPFL_DATA", str(tmp_path))
    write_mnist_files(tmp_path / "mnist")
    write_mnist_files(tmp_path / "emnist", prefix="emnist-digits-", test_part="test")
    rows = available()
    assert {r["name"] for r in rows} == set(DATASETS)
    by_name = {r["name"]: r for r in rows}
    assert by_name["mnist"]["path"] == tmp_path / "mnist" and by_name["mnist"]["source"] == "env"
    assert by_name["emnist"]["options"] == {"split": "digits"}
    assert by_name["cifar10"] == {"name": "cifar10", "path": None, "source": "missing", "fetchable": False,
                                  "options": {}}
    assert by_name["fashion_mnist"]["fetchable"] is True and by_name["fashion_mnist"]["path"] is None
    assert by_name["digits"]["source"] == "embedded"
    assert all(set(r) == {"name", "path", "source", "fetchable", "options"} for r in rows)
