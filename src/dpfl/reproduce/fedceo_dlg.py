"""FedCEO's gradient-inversion hook (spec fedceo.md §8), the offline variant: `mlp2` on Fashion-MNIST.

The paper (Fig. 3) runs DLG on one client's upload and reports PSNR for non-private FedAvg, UDP-FedAvg and FedCEO
(attacked after T-tSVD): both DP methods resist, FedAvg leaks. This study runs the same comparison through
`dpfl.evaluate.probe` on FedCEO's ci config: client 0 holds one private-class record and takes one local step;
the points are FedAvg's upload (no privacy), the DP-SGD upload at each σ_g (what the server receives from
UDP-FedAvg and from FedCEO alike: the mechanism is the same), and FedCEO's smoothed model ŵ_0 after smoothing j
(the round's K clients train, the server smooths at ϑ^j / (2λ)). Each point runs DLG and Inverting Gradients
(`invert_probe`, labels known, one feature extractor for all points) and is saved as OUT/<point>/inversion.{json,png},
so an interrupted study resumes; OUT/dlg.{csv,md} summarise, next to two references that need no attack: the
mean image of the public classes and the attack's uniform-noise start, scored against the same record.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dpfl.attacks.figures import reconstruction_grid
from dpfl.attacks.image_metrics import psnr
from dpfl.evaluate.probe import INVERSION_METRICS, inversion_metrics, invert_probe, probe_round, shared_extractor
from dpfl.experiment.config import RunConfig, config_to_dict, load_config, validate_config
from dpfl.reproduce.jobs import config_dir
from dpfl.reproduce.tables import csv_text, md_table
from dpfl.results.environment import computed_and_written, describe_job, job_executions
from dpfl.results.run_files import write_json_atomic, write_text_atomic

__all__ = ["COLUMNS", "DlgPoint", "dlg_points", "run_dlg_study"]

CONFIG = "ci_fmnist_mlp.yaml"  # configs/fedceo/: mlp2, lr 0.1, clip 1, K = 5, FedCEO lam 0.5, theta 1.04
SIGMAS = (1.0, 1.5, 2.0)
SMOOTHINGS = (1, 4)
STEPS = 300  # the paper's DLG iterations
COLUMNS = ["point", "sigma_g", "attacked", "after_smoothing", "dlg_psnr", "ig_psnr", "dlg_image_mse", "ig_image_mse",
           "dlg_feature_mse", "ig_feature_mse", "steps"]


@dataclass(frozen=True)
class DlgPoint:
    name: str
    sigma_g: float | None  # None: FedAvg, no noise
    smoothing: int | None  # None: the upload itself
    config: RunConfig

    @property
    def attacked(self) -> str:
        if self.sigma_g is None:
            return "FedAvg upload (not private)"
        if self.smoothing is None:
            return "DP-SGD upload (UDP-FedAvg's and FedCEO's)"
        return f"FedCEO smoothed model, smoothing {self.smoothing}"


def dlg_points(base: RunConfig, sigmas: Sequence[float] = SIGMAS,
               smoothings: Sequence[int] = SMOOTHINGS) -> list[DlgPoint]:
    """FedAvg, then per σ_g the upload and the smoothed model after each smoothing j (base: a FedCEO config)."""
    if base.algorithm.name != "fedceo":
        raise ValueError(f"the DLG study needs a FedCEO config, got algorithm {base.algorithm.name!r}")
    plain = config_to_dict(base)
    plain["algorithm"], plain["privacy"] = {"name": "fedavg"}, {"mechanism": "none"}
    points = [DlgPoint("fedavg", None, None, validate_config(plain))]
    for sigma in sigmas:
        d = config_to_dict(base)
        d["privacy"]["noise_multiplier"] = float(sigma)
        cfg = validate_config(d)
        points.append(DlgPoint(f"upload-sg{sigma}", float(sigma), None, cfg))
        points += [DlgPoint(f"smoothed{j}-sg{sigma}", float(sigma), int(j), cfg) for j in smoothings]
    return points


def run_dlg_study(out: Path, base: RunConfig | None = None, *, steps: int = STEPS,
                  sigmas: Sequence[float] = SIGMAS, smoothings: Sequence[int] = SMOOTHINGS, command: str = "",
                  progress: Callable[[str], None] | None = None) -> tuple[Path, Path, list[dict[str, Any]]]:
    """Every point's attacks (saved points are reused), then OUT/dlg.{csv,md}."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    out = Path(out)
    base = base if base is not None else load_config(config_dir("fedceo") / CONFIG)
    points = dlg_points(base, sigmas, smoothings)
    cache: dict[Any, Any] = {}  # shared_extractor's: one feature extractor per public records
    rows, environments = [], []
    for i, point in enumerate(points, 1):
        saved = out / point.name / "inversion.json"
        status = "saved before"
        if not (saved.is_file() and json.loads(saved.read_text()).get("steps") == steps):
            _attack(point, out / point.name, steps, cache)
            status = "attacked"
        report = json.loads(saved.read_text())
        if progress:
            progress(f"[{i}/{len(points)}] {point.name}: {status}, PSNR DLG {report['attacks']['dlg']['psnr']:.1f} dB, "
                     f"IG {report['attacks']['inverting_gradients']['psnr']:.1f} dB")
        rows.append(_row(point, report))
        environments.append(job_executions(report))
    references = _references(points[0])
    csv_path = write_text_atomic(out / "dlg.csv", csv_text(rows, COLUMNS))
    md_path = write_text_atomic(out / "dlg.md", _markdown(rows, references, steps, command,
                                                          computed_and_written(environments, "point")))
    return csv_path, md_path, rows


