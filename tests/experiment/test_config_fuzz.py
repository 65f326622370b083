"""Config input as a user meets it: the example configs, broken on purpose, run through `dpfl run`.

Every mutation makes the config INVALID by construction: wrong types, NaN / inf / negative / zero /
out-of-limit numbers, unknown keys at any depth, unknown names, wrong list lengths, documents that are
empty, not a mapping, not YAML or with duplicate keys, and malformed ``--set`` options. Before the CLI
sees a case, ``load_config`` must reject it with a ``ConfigError`` (so a generator bug can never start a
training run, and the library API raises nothing else). Then ``dpfl run CONFIG --out DIR --set ...``,
in-process as a user runs it, must exit with code 2, print exactly one line ``error: ...`` on stderr,
show no traceback, and leave no run directory: the config is validated and the run built before the
directory is created.

Reproducible (``derandomize=True``, no example database); the whole file takes well under a minute.

The integration tier (``make test-integration``) runs it: ~80 s of CPU over 77 tests (thousands of ``dpfl run``
invocations). tests/experiment/test_config.py's random documents and replacements stay in the default tier.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from cli_runner import cli
from dpfl.experiment.config import (
    ALGORITHM_PARAMS,
    BUDGET_DISTRIBUTION_MODELS,
    AlgorithmConfig,
    BatchSizeChoice,
    ConfigError,
    PrivacyConfig,
    RunConfig,
    TrainingConfig,
    config_to_yaml,
    load_config,
    parse_yaml,
)
from dpfl.experiment.config.limits import (
    MAX_BATCH_SIZE,
    MAX_CLIENTS,
    MAX_DEPTH,
    MAX_ITERATIONS,
    MAX_LOCAL_EPOCHS,
    MAX_LOCAL_STEPS,
    MAX_NOISE_MULTIPLIER,
    MAX_ROUNDS,
)

pytestmark = pytest.mark.integration  # see the module docstring

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
CONVEX_STUDIES = CONFIGS / "splitting" / "convex"  # settings of `dpfl reproduce splitting`, not run configs (their own
# schema, checked in tests/reproduce/test_splitting_study.py)
EXAMPLES = sorted(p for p in CONFIGS.rglob("*.yaml") if CONVEX_STUDIES not in p.parents)  # configs/mpdp/ included
# Every example, resolved (every field written out, defaults included), so that mutations reach every field.
BASES: list[dict[str, Any]] = [parse_yaml(config_to_yaml(load_config(p))) for p in EXAMPLES]
NAMES = [p.relative_to(CONFIGS).as_posix() for p in EXAMPLES]

FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
WIDE = settings(FUZZ, max_examples=120)  # the mutations with the most cases to sample from

FieldPath = tuple[str, ...]


def test_the_examples_are_there():
    names = set(NAMES)
    assert {"demo.yaml", "digits_udp.yaml", "fmnist_dpsgd.yaml", "fmnist_central.yaml",
            "hdp_fmnist_mixgauss1.yaml"} <= names
    assert any(n.startswith("fdp/") for n in names) and any(n.startswith("fedceo/") for n in names)
    assert any(n.startswith("hdp/") for n in names)
    assert {"mpdp/ci_digits_mlp.yaml", "mpdp/full_c10_k100_paper.yaml"} <= names  # MP-DP's are run configs too
    assert all(b["data"]["clients"] > 1 for b in BASES)  # a one-entry list is a wrong length everywhere


# ---- running a case as a user would ---------------------------------------------------------------------


def dump(doc: Any) -> str:
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, allow_unicode=True)


def refused(text: str | bytes, sets: Sequence[str] = ()) -> None:
    """`text` as a config file plus `--set`s: load_config raises a ConfigError, and `dpfl run` fails cleanly."""
    with tempfile.TemporaryDirectory(prefix="dpfl-fuzz-") as tmp:
        config = Path(tmp) / "config.yaml"
        if isinstance(text, bytes):
            config.write_bytes(text)
        else:
            config.write_text(text, encoding="utf-8")
        try:
            load_config(config, list(sets))
        except ConfigError:
            pass
        else:  # the generator's fault, not dpfl's: never train on it
            pytest.fail(f"the mutation left a valid config: --set {list(sets)!r}\n{str(text)[:3000]}")
        out = Path(tmp) / "run"
        code, stdout, stderr = cli("run", config, "--out", out, *[a for s in sets for a in ("--set", s)])
        where = f"--set {list(sets)!r}, stderr {stderr[:600]!r}"
        assert "Traceback" not in stdout + stderr, where
        assert code == 2, where
        lines = stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), where
        assert not out.exists(), f"a run directory was left behind: {sorted(p.name for p in out.iterdir())}; {where}"


def with_value(doc: dict[str, Any], path: FieldPath, value: Any) -> dict[str, Any]:
    out = yaml.safe_load(yaml.safe_dump(doc))  # a deep copy in YAML's own types
    cur: Any = out
    for key in path[:-1]:
        cur = cur[int(key) if isinstance(cur, list) else key]
    cur[int(path[-1]) if isinstance(cur, list) else path[-1]] = value
    return out


# ---- what the bases hold ----------------------------------------------------------------------------------


def walk(node: Any, path: FieldPath = ()) -> Iterator[tuple[FieldPath, Any]]:
    yield path, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from walk(v, (*path, str(k)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk(v, (*path, str(i)))


FREE = {("data", "options"), ("model", "options")}  # free-form builder options: any value validates
# Fields whose value may be a number OR a string / list / mapping: their type mutations are chosen separately.
UNIONS = {("training", "batch_size"), ("privacy", "budgets"), ("algorithm", "params", "epsilon"),
          ("algorithm", "params", "layers"), ("algorithm", "params", "round1_batch")}  # round1_batch: 'full' or an int
UNLIMITED_OK = {("privacy", "budgets")}  # .inf: an unlimited budget


def free(path: FieldPath) -> bool:
    return path[:2] in FREE


def field_of(path: FieldPath) -> FieldPath:
    """The field a path names: list indices dropped (privacy.budgets.3 -> privacy.budgets)."""
    return tuple(p for p in path if not p.lstrip("-").isdigit())


def field_info(doc: dict[str, Any], path: FieldPath):
    """The pydantic FieldInfo behind `path` in `doc` (None for list items and free-form options)."""
    model: Any = RunConfig
    cur: Any = doc
    for i, key in enumerate(path):
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or key not in model.model_fields:
            return None
        info = model.model_fields[key]
        if i == len(path) - 1:
            return info
        cur = cur[key]
        if model is AlgorithmConfig and key == "params":
            model = ALGORITHM_PARAMS[doc["algorithm"]["name"]]
        elif model is PrivacyConfig and key == "budgets":
            model = BUDGET_DISTRIBUTION_MODELS.get(cur.get("distribution")) if isinstance(cur, dict) else None
        elif model is TrainingConfig and key == "batch_size":
            model = BatchSizeChoice if isinstance(cur, dict) else None
        else:
            model = info.annotation if isinstance(info.annotation, type) else None
    return None


def bounds(doc: dict[str, Any], path: FieldPath) -> dict[str, float]:
    info = field_info(doc, path)
    out: dict[str, float] = {}
    for m in info.metadata if info is not None else ():
        for key in ("gt", "ge", "lt", "le"):
            if getattr(m, key, None) is not None:
                out[key] = getattr(m, key)
    return out


# Upper limits (dpfl.experiment.config.limits) and natural ones (k <= clients, ids < clients).
LIMITED = {("data", "clients"): MAX_CLIENTS, ("training", "rounds"): MAX_ROUNDS,
           ("training", "local_steps"): MAX_LOCAL_STEPS, ("training", "local_epochs"): MAX_LOCAL_EPOCHS,
           ("training", "batch_size"): MAX_BATCH_SIZE, ("training", "batch_size", "values"): MAX_BATCH_SIZE,
           ("algorithm", "params", "max_iter"): MAX_ITERATIONS,
           ("algorithm", "params", "head_epochs"): MAX_LOCAL_EPOCHS,
           ("training", "selection", "k"): MAX_CLIENTS, ("privacy", "misreport", "client"): MAX_CLIENTS,
           ("privacy", "honest_clients"): MAX_CLIENTS, ("algorithm", "params", "public_clients"): MAX_CLIENTS,
           ("privacy", "noise_multiplier"): MAX_NOISE_MULTIPLIER}
# Numbers that must be > 0 as values or list items (budgets, batch sizes, step sizes): 0 is refused too.
POSITIVE = {("privacy", "budgets"), ("privacy", "budgets", "values"), ("training", "batch_size"),
            ("training", "batch_size", "values"), ("algorithm", "params", "step_sizes")}


SIGNED = {("data", "scaling", "mean")}  # public feature means: any finite number, negative ones included


def numbers(base: dict[str, Any]) -> Iterator[tuple[FieldPath, Any]]:
    for path, value in walk(base):
        if path and not free(path) and path[:3] not in SIGNED and isinstance(value, (int, float)) \
                and not isinstance(value, bool):
            yield path, value


def scalars(base: dict[str, Any]) -> Iterator[tuple[FieldPath, Any]]:
    for path, value in walk(base):
        if path and not free(path) and value is not None and not isinstance(value, (dict, list)):
            yield path, value


def bad_numbers(base: dict[str, Any], path: FieldPath, value: Any) -> list[Any]:
    """Numbers that `path` refuses, whatever the rest of the config says."""
    field = field_of(path)
    item = field != path
    out: list[Any] = [math.nan, -math.inf, -1, -0.5, -(10**12)]
    if field not in UNLIMITED_OK:
        out.append(math.inf)
    b = {} if item else bounds(base, path)
    if field in POSITIVE or b.get("gt", -1) >= 0 or b.get("ge", 0) >= 1:
        out.append(0)
    if field in LIMITED or "lt" in b or "le" in b:
        out += [10**15, 10**30] if isinstance(value, int) else [1e300]
    if isinstance(value, float) or field in UNLIMITED_OK:
        out.append(10**400)  # no float holds it
    return out


NUMBER_CASES = [(b, path, bad) for b, base in enumerate(BASES) for path, value in numbers(base)
                for bad in bad_numbers(base, path, value)]
TYPE_CASES = [(b, path, value) for b, base in enumerate(BASES) for path, value in scalars(base)
              if path not in UNIONS]


def wrong_types(value: Any) -> st.SearchStrategy[Any]:
    """Values of another type than `value`'s (strict validation: no coercion between any of them)."""
    text = st.text(max_size=8)
    containers = st.one_of(st.lists(st.integers(-3, 3), max_size=3), st.dictionaries(st.text(max_size=4),
                                                                                      st.integers(), max_size=2))
    if isinstance(value, bool):
        return st.one_of(st.integers(), st.floats(allow_nan=False), text, containers)
    if isinstance(value, int):
        return st.one_of(st.booleans(), text, containers, st.floats())  # strict: 2.0 is not an integer either
    if isinstance(value, float):
        return st.one_of(st.booleans(), text, containers)
    return st.one_of(st.booleans(), st.integers(), st.floats(allow_nan=False), containers)  # a string field


