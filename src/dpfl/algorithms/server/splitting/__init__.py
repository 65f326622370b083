"""The operator-splitting family (specs/operator_splitting.md): one scheme, presets, Anderson acceleration."""

from dpfl.algorithms.server.splitting import presets
from dpfl.algorithms.server.splitting.anderson import AndersonII
from dpfl.algorithms.server.splitting.privacy import SplittingDP
from dpfl.algorithms.server.splitting.schedules import ErgodicAverage, StepSchedule
from dpfl.algorithms.server.splitting.scheme import SplittingServer, UnifiedSplitting

__all__ = ["AndersonII", "ErgodicAverage", "SplittingDP", "SplittingServer", "StepSchedule", "UnifiedSplitting",
           "presets"]
