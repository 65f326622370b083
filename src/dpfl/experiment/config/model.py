"""The `model` section: a registered model and its builder options."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from dpfl.experiment.config.base import _Section
from dpfl.experiment.config.errors import _fail
from dpfl.models import MODELS, model_info

ModelName = Literal[tuple(MODELS)]  # type: ignore[valid-type]


class ModelConfig(_Section):
    """A registered model (`dpfl.models.MODELS`) and its builder options (`model_info(name).options` + init)."""

    name: ModelName
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _options_known(self) -> ModelConfig:
        info = model_info(self.name)
        allowed = [*info.options, "init"]
        for key, value in self.options.items():
            if key not in allowed:
                _fail(f"options.{key}", f"unknown option for model {self.name!r}", value, ", ".join(allowed))
        if "init" in self.options and self.options["init"] not in info.inits:
            _fail("options.init", f"unknown init scheme for model {self.name!r}", self.options["init"],
                  ", ".join(info.inits))
        return self