# ---- mutations of the document ---------------------------------------------------------------------------


@WIDE
@given(case=st.sampled_from(TYPE_CASES), data=st.data())
def test_wrong_types_are_refused(case, data):
    b, path, value = case
    refused(dump(with_value(BASES[b], path, data.draw(wrong_types(value)))))


@WIDE
@given(case=st.sampled_from(NUMBER_CASES))
def test_nan_inf_negative_zero_and_huge_numbers_are_refused(case):
    b, path, bad = case
    refused(dump(with_value(BASES[b], path, bad)))


MAPPINGS = [(b, path) for b, base in enumerate(BASES) for path, node in walk(base) if isinstance(node, dict)]


@FUZZ
@given(where=st.sampled_from(MAPPINGS), key=st.text(max_size=10),
       value=st.one_of(st.none(), st.integers(), st.text(max_size=5)))
def test_unknown_keys_at_any_depth_are_refused(where, key, value):
    b, path = where
    refused(dump(with_value(BASES[b], (*path, f"zz{key}"), value)))  # no field of dpfl starts with zz


NAME_FIELDS = [("data", "dataset"), ("model", "name"), ("algorithm", "name"), ("privacy", "mechanism"),
               ("privacy", "unit"), ("privacy", "observer"), ("privacy", "sampling"), ("privacy", "accountant"),
               ("privacy", "calibration"), ("privacy", "budgets", "distribution"), ("privacy", "budgets", "dist"),
               ("training", "batch_size"), ("training", "batch_size", "distribution"),
               ("training", "selection", "kind"),
               ("data", "partition"), ("device",), ("backend",), ("algorithm", "params", "schedule"),
               ("algorithm", "params", "split"), ("algorithm", "params", "weighting")]
