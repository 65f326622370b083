"""Model registry: the architectures of the specs, built by name with explicit, seeded initialisation.

    from dpfl.models import build_model, model_info, count_parameters
    model = build_model("cnn_pfa", (1, 28, 28), 10, seed=0, init="keras")
    model_info("cnn_pfa").loss   # "cross_entropy"

See `dpfl.models.registry` for the contracts every model keeps (vmap-safe, no BatchNorm, loss kinds).
"""

from dpfl.models.initialization import INIT_SCHEMES, init_parameters
from dpfl.models.registry import MODELS, LossKind, ModelInfo, build_model, count_parameters, model_info

__all__ = [
    "INIT_SCHEMES",
    "MODELS",
    "LossKind",
    "ModelInfo",
    "build_model",
    "count_parameters",
    "init_parameters",
    "model_info",
]
