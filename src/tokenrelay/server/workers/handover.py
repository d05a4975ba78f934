"""The resolved settings handed from the supervisor to its workers, as JSON in an environment variable."""

from __future__ import annotations

import json
import os
from pathlib import PurePath

from pydantic import SecretStr

from tokenrelay.config import Settings

ENV = "TOKENRELAY_WORKER_SETTINGS"


def settings_json(settings: Settings) -> str:
    """Every setting, secrets in clear: the workers need the keys they are configured with."""
    return json.dumps(settings.model_dump(), default=_plain)


def _plain(value: object) -> object:
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, PurePath):
        return str(value)
    raise TypeError(f"cannot hand {type(value).__name__} to a worker")


def settings_from_env() -> Settings:
    """The supervisor's settings, taken out of the environment so nothing this worker starts inherits them."""
    text = os.environ.pop(ENV, None)
    if text is None:
        raise RuntimeError(f"{ENV} is not set: workers are started by `tokenrelay serve --workers N`")
    # model_validate, not Settings(...): the values are final and must not be layered over the environment again.
    return Settings.model_validate_json(text)
