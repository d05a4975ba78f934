"""`AppState`: the app's state as plain attributes, so that reading `app.state.services` raises nothing."""

from __future__ import annotations

from pathlib import Path

from starlette.datastructures import State

from tokenrelay.app import AppState, create_app
from tokenrelay.config import Settings


def test_values_are_attributes_and_stay_in_the_states_dict() -> None:
    state, services = AppState(), object()
    state.services = services
    state["other"] = 2
    assert state.services is services and state.other == 2 and state["other"] == 2
    assert state._state == {"services": services, "other": 2}
    assert {"services", "other"} <= set(vars(state))  # found by the ordinary lookup, not by `__getattr__`
    del state.services
    del state["other"]
    assert state._state == {} and not hasattr(state, "services") and not hasattr(state, "other")


def test_a_read_goes_nowhere_near_getattr(monkeypatch) -> None:
    state = AppState()
    state.services = "s"

    def refused(self: State, key: str) -> None:
        raise AssertionError(f"{key} was looked up through __getattr__")

    monkeypatch.setattr(State, "__getattr__", refused)
    assert state.services == "s"


def test_the_app_keeps_its_state_so(tmp_path: Path) -> None:
    lane = create_app(Settings(data_dir=str(tmp_path), models=[]))
    assert isinstance(lane.app.state, AppState)