NAME_CASES = [(b, path) for b, base in enumerate(BASES) for path in NAME_FIELDS if path in dict(walk(base))]


@FUZZ
@given(where=st.sampled_from(NAME_CASES), suffix=st.text(max_size=8))
def test_unknown_names_are_refused(where, suffix):
    b, path = where
    refused(dump(with_value(BASES[b], path, f"no_such_{suffix}")))


@FUZZ
@given(b=st.integers(0, len(BASES) - 1), field=st.sampled_from([("privacy", "budgets"), ("training", "batch_size")]),
       delta=st.integers(-40, 3).filter(bool), item=st.sampled_from([1, 2, 8]))
def test_per_client_lists_of_the_wrong_length_are_refused(b, field, delta, item):
    n = BASES[b]["data"]["clients"]
    refused(dump(with_value(BASES[b], field, [item] * max(0, n + delta))))


@pytest.mark.parametrize("field, value", [
    (("training", "batch_size"), {"distribution": "choice", "values": []}),
    (("training", "batch_size"), {"distribution": "choice", "values": [16, 32], "probs": [1.0]}),
    (("privacy", "budgets"), {"distribution": "choice", "values": []}),
    (("privacy", "budgets"), {"distribution": "choice", "values": [1.0, 2.0], "probs": [0.2, 0.2, 0.6]}),
    (("privacy", "budgets"), {"distribution": "rhdp20", "dist": "Dist5"}),  # 20 clients in the list
])
def test_distributions_of_the_wrong_length_are_refused(field, value):
    refused(dump(with_value(BASES[NAMES.index("demo.yaml")], field, value)))


