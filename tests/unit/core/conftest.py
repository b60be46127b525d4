"""A worker's snapshot folder, as the agent would give it (RTRAIN_SNAPSHOT_DIR, RANK)."""

from __future__ import annotations

import pytest

from rtrain.core.worker import snapshots as snapshot_api


@pytest.fixture
def slot_dir(tmp_path, monkeypatch) -> str:
    monkeypatch.setenv(snapshot_api.SNAPSHOT_DIR, str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(snapshot_api, "_slots", None)
    return str(tmp_path)
