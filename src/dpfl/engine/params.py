"""Parameters as plain dicts of tensors: single (one model) or stacked (a leading client axis).

The engine never mutates an `nn.Module`'s parameters; it carries dicts through `torch.func`, so that
many clients' models are just one more tensor dimension.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

Params = dict[str, torch.Tensor]


def to_device(params: Mapping[str, torch.Tensor], device: torch.device | str) -> Params:
    """`params` on `device` (tensors already there are kept, not copied)."""
    return {name: t.to(device) for name, t in params.items()}


def move(obj: Any, device: torch.device | str) -> Any:
    """Every tensor in `obj` (nested dicts, lists, tuples, dataclasses of them) on `device`; the rest as it is.

    A run's state (server step state, client state, upload mechanism state) goes through this to the CPU for a
    checkpoint and back to the run's device on resume, so checkpoints do not depend on where the run trained.
    """
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        out = copy.copy(obj)  # the same mapping type (an OrderedDict, a defaultdict's factory)
        out.clear()
        out.update((k, move(v, device)) for k, v in obj.items())
        return out
    if isinstance(obj, list):
        return [move(v, device) for v in obj]
    if isinstance(obj, tuple):
        items = [move(v, device) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: move(getattr(obj, f.name), device) for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **changes)
    return obj


def model_params(model: nn.Module) -> Params:
    """The trainable parameters of `model`, detached, in `named_parameters()` order."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def broadcast(params: Mapping[str, torch.Tensor], k: int) -> Params:
    """Stack `k` copies of single-model `params` along a new leading axis."""
    return {name: t.unsqueeze(0).expand(k, *t.shape).clone() for name, t in params.items()}


def select(stacked: Mapping[str, torch.Tensor], rows: torch.Tensor) -> Params:
    """The rows `rows` of stacked parameters (a copy)."""
    return {name: t.index_select(0, rows) for name, t in stacked.items()}


def unstack(stacked: Mapping[str, torch.Tensor], i: int) -> Params:
    """Client `i`'s parameters from a stack."""
    return {name: t[i].clone() for name, t in stacked.items()}


def flatten(stacked: Mapping[str, torch.Tensor], leading: int = 1) -> torch.Tensor:
    """Concatenate all tensors into one `[*lead, D]` matrix, keeping `leading` leading axes."""
    return torch.cat([t.flatten(leading) for t in stacked.values()], dim=-1)


def unflatten(flat: torch.Tensor, like: Mapping[str, torch.Tensor], leading: int = 1) -> Params:
    """Inverse of `flatten` given tensors of the wanted shapes."""
    out: Params = {}
    offset = 0
    lead = flat.shape[:-1]
    for name, t in like.items():
        size = t[(0,) * leading].numel() if leading else t.numel()
        shape = t.shape[leading:]
        out[name] = flat[..., offset : offset + size].reshape(*lead, *shape)
        offset += size
    if offset != flat.shape[-1]:
        raise ValueError(f"flat vector has {flat.shape[-1]} entries, the parameters need {offset}")
    return out


def global_norms(stacked: Mapping[str, torch.Tensor], leading: int = 1) -> torch.Tensor:
    """L2 norm over *all* tensors together (one global norm), per leading index."""
    norms = [torch.linalg.vector_norm(t.reshape(*t.shape[:leading], -1), dim=-1) for t in stacked.values()]
    assert norms, "empty parameter dict"
    return norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms, dim=-1), dim=-1)


def num_parameters(params: Mapping[str, torch.Tensor], leading: int = 0) -> int:
    """Number of scalar parameters of one model (ignoring `leading` stacked axes)."""
    return sum(t[(0,) * leading].numel() if leading else t.numel() for t in params.values())


def axpy(alpha: float | torch.Tensor, x: Mapping[str, torch.Tensor], y: Mapping[str, torch.Tensor]) -> Params:
    """alpha * x + y, tensor by tensor (alpha may be a per-client vector)."""
    out: Params = {}
    for name, yt in y.items():
        a = alpha
        if isinstance(alpha, torch.Tensor) and alpha.dim() == 1:
            a = alpha.reshape(-1, *([1] * (yt.dim() - 1)))
        out[name] = yt + a * x[name]
    return out


def sub(x: Mapping[str, torch.Tensor], y: Mapping[str, torch.Tensor]) -> Params:
    """x - y, tensor by tensor."""
    return {name: x[name] - y[name] for name in x}
