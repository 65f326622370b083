"""Gradient inversion by an honest-but-curious server (spec bidirectional.md §10, "Gradient inversion by the server").

The server sees a client's upload and the model it was computed at, and searches for inputs whose gradient matches
the upload. Two classic attacks:

- DLG (Zhu et al., "Deep Leakage from Gradients", arXiv 1906.08797): L2 distance between gradients, L-BFGS.
- Inverting Gradients (Geiping et al., "Inverting Gradients - How easy is it to break privacy in federated
  learning?", arXiv 2003.14053): 1 - cosine similarity of the flattened gradients plus total variation, Adam, images
  kept in [0, 1].

Both assume the attacker knows the labels (the spec's setting; for batch 1 they can also be read off the last layer's
gradient). The module is generic: a model, the observed gradient, the labels and the input shape. Adapting an
algorithm's upload to "the gradient at these weights" is the caller's job (`gradient_from_update` covers a FedAvg
upload of one local step). Everything is deterministic given `seed`: dummies are drawn from a seeded
torch.Generator and no global RNG is touched. The attacks run where the model's parameters are (a CUDA model: on the
GPU); inputs, labels and targets are moved there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from dpfl.attacks.image_metrics import feature_mse, image_mse, psnr
from dpfl.engine.losses import per_sample_loss


@dataclass
class InversionResult:
    """The attack's output: `reconstruction` [B, ...] pairs with the labels by index.

    `loss` is the gradient-matching objective at the returned reconstruction (the best one seen: the attacker can
    evaluate it without knowing the truth, so keeping the best is legitimate). `steps` counts optimizer iterations.
    """

    reconstruction: torch.Tensor
    loss: float
    steps: int


def _params(model: nn.Module) -> list[torch.Tensor]:
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters, so there is no gradient to invert")
    return params


def _labels(labels: torch.Tensor, batch: int | None = None) -> torch.Tensor:
    labels = torch.as_tensor(labels)
    if labels.dim() != 1 or labels.is_floating_point():
        raise ValueError(f"labels must be a 1-D integer tensor (one class per example), got {labels.dtype} of "
                         f"shape {tuple(labels.shape)}")
    if batch is not None and labels.shape[0] != batch:
        raise ValueError(f"batch size {batch} (shape[0]) does not match the number of labels {labels.shape[0]}")
    return labels.long()


def _batch_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str) -> torch.Tensor:
    out = model(x)
    if int(y.min()) < 0 or int(y.max()) >= out.shape[-1]:
        raise ValueError(f"labels must lie in [0, {out.shape[-1]}) for this model, got [{int(y.min())}, "
                         f"{int(y.max())}]")
    return per_sample_loss(loss)(out, y).mean()


def observed_gradient(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str = "cross_entropy"
) -> list[torch.Tensor]:
    """The batch-mean gradient of the per-sample `loss` at the model's current weights, one tensor per parameter.

    This is what a FedSGD client sends. A FedAvg client that takes one local step of plain SGD with learning rate
    eta on this batch uploads update = w_new - w = -eta * gradient; `gradient_from_update` inverts that. Losses are
    the engine's (`dpfl.engine.losses`): "cross_entropy", "mse_onehot" (0.5 ||out - onehot||^2), ...
    The model's .grad fields are not touched.
    """
    if x.dim() < 2:
        raise ValueError(f"x must be a batch [B, ...], got shape {tuple(x.shape)}")
    params = _params(model)
    x, y = x.to(params[0].device), _labels(y, x.shape[0]).to(params[0].device)
    grads = torch.autograd.grad(_batch_loss(model, x, y, loss), params)
    return [g.detach() for g in grads]


def gradient_from_update(
    update: Sequence[torch.Tensor] | Mapping[str, torch.Tensor], lr: float
) -> list[torch.Tensor]:
    """-update / lr: the gradient behind a one-step SGD upload (update = new weights - old weights).

    Exact for one local step without momentum or weight decay; for several local steps it is only the average
    gradient along the trajectory, which the attacks then treat as one gradient (an approximation). A mapping
    (a state-dict delta) is read in its insertion order, which must follow `model.parameters()`.
    """
    if not (lr > 0 and lr < float("inf")):
        raise ValueError(f"lr must be positive and finite, got {lr}")
    tensors = list(update.values()) if isinstance(update, Mapping) else list(update)
    if not tensors:
        raise ValueError("the update is empty")
    return [-torch.as_tensor(u).detach() / lr for u in tensors]


def _check_targets(params: list[torch.Tensor], target_grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    targets = [torch.as_tensor(t).detach() for t in target_grads]
    if len(targets) != len(params):
        raise ValueError(f"target_grads has {len(targets)} tensors but the model has {len(params)} trainable "
                         f"parameters")
    for i, (p, t) in enumerate(zip(params, targets, strict=True)):
        if t.shape != p.shape:
            raise ValueError(f"target gradient {i} has shape {tuple(t.shape)}, the model parameter has "
                             f"{tuple(p.shape)}")
        if not torch.isfinite(t).all():
            raise ValueError(f"target gradient {i} has non-finite entries")
    return [t.to(device=p.device, dtype=p.dtype) for p, t in zip(params, targets, strict=True)]


def _setup(
    model: nn.Module, target_grads: Sequence[torch.Tensor], labels: torch.Tensor, shape: Sequence[int], steps: int
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor, tuple[int, ...]]:
    shape = tuple(int(s) for s in shape)
    if len(shape) < 2 or any(s < 1 for s in shape):
        raise ValueError(f"shape must be the full batch shape (B, ...) with positive sizes, got {shape}")
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    params = _params(model)
    labels = _labels(labels, shape[0]).to(params[0].device)
    return params, _check_targets(params, target_grads), labels, shape


def _dummy(shape: tuple[int, ...], dtype: torch.dtype, seed: int, device: torch.device) -> torch.Tensor:
    """Uniform [0, 1] start, the range of the images sought (Geiping et al. start from noise too). Drawn on the CPU
    and moved to the model's device, so the start is the same whatever the device."""
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype).requires_grad_(True)