# ---- documents that are not a config ---------------------------------------------------------------------

DEMO_TEXT = (CONFIGS / "demo.yaml").read_text()
DEMO_BUDGETS = "  budgets:\n    distribution: choice\n    values: [1, 2, 4, 8]\n"


def demo_with(old: str, new: str) -> str:
    assert old in DEMO_TEXT, old
    return DEMO_TEXT.replace(old, new)


BOMB = "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))  # 9^9 items


@pytest.mark.parametrize("text", [
    "", "   \n", "# only a comment\n", "---\n", "~\n", "null\n",  # empty
    "- demo\n- 1\n", "5\n", "hello\n", "true\n", "1e-5\n", "[1, {a: 2}]\n",  # not a mapping
    DEMO_TEXT + "---\n" + DEMO_TEXT,  # two documents
    demo_with("  clients: 10", "\tclients: 10"),  # a tab
    DEMO_TEXT + "\x00",
    demo_with("seed: 0", "seed: 2001-13-45"),  # a timestamp PyYAML cannot build
    demo_with("seed: 0", "seed: " + "9" * 5000),  # more digits than Python reads
    demo_with("seed: 0", "seed: !!bool maybe"),
    demo_with("seed: 0", "seed: !!int '-'"),
    demo_with("seed: 0", "seed: !!python/object:os.system 'echo'"),
    demo_with("seed: 0", "seed: *nowhere"),
    DEMO_TEXT + "extra: " + "[" * 3000 + "]" * 3000 + "\n",  # nested beyond the parser
    DEMO_TEXT + "extra: " + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5) + "\n",  # nested beyond dpfl's limit
    DEMO_TEXT + "extra: &x [*x]\n",  # a list inside itself
    demo_with(DEMO_BUDGETS, "  budgets: &x [*x]\n"),
    BOMB + DEMO_TEXT,  # an alias bomb, unknown keys
    BOMB + demo_with("  partition: iid\n", "  partition: iid\n  options: {zz: *i}\n"),  # ... in options
    BOMB + demo_with(DEMO_BUDGETS, "  budgets: *i\n"),
    demo_with("name: demo", "name: " + "n" * 100_000),
    demo_with("  clients: 10", "  clients: " + "1" + "0" * 400),
    demo_with("    lr: 2.0", "    lr: " + "1" + "0" * 400),
    demo_with(DEMO_BUDGETS, "  budgets: " + "1" + "0" * 400 + "\n"),
])
def test_documents_that_are_not_a_valid_config_are_refused(text):
    refused(text)


