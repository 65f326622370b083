"""The backend's failure, importable without torch (the CLI catches it)."""


class BackendError(RuntimeError):
    """A backend could not train a round (e.g. a Ray actor died twice); the round is not applied."""
