"""How much of a private image an attack recovered (spec bidirectional.md §10, "Setup and metrics").

PSNR and pixel MSE compare a reconstruction with the true image; both reward pixel agreement only. The feature MSE
compares the two in the penultimate space of a small non-private classifier, which tracks whether the *content* (the
digit, the object) leaked even when pixels are off. The extractor is trained here, on data the caller declares public,
with a fixed seed, so evaluations are reproducible offline (nothing is downloaded).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

PSNR_CAP_DB = 100.0  # PSNR of an exact reconstruction (MSE 0) instead of +inf, so means stay finite


def _check_pair(x: torch.Tensor, ref: torch.Tensor) -> None:
    if x.shape != ref.shape:
        raise ValueError(f"reconstruction and reference must have the same shape, got {tuple(x.shape)} and "
                         f"{tuple(ref.shape)}")
    if x.dim() < 2 or x.shape[0] == 0:
        raise ValueError(f"expected a non-empty batch of images [B, ...], got shape {tuple(x.shape)}")


def _per_image_mse(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    _check_pair(x, ref)
    return (x.detach().to(torch.float64) - ref.detach().to(torch.float64)).pow(2).flatten(1).mean(1)


def image_mse(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Pixel MSE per image, averaged over the batch (images in [0, 1])."""
    return float(_per_image_mse(x, ref).mean())


def psnr(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Mean over the batch of 10 log10(1 / MSE) per image, in dB, for images in [0, 1] (peak value 1).

    Per image, then the mean (as in the inversion literature), so one perfect image cannot hide a failed one
    behind a small pooled MSE. An exact image scores PSNR_CAP_DB (the cap keeps the mean finite).
    """
    if ref.numel() and (float(ref.min()) < 0.0 or float(ref.max()) > 1.0):
        raise ValueError("psnr expects reference images in [0, 1] (peak value 1); rescale them first")
    mse = _per_image_mse(x, ref)
    db = [PSNR_CAP_DB if m == 0.0 else min(PSNR_CAP_DB, 10.0 * math.log10(1.0 / m)) for m in mse.tolist()]
    return sum(db) / len(db)


def feature_mse(extractor: nn.Module, x: torch.Tensor, ref: torch.Tensor) -> float:
    """Mean squared difference of the extractor's penultimate features (over features, then over the batch)."""
    _check_pair(x, ref)
    like = next(iter(extractor.parameters()), x)  # float64 reconstructions into a float32 extractor, on its device
    dtype, device = like.dtype, like.device
    was_training = extractor.training
    extractor.eval()
    try:
        with torch.no_grad():
            fx, fr = (extractor(t.detach().to(device=device, dtype=dtype)) for t in (x, ref))
    finally:
        extractor.train(was_training)
    return float((fx.to(torch.float64) - fr.to(torch.float64)).pow(2).flatten(1).mean(1).mean())


class FeatureExtractor(nn.Module):
    """A classifier split into `body` (input -> penultimate features) and `head`; calling it gives features."""

    def __init__(self, body: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.body = body
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _build(input_shape: tuple[int, ...], n_classes: int, width: int) -> FeatureExtractor:
    if len(input_shape) == 1:  # flat inputs: an MLP
        body: nn.Module = nn.Sequential(nn.Linear(input_shape[0], 2 * width), nn.ReLU(),
                                        nn.Linear(2 * width, width), nn.ReLU())
    else:  # images [C, H, W]: two conv blocks; adaptive pooling makes any H, W >= 1 work
        c = input_shape[0]
        body = nn.Sequential(
            nn.Conv2d(c, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32 * 4, width), nn.ReLU(),
        )
    return FeatureExtractor(body, nn.Linear(width, n_classes))


def train_feature_extractor(
    x: torch.Tensor,
    y: torch.Tensor,
    n_classes: int,
    seed: int,
    epochs: int = 15,
    *,
    width: int = 64,
    batch_size: int = 64,
    lr: float = 3e-3,
) -> FeatureExtractor:
    """Train a small non-private CNN ([N, C, H, W] inputs) or MLP ([N, D]) on public data; return its feature map.

    Deterministic given `seed`: the initial weights are drawn inside `torch.random.fork_rng` (the caller's global RNG
    is left as it was) and the batches are shuffled by a seeded torch.Generator. The returned module is in eval mode
    and maps inputs to `width` penultimate features; `.logits(x)` gives class scores.
    """
    if x.dim() not in (2, 4):
        raise ValueError(f"x must be flat [N, D] or images [N, C, H, W], got shape {tuple(x.shape)}")
    if y.dim() != 1 or y.shape[0] != x.shape[0]:
        raise ValueError(f"y must hold one label per input ({x.shape[0]}), got shape {tuple(y.shape)}")
    if x.shape[0] == 0:
        raise ValueError("no training data")
    if n_classes < 2 or int(y.min()) < 0 or int(y.max()) >= n_classes:
        raise ValueError(f"labels must lie in [0, n_classes) with n_classes >= 2, got n_classes={n_classes} and "
                         f"labels in [{int(y.min())}, {int(y.max())}]")
    if epochs < 1 or batch_size < 1 or width < 1:
        raise ValueError(f"epochs, batch_size and width must be positive, got {epochs}, {batch_size}, {width}")
    x = x.detach().to(torch.float32)
    y = y.detach().long()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _build(tuple(x.shape[1:]), n_classes, width)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(x.shape[0], generator=gen)
        for start in range(0, x.shape[0], batch_size):
            idx = order[start:start + batch_size]
            opt.zero_grad()
            F.cross_entropy(model.logits(x[idx]), y[idx]).backward()
            opt.step()
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model
