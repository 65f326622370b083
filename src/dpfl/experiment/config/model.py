"""The `model` section: a registered model and its builder options."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from dpfl.experiment.config.base import _Section
from dpfl.experiment.config.errors import _allowed, _fail
from dpfl.models import MODELS, model_info

PROVIDED_MODEL = "provided"  # a model passed as an object to dpfl.run(model=...)


class ModelConfig(_Section):
    """A registered model (`dpfl.models.MODELS`, including `dpfl.register_model`'s) and its builder options
    (`model_info(name).options` + init), or `provided`: a module passed to dpfl.run(model=...)."""

    name: str
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name_known(cls, v: str) -> str:
        if v != PROVIDED_MODEL and v not in MODELS:
            _fail("", "not an allowed value", v, _allowed(tuple(MODELS)))
        return v

    @model_validator(mode="after")
    def _options_known(self) -> ModelConfig:
        if self.name == PROVIDED_MODEL:
            if self.options:
                _fail("options", "a model passed as an object takes no builder options", self.options, "{}")
            return self
        info = model_info(self.name)
        allowed = [*info.options, "init"]
        for key, value in self.options.items():
            if key not in allowed:
                _fail(f"options.{key}", f"unknown option for model {self.name!r}", value, ", ".join(allowed))
        if "init" in self.options and self.options["init"] not in info.inits:
            _fail("options.init", f"unknown init scheme for model {self.name!r}", self.options["init"],
                  ", ".join(info.inits))
        return self
