"""Shared fixtures: the real test model and the llama.cpp reference build."""

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    from pi2cli.testmodels import smollm2_gguf as fetch

    return fetch()


@pytest.fixture(scope="session")
def llamacpp_bindir() -> Path:
    """Directory holding llama.cpp's tools (llama-completion, llama-tokenize, llama-bench, ...).

    Built from the pinned source by pi2cli.baselines.llamacpp_build (cached under ~/.cache/pi2);
    $PI2_LLAMACPP_BIN_DIR overrides it.
    """
    override = os.environ.get("PI2_LLAMACPP_BIN_DIR")
    if override:
        return Path(override)
    from pi2cli.baselines.llamacpp_build import ensure_built

    return ensure_built("host")


@pytest.fixture(autouse=True)
def _unsaved_results_in_tmp(tmp_path_factory, monkeypatch):
    """Runs a test cannot store (deliberately bad ones included) are kept here, not in ~/.cache/pi2."""
    monkeypatch.setenv("PI2_UNSAVED_DIR", str(tmp_path_factory.getbasetemp() / "unsaved"))
