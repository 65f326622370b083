"""A server stage's way to end training cleanly (e.g. PFA with no public client in the round)."""


class StopTraining(ValueError):
    """Raised by an aggregator when the run cannot continue; the round loop ends with `stop_reason`.

    The round's privacy events are recorded before aggregation, so stopping here never under-reports
    what the clients already spent.
    """

    stop_reason = "stopped"
