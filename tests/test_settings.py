"""Settings: defaults in one place, stored changes only, overrides on top."""
from __future__ import annotations

import pytest

from app.settings import Paths, Settings
from app.session import Session, SessionError


def test_defaults_and_validation():
    s = Settings()
    assert (s.engine, s.n_ctx, s.model, s.kv, s.attention) == ("auto", 0, "", "auto", "auto")
    with pytest.raises(ValueError, match="engine must be one of"):
        Settings(engine="gpu")
    with pytest.raises(ValueError, match="at least 256"):
        Settings(n_ctx=10)


def test_round_trip_through_the_store_keeps_only_changes(tmp_path):
    session = Session(Paths.resolve(tmp_path))
    session.save_settings(Settings(engine="llamacpp", n_ctx=4096))
    assert session.store.settings() == {"engine": "llamacpp", "n_ctx": 4096}
    again = Session(Paths.resolve(tmp_path))
    assert again.settings == Settings(engine="llamacpp", n_ctx=4096)
    again.save_settings(Settings())
    assert again.store.settings() == {}


def test_overrides_win_and_unknown_keys_are_ignored(tmp_path):
    session = Session(Paths.resolve(tmp_path), {"n_ctx": 2048, "engine": None})
    session.store.set_settings({"engine": "llamacpp", "from_the_future": 1, "n_ctx": 4096})
    assert (session.settings.engine, session.settings.n_ctx) == ("llamacpp", 2048)


def test_a_bad_stored_value_is_a_session_error(tmp_path):
    session = Session(Paths.resolve(tmp_path))
    session.store.set_settings({"engine": "warp-drive"})
    with pytest.raises(SessionError, match="engine must be one of"):
        session.settings


def test_unknown_model_choice_names_the_models_folder(tmp_path):
    session = Session(Paths.resolve(tmp_path), {"model": "mistral-7b"})
    with pytest.raises(SessionError, match="mistral-7b: no such model file") as e:
        session.model_path
    assert str(tmp_path / "models") in str(e.value)


def test_the_api_server_is_off_by_default_and_its_port_is_checked(tmp_path):
    assert (Settings().api_server, Settings().api_port) == (False, 8080)
    for port in (0, 65536):
        with pytest.raises(ValueError, match=f"port must be between 1 and 65535, not {port}"):
            Settings(api_port=port)
    session = Session(Paths.resolve(tmp_path))
    session.save_settings(Settings(api_server=True, api_port=8765))
    assert session.store.settings() == {"api_server": True, "api_port": 8765}
    assert Session(Paths.resolve(tmp_path)).settings == Settings(api_server=True, api_port=8765)
