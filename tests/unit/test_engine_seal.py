"""What the engine process gets from the daemon (#51 item 3): the engine's settings only,
and an environment of allowed names. The sealed process itself (its /proc) is checked in
tests/functional/test_engine_process.py."""

from __future__ import annotations

import pickle
from pathlib import Path

from ortserve.core.engine_process import engine_settings
from ortserve.core.settings import EngineSettings, ServerSettings, engine_environment


def test_the_engine_gets_the_engine_settings_and_never_the_keys() -> None:
    server = ServerSettings(
        model_dir=Path("m"), api_keys=["user-key-1"], admin_keys=["admin-key-2"], threads=3
    )
    sent = engine_settings(server)
    assert type(sent) is EngineSettings
    assert sent.model_dir == Path("m") and sent.threads == 3
    assert sent.model_dump() == {k: getattr(server, k) for k in EngineSettings.model_fields}
    wire = pickle.dumps(sent)
    assert b"user-key-1" not in wire and b"admin-key-2" not in wire
    assert b"user-key-1" in pickle.dumps(server)  # what used to cross


def test_the_engine_environment_keeps_allowed_names_only() -> None:
    environ = {
        "PATH": "/usr/bin",
        "HOME": "/home/x",
        "LC_ALL": "C.UTF-8",
        "PYTHONPATH": "/bundle",
        "OMP_NUM_THREADS": "2",
        "ORTSERVE_API_KEYS": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "GOOGLE_APPLICATION_CREDENTIALS": "/c.json",
        "CREDENTIALS_DIRECTORY": "/run/credentials/ortserve",
    }
    child = engine_environment(environ)
    assert child == {
        "PATH": "/usr/bin",
        "HOME": "/home/x",
        "LC_ALL": "C.UTF-8",
        "PYTHONPATH": "/bundle",
        "OMP_NUM_THREADS": "2",
        "ORT_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
