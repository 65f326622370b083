"""One silo read and checked as a user meets it: `dpfl.data.load_silo` on CSV, NPZ, NPY, Parquet and image folders,
and one-line DataErrors that name the file and the line, record or column."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from dpfl.data import DataError, Scaling, SiloSchema, load_silo
from dpfl.data.schema import refuse_fitted_scaling

TABLE = SiloSchema(3, {"age": "int64", "bp": "float32"}, label="y")
HEADER = "age,bp,y\n"


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def one_line_error(source, schema=TABLE, **kw) -> str:
    with pytest.raises(DataError) as info:
        load_silo(source, schema, **kw)
    message = str(info.value)
    assert "\n" not in message
    return message


# ---- CSV -------------------------------------------------------------------------------------------------------


def test_a_csv_silo_is_every_record_as_training_data(tmp_path):
    f = write(tmp_path / "a.csv", "y,bp,age\n0,120.5,60\n2,110,45\n\n1,130,70\n")  # any column order, blank line
    c = load_silo(f, TABLE)
    assert c.n_train == 3 and c.n_test == 0 and c.n_val == 0
    assert c.x_train.dtype == torch.float32 and c.x_train.tolist() == [[60, 120.5], [45, 110], [70, 130]]
    assert c.y_train.tolist() == [0, 2, 1]


@pytest.mark.parametrize("text, expected", [
    ("age,y\n1,0\n", "a.csv: column 'bp' is missing"),
    ("age,bp,y,zip\n1,2,0,9\n", "a.csv: column 'zip' is not declared in the schema"),
    ("age,bp,bp,y\n1,2,2,0\n", "column 'bp' appears 2 times"),
    (HEADER + "60,120,0\n61,abc,1\n", "a.csv, line 3, column 'bp': 'abc' is not a number (declared float32)"),
    (HEADER + "60.5,120,0\n", "a.csv, line 2, column 'age': '60.5' is not an integer (declared int64)"),
    (HEADER + "60,nan,0\n", "a.csv, line 2, column 'bp': NaN or infinite value"),
    (HEADER + "60,inf,0\n", "line 2, column 'bp': NaN or infinite value"),
    (HEADER + "60,,0\n", "a.csv, line 2, column 'bp': missing value"),
    (HEADER + "60,120,0\n60,120,3\n", "a.csv, line 3, column 'y': label 3 is outside the 3 declared classes (0..2"),
    (HEADER + "60,120,-1\n", "label -1 is outside the 3 declared classes"),
    (HEADER + "60,120,yes\n", "a.csv, line 2, column 'y': label 'yes' is not an integer class index"),
    (HEADER + "60,120\n", "a.csv, line 2: 2 fields, the header has 3"),
    (HEADER, "a.csv: no records"),
    ("", "a.csv: empty file"),
])
def test_a_csv_breaking_the_schema_is_one_line_naming_the_file_and_place(tmp_path, text, expected):
    assert expected in one_line_error(write(tmp_path / "a.csv", text))


def test_an_integer_column_must_fit_its_declared_dtype(tmp_path):
    schema = SiloSchema(2, {"count": "int8"}, label="y")
    message = one_line_error(write(tmp_path / "a.csv", "count,y\n3,0\n300,1\n"), schema)
    assert "a.csv, line 3, column 'count': 300 does not fit int8" in message


def test_a_missing_file_and_an_unknown_format_are_named(tmp_path):
    assert "nope.csv: no such file or folder" in one_line_error(tmp_path / "nope.csv")
    assert "unknown format '.txt'" in one_line_error(write(tmp_path / "a.txt", "x"))
    assert "a .npy file holds one array" in one_line_error(write(tmp_path / "a.npy", "x"))


def test_a_table_schema_refuses_an_array_silo_and_back(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.zeros((2, 2), np.float32), y=np.zeros(2, np.int64))
    assert "a npz silo, but the schema's features describe a table" in one_line_error(tmp_path / "a.npz")
    f = write(tmp_path / "a.csv", HEADER + "1,2,0\n")
    assert "a csv silo" in one_line_error(f, SiloSchema(3, shape=[2]))


# ---- NPZ and NPY ------------------------------------------------------------------------------------------------


ARRAYS = SiloSchema(4, shape=[2, 3], dtype="float32")


def test_npz_and_npy_silos(tmp_path):
    x = np.arange(24, dtype=np.float32).reshape(4, 2, 3)
    y = np.array([0, 3, 1, 1])
    np.savez(tmp_path / "a.npz", x=x, y=y)
    (tmp_path / "b").mkdir()
    np.save(tmp_path / "b" / "x.npy", x)
    np.save(tmp_path / "b" / "y.npy", y)
    for source in (tmp_path / "a.npz", tmp_path / "b"):
        c = load_silo(source, ARRAYS)
        assert torch.equal(c.x_train, torch.from_numpy(x)) and c.y_train.tolist() == [0, 3, 1, 1]


@pytest.mark.parametrize("x, y, expected", [
    (np.zeros((2, 2, 3), np.float64), np.zeros(2, np.int64), "x has dtype float64, the schema declares float32"),
    (np.zeros((2, 3, 2), np.float32), np.zeros(2, np.int64), "records have shape [3, 2], the schema declares [2, 3]"),
    (np.zeros((2, 2, 3), np.float32), np.zeros(2, np.float32), "y must be a 1-d array of integer class indices"),
    (np.zeros((2, 2, 3), np.float32), np.zeros(3, np.int64), "x has 2 records and y 3 labels"),
    (np.zeros((2, 2, 3), np.float32), np.array([0, 4]), "a.npz, record 1: label 4 is outside the 4 declared classes"),
    (np.full((2, 2, 3), np.nan, np.float32), np.zeros(2, np.int64), "a.npz, record 0, value 0: NaN or infinite"),
    (np.zeros((0, 2, 3), np.float32), np.zeros(0, np.int64), "a.npz: no records"),
])
def test_an_npz_breaking_the_schema_is_named(tmp_path, x, y, expected):
    np.savez(tmp_path / "a.npz", x=x, y=y)
    assert expected in one_line_error(tmp_path / "a.npz", ARRAYS)


def test_an_npz_without_its_arrays_and_a_corrupt_one(tmp_path):
    np.savez(tmp_path / "a.npz", features=np.zeros((2, 2, 3), np.float32))
    assert "array 'x' is missing" in one_line_error(tmp_path / "a.npz", ARRAYS)
    write(tmp_path / "b.npz", "not a zip")
    assert "b.npz: cannot read it as npz" in one_line_error(tmp_path / "b.npz", ARRAYS)
    (tmp_path / "c").mkdir()
    np.save(tmp_path / "c" / "x.npy", np.zeros((2, 2, 3), np.float32))
    assert "y.npy is missing" in one_line_error(tmp_path / "c", ARRAYS)


# ---- images -----------------------------------------------------------------------------------------------------


def images(root, counts, size=(4, 5), mode="L"):
    from PIL import Image

    for name, n in counts.items():
        (root / name).mkdir(parents=True)
        for i in range(n):
            Image.new(mode, size, color=(40 * i) if mode == "L" else (10, 20, 30)).save(root / name / f"{i}.png")
    return root


def test_an_image_folder_is_one_class_per_sub_folder(tmp_path):
    schema = SiloSchema(3, shape=[1, 5, 4], classes=["benign", "malignant", "unclear"])
    c = load_silo(images(tmp_path / "a", {"benign": 2, "malignant": 3}), schema)
    assert c.x_train.shape == (5, 1, 5, 4) and c.y_train.tolist() == [0, 0, 1, 1, 1]
    assert float(c.x_train.max()) == pytest.approx(80 / 255)
    rgb = load_silo(images(tmp_path / "b", {"0": 1, "1": 1}, mode="RGB"), SiloSchema(2, shape=[3, 5, 4]))
    assert rgb.x_train.shape == (2, 3, 5, 4) and rgb.x_train[0, 2, 0, 0] == pytest.approx(30 / 255)


def test_an_image_folder_breaking_the_schema_is_named(tmp_path):
    schema = SiloSchema(2, shape=[1, 5, 4], classes=["benign", "malignant"])
    bad_class = images(tmp_path / "a", {"benign": 1, "other": 1})
    assert "folder 'other' is not a declared class (label outside the classes" in one_line_error(bad_class, schema)
    small = images(tmp_path / "b", {"benign": 1}, size=(3, 3))
    assert "0.png: image is 3x3 (height x width), the schema declares 5x4" in one_line_error(small, schema)
    (tmp_path / "c" / "benign").mkdir(parents=True)
    write(tmp_path / "c" / "benign" / "x.png", "not an image")
    assert "x.png: cannot read the image" in one_line_error(tmp_path / "c", schema)
    (tmp_path / "d").mkdir()
    assert "d: no records" in one_line_error(tmp_path / "d", schema)


# ---- Parquet ----------------------------------------------------------------------------------------------------


def test_parquet_silos(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"age": pa.array([60, 45], pa.int64()), "bp": pa.array([120.5, 110], pa.float32()),
                             "y": pa.array([0, 2], pa.int32())}), tmp_path / "a.parquet")
    c = load_silo(tmp_path / "a.parquet", TABLE)
    assert c.x_train.tolist() == [[60, 120.5], [45, 110]] and c.y_train.tolist() == [0, 2]
    pq.write_table(pa.table({"age": pa.array([60, 45], pa.int64()), "bp": pa.array([120.5, 110], pa.float64()),
                             "y": pa.array([0, 2], pa.int64())}), tmp_path / "b.parquet")
    assert "b.parquet: column 'bp' is double (float64), the schema declares float32" in \
        one_line_error(tmp_path / "b.parquet")
    pq.write_table(pa.table({"age": pa.array([60, None], pa.int64()), "bp": pa.array([1, 2], pa.float32()),
                             "y": pa.array([0, 2], pa.int64())}), tmp_path / "c.parquet")
    assert "c.parquet, record 1, column 'age': missing value" in one_line_error(tmp_path / "c.parquet")
    pq.write_table(pa.table({"age": pa.array([60], pa.int64()), "bp": pa.array([1], pa.float32()),
                             "y": pa.array([7], pa.int64())}), tmp_path / "d.parquet")
    assert "d.parquet, record 0: label 7 is outside the 3 declared classes" in one_line_error(tmp_path / "d.parquet")


def test_parquet_without_pyarrow_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    write(tmp_path / "a.parquet", "PAR1")
    assert "a.parquet: reading Parquet needs pyarrow: pip install 'dpfl[parquet]'" in \
        one_line_error(tmp_path / "a.parquet")


# ---- the schema and the scaling --------------------------------------------------------------------------------


def test_public_scaling_is_applied_per_feature_or_channel(tmp_path):
    f = write(tmp_path / "a.csv", HEADER + "60,120,0\n40,100,1\n")
    c = load_silo(f, TABLE, scaling=Scaling(mean=[50, 110], std=[10, 5]))
    assert c.x_train.tolist() == [[1, 2], [-1, -2]]
    assert "3 means and stds for 2 values (one per feature column)" in \
        one_line_error(f, TABLE, scaling=Scaling([0, 0, 0], [1, 1, 1]))
    with pytest.raises(DataError, match="stds finite and > 0"):
        Scaling([0.0], [0.0])


@pytest.mark.parametrize("value", ["fit", "standardize", "minmax"])
def test_scaling_fitted_on_the_clients_records_is_refused_with_the_reason(value):
    with pytest.raises(DataError, match="depend on all the others"):
        refuse_fitted_scaling(value)
    refuse_fitted_scaling("none")


@pytest.mark.parametrize("kwargs, expected", [
    (dict(n_classes=0, features={"a": "float32"}), "n_classes must be an integer >= 1"),
    (dict(n_classes=2), "declare either features"),
    (dict(n_classes=2, features={"a": "float32"}, shape=[1]), "declare either features"),
    (dict(n_classes=2, features={"a": "text"}), "column 'a' has dtype 'text'"),
    (dict(n_classes=2, features={"label": "float32"}), "differ from the label column"),
    (dict(n_classes=2, shape=[0]), "positive sizes"),
    (dict(n_classes=2, shape=[1], classes=["a"]), "classes must be n_classes (2) distinct names"),
])
def test_a_schema_that_cannot_describe_records_is_refused(kwargs, expected):
    with pytest.raises(DataError) as info:
        SiloSchema(**kwargs)
    assert expected in str(info.value)
