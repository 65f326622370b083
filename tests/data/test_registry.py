import pickle

import numpy as np
import pytest
import torch

from dpfl.data import DATASETS, ArrayDataset, load_dataset
from dpfl.data.arrays import images_to_tensor
from dpfl.data.cifar import read_cifar_batch

from .fakes import cifar_images, write_cifar10, write_cifar100, write_mnist_files

pytestmark = pytest.mark.usefixtures("no_system_data")


def test_registry_names():
    assert set(DATASETS) == {"digits", "fashion_mnist", "mnist", "emnist", "cifar10", "cifar100", "synthetic"}


def test_digits_is_embedded_with_a_fixed_stratified_split():
    ds = load_dataset("digits")
    assert ds.input_shape == (1, 8, 8) and ds.n_classes == 10
    assert (ds.n_train, ds.n_test) == (1438, 359)  # 1797 samples, round(0.2 * 1797) test
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    assert float(ds.x_train.min()) == 0.0 and float(ds.x_train.max()) == 1.0
    # pixels are 0..16, so every value is a multiple of 1/16
    assert torch.equal(ds.x_train * 16, (ds.x_train * 16).round())
    train_counts = torch.bincount(ds.y_train, minlength=10)
    test_counts = torch.bincount(ds.y_test, minlength=10)
    share = test_counts.double() / (train_counts + test_counts).double()
    assert torch.all((share - 0.2).abs() < 0.01)
    again = load_dataset("digits")
    assert torch.equal(ds.x_test, again.x_test) and torch.equal(ds.y_test, again.y_test)


def test_normalize_is_applied_after_scaling():
    plain = load_dataset("digits")
    norm = load_dataset("digits", normalize=(0.25, 0.5))
    torch.testing.assert_close(norm.x_train, (plain.x_train - 0.25) / 0.5)


def test_per_channel_normalize_and_its_validation():
    images = np.full((2, 3, 2, 2), 255, dtype=np.uint8)
    x = images_to_tensor(images, normalize=((0.0, 0.5, 1.0), (1.0, 0.5, 2.0)))
    assert x[0, :, 0, 0].tolist() == [1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="one value per channel"):
        images_to_tensor(images, normalize=((0.1, 0.2), 1.0))
    with pytest.raises(ValueError, match="std must be > 0"):
        images_to_tensor(images, normalize=(0.0, 0.0))
    with pytest.raises(ValueError, match=r"\(mean, std\) pair"):
        images_to_tensor(images, normalize=0.5)


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
@pytest.mark.parametrize("compress", [True, False])
def test_mnist_family_from_idx_files(tmp_path, name, compress):
    truth = write_mnist_files(tmp_path / name, n_train=7, n_test=3, compress=compress)
    ds = load_dataset(name, tmp_path)
    assert ds.name == name and ds.n_classes == 10 and ds.input_shape == (1, 28, 28)
    assert ds.x_train.shape == (7, 1, 28, 28) and ds.x_test.shape == (3, 1, 28, 28)
    torch.testing.assert_close(ds.x_train[:, 0], torch.from_numpy(truth["x_train"]).float() / 255)
    assert ds.y_test.tolist() == truth["y_test"].tolist()


def test_emnist_letters_are_transposed_back_and_shifted_to_zero(tmp_path):
    truth = write_mnist_files(
        tmp_path / "emnist" / "gzip", prefix="emnist-letters-", test_part="test", label_range=(1, 27),
        transpose=True, n_train=9,
    )
    ds = load_dataset("emnist", tmp_path, split="letters")
    assert ds.n_classes == 26
    np.testing.assert_array_equal((ds.x_train[:, 0] * 255).round().to(torch.uint8).numpy(), truth["x_train"])
    assert ds.y_train.tolist() == (truth["y_train"].astype(int) - 1).tolist()
    assert int(ds.y_train.min()) >= 0


def test_emnist_other_splits_keep_labels(tmp_path):
    truth = write_mnist_files(tmp_path, prefix="emnist-balanced-", test_part="test", label_range=(0, 47))
    ds = load_dataset("emnist", tmp_path, split="balanced")
    assert ds.n_classes == 47 and ds.y_test.tolist() == truth["y_test"].tolist()
    with pytest.raises(ValueError, match="split must be one of"):
        load_dataset("emnist", tmp_path, split="letter")


def test_idx_image_label_count_mismatch_is_an_error(tmp_path):
    write_mnist_files(tmp_path, n_train=4)
    other = write_mnist_files(tmp_path / "other", n_train=5)
    labels = (tmp_path / "other" / "train-labels-idx1-ubyte.gz").read_bytes()
    (tmp_path / "train-labels-idx1-ubyte.gz").write_bytes(labels)
    assert len(other["y_train"]) == 5
    with pytest.raises(ValueError, match="4 images but 5 labels"):
        load_dataset("mnist", tmp_path)


