"""The errors of secure aggregation: each says what was wrong and leaves no half-finished state behind."""

from __future__ import annotations


class SecureAggregationError(ValueError):
    """Base class: a protocol parameter, input or round that secure aggregation refuses."""


class SecAggConfigError(SecureAggregationError):
    """A parameter set the protocol cannot run with (threshold, dimension, ring)."""


class RingOverflowError(SecureAggregationError):
    """A value that would wrap around the fixed-point ring once the clients' vectors are summed."""


class TooFewSurvivorsError(SecureAggregationError):
    """Fewer than `threshold` clients are left at some stage: the round is aborted, nothing is revealed."""

    def __init__(self, stage: str, survivors: int, threshold: int) -> None:
        self.stage, self.survivors, self.threshold = stage, survivors, threshold
        super().__init__(f"secure aggregation aborted at stage {stage!r}: {survivors} client(s) left, the threshold "
                         f"is {threshold}; no sum was revealed")


class ProtocolViolation(SecureAggregationError):
    """A message that contradicts the protocol (wrong round, unknown sender, a request that would unmask a client)."""
