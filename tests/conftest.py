"""Every test runs with its own empty bundle-index cache (traceflow.bundle.index), so that no
test reads or writes the user's cache and no test depends on what another one indexed."""

import pytest


@pytest.fixture(autouse=True)
def _index_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("TRACEFLOW_CACHE_DIR", str(tmp_path_factory.mktemp("index-cache")))
    monkeypatch.delenv("TRACEFLOW_NO_INDEX", raising=False)