def test_cifar10_batches_in_order_with_rgb_planes(tmp_path):
    truth = write_cifar10(tmp_path / "cifar10" / "cifar-10-batches-py")
    ds = load_dataset("cifar10", tmp_path)
    assert ds.x_train.shape == (15, 3, 32, 32) and ds.x_test.shape == (4, 3, 32, 32)
    assert ds.input_shape == (3, 32, 32) and ds.n_classes == 10
    assert ds.y_train.tolist() == truth["y_train"].tolist()
    # sample 1 of batch 1 has R, G, B = 60, 61, 62 everywhere
    expected = torch.tensor([60.0, 61.0, 62.0]) / 255
    torch.testing.assert_close(ds.x_train[1].mean(dim=(1, 2)), expected)
    assert float(ds.x_train[1].std(dim=(1, 2)).max()) == 0.0


def test_cifar100_fine_and_coarse_labels(tmp_path):
    truth = write_cifar100(tmp_path / "cifar-100-python")
    fine = load_dataset("cifar100", tmp_path)
    assert fine.n_classes == 100 and fine.y_train.tolist() == truth["fine_train"].tolist()
    coarse = load_dataset("cifar100", tmp_path, labels="coarse")
    assert coarse.n_classes == 20 and coarse.y_test.tolist() == truth["coarse_test"].tolist()


def test_cifar_reader_refuses_arbitrary_pickled_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps({b"data": cifar_images(1, 0), b"labels": [Evil()]}, protocol=2))
    with pytest.raises(ValueError, match=r"refusing to load \w+\.print"):
        read_cifar_batch(path)


def test_cifar_reader_checks_the_layout(tmp_path):
    path = tmp_path / "b"
    path.write_bytes(pickle.dumps({b"data": np.zeros((2, 100), dtype=np.uint8), b"labels": [0, 1]}, protocol=2))
    with pytest.raises(ValueError, match=r"shape \(N, 3072\)"):
        read_cifar_batch(path)


def test_synthetic_classification_is_seeded():
    a = load_dataset("synthetic", n_samples=500, n_features=6, n_classes=3, seed=4)
    b = load_dataset("synthetic", n_samples=500, n_features=6, n_classes=3, seed=4)
    c = load_dataset("synthetic", n_samples=500, n_features=6, n_classes=3, seed=5)
    assert a.input_shape == (6,) and a.n_classes == 3 and (a.n_train, a.n_test) == (400, 100)
    assert torch.equal(a.x_train, b.x_train) and not torch.equal(a.x_train, c.x_train)
    counts = torch.bincount(torch.cat([a.y_train, a.y_test]))
    assert counts.max() - counts.min() <= 1
    # the classes are separable enough that class means differ clearly
    means = torch.stack([a.x_train[a.y_train == k].mean(0) for k in range(3)])
    assert torch.cdist(means, means).fill_diagonal_(1e9).min() > 0.5
    with pytest.raises(ValueError, match="n_classes must be an int >= 2"):
        load_dataset("synthetic", n_classes=1)


def test_unknown_names_and_options_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="dataset must be one of digits, .*got 'fmnist'"):
        load_dataset("fmnist")
    with pytest.raises(ValueError, match="unknown option.*normalise.*allowed: normalize, download"):
        load_dataset("mnist", normalise=(0.1, 0.3))
    with pytest.raises(ValueError, match="root must be None"):
        load_dataset("digits", tmp_path)


def test_array_dataset_validates_its_contents():
    x = torch.zeros(3, 2)
    y = torch.tensor([0, 1, 2])
    ArrayDataset("ok", x, y, x, y, n_classes=3)
    with pytest.raises(ValueError, match=r"y_train labels must lie in \[0, 2\), got range \[0, 2\]"):
        ArrayDataset("bad", x, y, x, y, n_classes=2)
    with pytest.raises(ValueError, match="x_test must be a float32 tensor"):
        ArrayDataset("bad", x, y, x.double(), y, n_classes=3)
    with pytest.raises(ValueError, match="has 3 samples but y_train has 2"):
        ArrayDataset("bad", x, y[:2], x, y, n_classes=3)


@pytest.mark.needs_fmnist
def test_real_fashion_mnist_from_the_debian_package(fmnist_dir, monkeypatch):
    from dpfl.data import catalog

    monkeypatch.setattr(catalog, "SYSTEM_LOCATIONS", {"fashion_mnist": (fmnist_dir,)})
    ds = load_dataset("fashion_mnist")
    assert ds.x_train.shape == (60000, 1, 28, 28) and ds.x_test.shape == (10000, 1, 28, 28)
    assert torch.bincount(ds.y_train).tolist() == [6000] * 10
    assert torch.bincount(ds.y_test).tolist() == [1000] * 10
    assert float(ds.x_train.min()) == 0.0 and float(ds.x_train.max()) == 1.0
    assert 0.2 < float(ds.x_train.mean()) < 0.4  # Fashion-MNIST's mean pixel is about 0.286