def _dummy_grads(
    model: nn.Module, params: list[torch.Tensor], x: torch.Tensor, labels: torch.Tensor, loss: str
) -> list[torch.Tensor]:
    # create_graph: the matching loss is differentiated again, through this gradient, with respect to x
    return list(torch.autograd.grad(_batch_loss(model, x, labels, loss), params, create_graph=True))


def dlg(
    model: nn.Module,
    target_grads: Sequence[torch.Tensor],
    labels: torch.Tensor,
    shape: Sequence[int],
    *,
    steps: int,
    seed: int,
    loss: str = "cross_entropy",
    history_size: int = 100,
) -> InversionResult:
    """Deep Leakage from Gradients (Zhu et al. 2019, arXiv 1906.08797) with the labels known.

    Minimises sum over parameters of ||grad(dummy) - target||^2 with L-BFGS (strong-Wolfe line search, so a bad
    curvature estimate cannot blow the dummy up; the original uses lr 1 without one) for at most `steps`
    iterations. Unconstrained, as in the paper: the reconstruction may leave [0, 1] (`evaluate` clips it).
    Needs a twice-differentiable model for a smooth objective (the paper uses sigmoid activations).
    `shape` is the full batch shape (B, ...); the model's weights are used as they are (eval/train mode included).
    """
    params, targets, labels, shape = _setup(model, target_grads, labels, shape, steps)
    x = _dummy(shape, params[0].dtype, seed, params[0].device)
    opt = torch.optim.LBFGS([x], lr=1.0, max_iter=steps, history_size=history_size, tolerance_grad=0.0,
                            tolerance_change=0.0, line_search_fn="strong_wolfe")
    best = {"loss": float("inf"), "x": x.detach().clone()}

    def closure() -> torch.Tensor:
        grads = _dummy_grads(model, params, x, labels, loss)
        value = sum(((g - t) ** 2).sum() for g, t in zip(grads, targets, strict=True))
        (x.grad,) = torch.autograd.grad(value, x)
        v = float(value.detach())
        if v < best["loss"]:  # L-BFGS may end on a worse line-search trial point; keep the best evaluated one
            best["loss"], best["x"] = v, x.detach().clone()
        return value.detach()

    opt.step(closure)
    n_iter = int(opt.state[x].get("n_iter", steps))
    return InversionResult(best["x"], best["loss"], n_iter)


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Mean absolute difference of vertically and horizontally adjacent pixels of images [B, C, H, W]."""
    return (x[..., 1:, :] - x[..., :-1, :]).abs().mean() + (x[..., :, 1:] - x[..., :, :-1]).abs().mean()


def _cosine_distance(grads: Sequence[torch.Tensor], targets: Sequence[torch.Tensor]) -> torch.Tensor:
    dot = sum((g * t).sum() for g, t in zip(grads, targets, strict=True))
    gn = torch.sqrt(sum(g.pow(2).sum() for g in grads))
    tn = torch.sqrt(sum(t.pow(2).sum() for t in targets))
    return 1.0 - dot / (gn * tn).clamp_min(torch.finfo(gn.dtype).tiny)


def inverting_gradients(
    model: nn.Module,
    target_grads: Sequence[torch.Tensor],
    labels: torch.Tensor,
    shape: Sequence[int],
    *,
    steps: int,
    lr: float,
    tv_weight: float,
    seed: int,
    loss: str = "cross_entropy",
) -> InversionResult:
    """Inverting Gradients (Geiping et al. 2020, arXiv 2003.14053) with the labels known.

    Objective: 1 - cos(grad(dummy), target) over all parameters flattened together, plus tv_weight * total
    variation. The cosine ignores the gradient's scale, which is what makes the attack work on updates whose
    learning rate or clipping is unknown. Adam with step size `lr`, decayed by 10x at 3/8, 5/8 and 7/8 of `steps`
    as in the authors' code. The images stay in [0, 1] by *clamping after each step* (the authors' "boxed"
    constraint) rather than a sigmoid parametrisation: a projection leaves the interior geometry of the search
    unchanged and lets pixels sit exactly at 0 or 1 (common in digits and natural images), where a sigmoid would
    need infinite logits and its vanishing gradient would stall them. TV needs images [B, C, H, W]; with
    tv_weight = 0 any shape is accepted. No defaults for the knobs: the right TV weight depends on the data
    (on 8x8 digits, which are not smooth, 1e-2 costs ~20 dB against 1e-5; the paper's lr 0.1 is a fair start).
    """
    params, targets, labels, shape = _setup(model, target_grads, labels, shape, steps)
    if tv_weight < 0:
        raise ValueError(f"tv_weight must be non-negative, got {tv_weight}")
    if tv_weight > 0 and len(shape) != 4:
        raise ValueError(f"total variation needs image batches (B, C, H, W), got shape {shape}; use tv_weight=0")
    if not lr > 0:
        raise ValueError(f"lr must be positive, got {lr}")
    if float(torch.sqrt(sum(t.pow(2).sum() for t in targets))) == 0.0:
        raise ValueError("the target gradient is zero, so its direction (the cosine objective) is undefined")
    x = _dummy(shape, params[0].dtype, seed, params[0].device)
    opt = torch.optim.Adam([x], lr=lr)
    milestones = [int(steps * f) for f in (3 / 8, 5 / 8, 7 / 8)]
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=0.1)
    best_loss, best_x = float("inf"), x.detach().clone()
    for _ in range(steps):
        value = _cosine_distance(_dummy_grads(model, params, x, labels, loss), targets)
        if tv_weight > 0:
            value = value + tv_weight * total_variation(x)
        (x.grad,) = torch.autograd.grad(value, x)
        if float(value.detach()) < best_loss:
            best_loss, best_x = float(value.detach()), x.detach().clone()
        opt.step()
        sched.step()
        with torch.no_grad():
            x.clamp_(0.0, 1.0)
    # the last iterate's objective was never evaluated: do it once so the best is over all iterates
    with torch.enable_grad():
        final = _cosine_distance(_dummy_grads(model, params, x, labels, loss), targets)
        if tv_weight > 0:
            final = final + tv_weight * total_variation(x)
    if float(final.detach()) < best_loss:
        best_loss, best_x = float(final.detach()), x.detach().clone()
    return InversionResult(best_x, best_loss, steps)


def evaluate(result: InversionResult, truth: torch.Tensor, extractor: nn.Module | None = None) -> dict[str, float]:
    """PSNR, image MSE and (with an extractor) feature MSE of the reconstruction against the true inputs.

    The reconstruction is clipped to [0, 1] first: the attacker knows the image range, so clipping is free
    post-processing (it only matters for DLG, which is unconstrained). Pairing is by index (dummy i was optimised
    with label i); within a batch holding a label twice the attack may return those images swapped, which these
    metrics then count as failures, so batch results are a lower bound on the leakage.
    """
    rec = result.reconstruction.detach().clamp(0.0, 1.0)
    if rec.shape != truth.shape:
        raise ValueError(f"reconstruction shape {tuple(rec.shape)} does not match the truth {tuple(truth.shape)}")
    truth = truth.detach().to(device=rec.device, dtype=rec.dtype)
    out = {"psnr": psnr(rec, truth), "image_mse": image_mse(rec, truth)}
    if extractor is not None:
        out["feature_mse"] = feature_mse(extractor, rec, truth)
    return out