@pytest.mark.parametrize("raw", [b"\xff\xfe\x00garbage\x80", DEMO_TEXT.encode("utf-16")])
def test_files_that_are_not_utf8_are_refused(raw):
    refused(raw)


BROKEN = ["x: [1, 2\n", "x: {a: 1\n", "a: b: c\n", "@at: 1\n", "`tick: 1\n", "'quote: 1\n", "x: *undefined\n",
          "- item\n", "? [1]\n: 2\n", "%YAML 1.1\n"]


@FUZZ
@given(b=st.integers(0, len(BASES) - 1), data=st.data())
def test_invalid_yaml_anywhere_is_refused(b, data):
    lines = dump(BASES[b]).splitlines(keepends=True)
    at = data.draw(st.integers(0, len(lines)))
    refused("".join(lines[:at]) + data.draw(st.sampled_from(BROKEN)) + "".join(lines[at:]))


@FUZZ
@given(b=st.integers(0, len(BASES) - 1), data=st.data())
def test_duplicate_keys_are_refused(b, data):
    lines = dump(BASES[b]).splitlines(keepends=True)
    keyed = [i for i, line in enumerate(lines) if ":" in line and not line.lstrip().startswith("-")]
    i = data.draw(st.sampled_from(keyed))
    block = [lines[i]]  # the key with its nested block, repeated right after it
    indent = len(lines[i]) - len(lines[i].lstrip())
    for line in lines[i + 1:]:
        if len(line) - len(line.lstrip()) <= indent and not line.lstrip().startswith("- "):
            break
        block.append(line)
    refused("".join(lines[:i] + block + block + lines[i + len(block):]))


# ---- --set -------------------------------------------------------------------------------------------------

DEMO = NAMES.index("demo.yaml")
SCALAR_PATHS = [(b, path) for b, base in enumerate(BASES) for path, value in walk(base)
                if path and value is not None and not isinstance(value, (dict, list))]
LIST_PATHS = [(b, path, len(node)) for b, base in enumerate(BASES) for path, node in walk(base)
              if path and isinstance(node, list)]
SEGMENT = st.text(st.characters(blacklist_characters=".="), min_size=1, max_size=6).filter(str.strip)


@FUZZ
@given(text=st.text(max_size=20).filter(lambda s: "=" not in s))
def test_set_without_equals_is_refused(text):
    refused(DEMO_TEXT, [text])


