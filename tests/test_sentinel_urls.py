"""Redis Sentinel settings: how a ``redis+sentinel://`` URL and the ``OVERSPILL_REDIS_*``
variables name the sentinels, the master, the database and the passwords (no server needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from producer.contract import (
    RedisConnectionSettings,
    arq_redis_settings,
    redis_target,
)

# ---------------------------------------------------------------------------- pure logic


def test_the_url_form_names_sentinels_master_and_db() -> None:
    t = redis_target("redis+sentinel://:s3cret@10.0.0.1:26379,10.0.0.2,[::1]:5/primary/3")
    assert t.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26379), ("::1", 5))
    assert (t.master, t.db, t.password) == ("primary", 3, "s3cret")


def test_the_variables_replace_a_plain_urls_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "pw"
    secret.write_text("p@ss\n")
    monkeypatch.setenv("OVERSPILL_REDIS_PASSWORD_FILE", str(secret))
    s = RedisConnectionSettings(sentinels="a:1,b:2", sentinel_master="m")
    t = redis_target("redis://ignored:6379/2", s)
    assert (t.sentinels, t.master, t.db, t.password) == ((("a", 1), ("b", 2)), "m", 2, "p@ss")
    arq = arq_redis_settings("redis://ignored:6379/2", s)
    assert (arq.sentinel, arq.host, arq.sentinel_master, arq.password) == (
        True,
        [("a", 1), ("b", 2)],
        "m",
        "p@ss",
    )


def test_the_sentinels_password_comes_from_its_own_setting_or_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = "redis+sentinel://:master-pw@a:1/m/0"
    assert redis_target(url, RedisConnectionSettings()).sentinel_auth == ()  # none unless asked for
    monkeypatch.setenv("OVERSPILL_REDIS_SENTINEL_PASSWORD", "from-env")
    monkeypatch.setenv("OVERSPILL_REDIS_SENTINEL_USERNAME", "sentinel-user")
    t = redis_target(url, RedisConnectionSettings())
    assert dict(t.sentinel_auth) == {"password": "from-env", "username": "sentinel-user"}
    assert t.password == "master-pw"  # the URL's password stays the primary's
    secret = tmp_path / "sentinel-pw"
    secret.write_text("from-file\n")
    monkeypatch.setenv("OVERSPILL_REDIS_SENTINEL_PASSWORD_FILE", str(secret))
    assert dict(redis_target(url).sentinel_auth)["password"] == "from-file"
    assert "from-env" not in repr(RedisConnectionSettings())


def test_a_plain_url_stays_one_server() -> None:
    t = redis_target("redis://127.0.0.1:6390/1", RedisConnectionSettings())
    assert not t.is_sentinel and t.url == "redis://127.0.0.1:6390/1"


def test_a_sentinel_url_without_a_master_is_refused() -> None:
    with pytest.raises(ValueError, match="names its master"):
        redis_target("redis+sentinel://a:1,b:2/")