def _attack(point: DlgPoint, d: Path, steps: int, cache: dict[Any, Any]) -> None:
    probe = probe_round(point.config, 1, point.smoothing)
    result = invert_probe(probe, steps, 0, shared_extractor(probe, 0, cache))  # trained once per public records
    reconstruction_grid(probe.x, {k: v["reconstruction"] for k, v in result.items()}, d / "inversion.png",
                        f"{point.name}: {point.attacked}")
    write_json_atomic(d / "inversion.json", {
        "point": point.name, "sigma_g": point.sigma_g, "after_smoothing": point.smoothing, "steps": steps,
        "observer": probe.observer, "attacks": inversion_metrics(result), "environment": describe_job()})


def _row(point: DlgPoint, report: dict[str, Any]) -> dict[str, Any]:
    a = report["attacks"]
    return {"point": point.name, "sigma_g": point.sigma_g, "attacked": point.attacked,
            "after_smoothing": point.smoothing, "steps": report["steps"],
            **{f"{short}_{m}": a[name][m] for short, name in (("dlg", "dlg"), ("ig", "inverting_gradients"))
               for m in INVERSION_METRICS}}


def _references(first: DlgPoint) -> dict[str, float]:
    """PSNR against the attacked record of guesses that use no upload: the public classes' mean image, and the
    uniform noise every attack starts from (seed 0, as `invert_probe`)."""
    probe = probe_round(first.config, 1)  # the record every point attacks (the same split and pick)
    x = probe.x.to(torch.float64)
    mean = probe.public[0].to(torch.float64).mean(0, keepdim=True).expand_as(x)
    start = torch.rand(tuple(x.shape), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    return {"mean public image": psnr(mean, x), "uniform noise (the attacks' start)": psnr(start, x)}


def _markdown(rows: Sequence[dict[str, Any]], references: dict[str, float], steps: int, command: str,
              provenance_line: str) -> str:
    lines = ["# FedCEO: gradient inversion of one client (spec fedceo.md §8, offline variant)", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    lines += [provenance_line, ""]
    lines += [f"One record, one local step; DLG and Inverting Gradients ({steps} steps, labels known), PSNR in dB on "
              "[0, 1] pixels (higher = more leakage). The server receives the DP-SGD upload of UDP-FedAvg and of "
              "FedCEO alike; FedCEO's smoothed model is what it hands back.", ""]
    body = [[r["attacked"], "–" if r["sigma_g"] is None else f"{r['sigma_g']:g}", f"{r['dlg_psnr']:.1f}",
             f"{r['ig_psnr']:.1f}", f"{r['ig_image_mse']:.4f}"] for r in rows]
    lines += md_table(["attacked", "σ_g", "DLG PSNR", "IG PSNR", "IG image MSE"], body)
    lines += ["", "References that use no upload: "
              + "; ".join(f"{name} {value:.1f} dB" for name, value in references.items()) + "."]
    return "\n".join(lines) + "\n"
