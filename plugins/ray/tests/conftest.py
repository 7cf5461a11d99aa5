"""The Ray tests run against a home and environment of their own, never the user's: each
module gets a temporary home that holds a stray ``~/.ray/auth_token`` (what ``ray.init()``
of an in-process cluster leaves by default; an earlier ``cuda-agent executor check`` did),
with no ``RAY_ADDRESS`` or ``RAY_AUTH_*`` settings. The tests' clusters must work in it."""

from __future__ import annotations

import secrets

import pytest

USER_RAY_SETTINGS = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


@pytest.fixture(scope="module", autouse=True)
def foreign_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    (home / ".ray").mkdir()
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(32))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        for key in USER_RAY_SETTINGS:
            mp.delenv(key, raising=False)
        yield home