@FUZZ
@given(parts=st.lists(SEGMENT, min_size=1, max_size=3), gap=st.data(), value=st.sampled_from(["1", "x", "[1]", ""]))
def test_set_with_an_empty_path_segment_is_refused(parts, gap, value):
    at = gap.draw(st.integers(0, len(parts)))
    path = [*parts[:at], gap.draw(st.sampled_from(["", " "])), *parts[at:]]
    refused(DEMO_TEXT, [".".join(path) + "=" + value])


@FUZZ
@given(where=st.sampled_from(SCALAR_PATHS), sub=SEGMENT)
def test_set_under_a_scalar_is_refused(where, sub):
    b, path = where
    refused(dump(BASES[b]), [".".join(path) + "." + sub.strip() + "=1"])


@FUZZ
@given(where=st.sampled_from(LIST_PATHS), beyond=st.integers(0, 10**30), data=st.data())
def test_set_beyond_a_list_is_refused(where, beyond, data):
    b, path, n = where
    index = data.draw(st.sampled_from([str(n + beyond), str(-(n + 1 + beyond)), "x", f"--{n}", "1.5"]))
    refused(dump(BASES[b]), [".".join(path) + "." + index + "=1"])


@FUZZ
@given(where=st.sampled_from(SCALAR_PATHS),
       value=st.sampled_from(["[", "{a", "a: b: c", "*undefined", "!!bool maybe", "'open", "@x", "`x", "[[[" * 400,
                              "9" * 5000, "2001-13-45", "!!python/name:os.system"]))
def test_set_with_a_value_that_is_not_yaml_is_refused(where, value):
    b, path = where
    refused(dump(BASES[b]), [".".join(path) + "=" + value])


@pytest.mark.parametrize("sets", [
    ["training.rounds=1000000000000000"], ["training.rounds=1000001"], ["data.clients=1000000000"],
    ["training.batch_size=1000000000000"], ["training.local_epochs=1e300"], ["training.local_epochs=10001"],
    ["training.batch_size=[1, 1, 1, 1, 1, 1, 1, 1, 1, 100000000000000000000000000000]"],
    ["training.batch_size={distribution: choice, values: [100000000000000000000000]}"],
    ["training.local_epochs=null", "training.local_steps=1000000000000"],
    ["training.optimizer.lr=" + "1" + "0" * 400], ["privacy.budgets=" + "1" + "0" * 400],
    ["privacy.budgets=[1, 1, 1, 1, 1, 1, 1, 1, 1, " + "1" + "0" * 400 + "]"],
    ["privacy.budgets=-.inf"], ["privacy.budgets=.nan"], ["privacy.delta=1e400"],
    ["algorithm={name: robust_hdp, params: {max_iter: 1000000000000000000000}}"],
    ["algorithm={name: pfa, params: {split: explicit, public_clients: [1000000000000000000000]}}"],
    ["algorithm={name: pfa, params: {split: explicit, public_clients: [-1]}}"],
    ["algorithm={name: pfa, params: {split: explicit, public_clients: [1, 1]}}"],
    ["algorithm={name: fedceo, params: {lam: 1, layers: true}}"],
    ["algorithm={name: min_eps, params: {epsilon: .inf}}"],
    ["algorithm={name: centaur, params: {head_epochs: 1e300}}", "model.name=mlp2"],
    ["privacy.misreport={client: 100000000000000000000, factor: 2}"],
    ["privacy.noise_multiplier=1e-160"], ["privacy.noise_multiplier=1e308"],  # beyond float64 accountants
])
def test_absurd_sizes_are_refused_before_anything_runs(sets):
    refused(DEMO_TEXT, sets)


def test_noisy_runs_cannot_plan_more_local_steps_than_the_step_size_table_holds():
    refused((CONFIGS / "fdp" / "sensitivity_ci.yaml").read_text(),
            ["training.rounds=1000000", "training.local_steps=1000000"])
