"""Secrets in config: admin tokens long enough or refused at load, tokens and API keys read
from files (mounted secrets), and failed control calls throttled per source address."""

from pathlib import Path

import grpc
import pytest
import yaml

from services.gateway.runtime import _needs_restart
from strata.config import ConfigError, Settings, load_settings
from strata.errors import Overloaded, Unauthenticated
from strata.security.bearer import ControlAuth, ControlOff, Throttle
from strata.security.credentials import key_hash
from tests.unit.test_config import write

TOKEN = "a-token-of-exactly-32-characters"
PEER = "ipv4:10.0.0.7:50123"


@pytest.mark.parametrize("section", ["gateway", "inference"])
def test_a_short_admin_token_fails_the_config_load(tmp_path: Path, section: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, {section: {"admin_token": "x"}}))
    message = str(info.value)
    assert f"{section}.admin_token" in message and "at least 32 characters" in message
    assert "has 1" in message and "'x'" not in message


@pytest.mark.parametrize("section", ["gateway", "inference"])
def test_a_short_admin_token_in_the_environment_fails_too(
    tmp_path: Path, section: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(f"STRATA_{section.upper()}__ADMIN_TOKEN", "x")
    with pytest.raises(ConfigError, match="at least 32 characters"):
        load_settings(write(tmp_path, {}))


@pytest.mark.parametrize("section", ["gateway", "inference"])
def test_the_admin_token_is_read_from_its_file(tmp_path: Path, section: str) -> None:
    (tmp_path / "token").write_text(TOKEN + "\n")
    settings = load_settings(write(tmp_path, {section: {"admin_token_file": "token"}}), section)
    assert getattr(settings, section).admin_token.get_secret_value() == TOKEN


def test_only_the_own_sections_files_are_read(tmp_path: Path) -> None:
    # Each container mounts its own secrets alone: preprocess never sees the gateway's.
    changes = {"gateway": {"admin_token_file": "absent", "api_keys_file": "absent.yaml"}}
    settings = load_settings(write(tmp_path, changes), "preprocess")
    assert settings.gateway.admin_token is None and settings.gateway.api_keys == []
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(write(tmp_path, changes), "gateway")


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (None, ["gateway.admin_token_file", "cannot read"]),
        ("short", ["gateway.admin_token_file", "at least 32 characters"]),
    ],
)
def test_an_unusable_token_file_fails_the_load(
    tmp_path: Path, content: str | None, words: list[str]
) -> None:
    if content is not None:
        (tmp_path / "token").write_text(content)
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, {"gateway": {"admin_token_file": "token"}}), "gateway")
    assert all(word in str(info.value) for word in words), str(info.value)
    assert "short" not in str(info.value).replace("shorter", "")


def test_a_token_and_its_file_together_are_refused(tmp_path: Path) -> None:
    changes = {"gateway": {"admin_token": TOKEN, "admin_token_file": "token"}}
    with pytest.raises(ConfigError, match="admin_token or admin_token_file, not both"):
        load_settings(write(tmp_path, changes))


def test_api_keys_are_read_from_their_file_beside_the_inline_ones(tmp_path: Path) -> None:
    keys = [{"client_id": "bob", "sha256": key_hash("bob-key")}]
    (tmp_path / "keys.yaml").write_text(yaml.safe_dump(keys))
    inline = [{"client_id": "alice", "sha256": key_hash("alice-key")}]
    changes = {"gateway": {"api_keys": inline, "api_keys_file": "keys.yaml"}}
    settings = load_settings(write(tmp_path, changes), "gateway")
    assert [k.client_id for k in settings.gateway.api_keys] == ["alice", "bob"]


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("[{client_id: bob, sha256: nothex}]", ["api_keys_file", "0.sha256"]),
        ("{{{", ["api_keys_file", "not valid YAML"]),
    ],
)
def test_a_broken_api_keys_file_names_the_problem(
    tmp_path: Path, content: str, words: list[str]
) -> None:
    (tmp_path / "keys.yaml").write_text(content)
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, {"gateway": {"api_keys_file": "keys.yaml"}}), "gateway")
    assert all(word in str(info.value) for word in words), str(info.value)


class Context:
    """What ControlAuth reads of a call: its peer and its metadata."""

    def __init__(self, token: str | None = None, peer: str = PEER) -> None:
        self._peer = peer
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()

    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self) -> tuple:
        return self._metadata


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def auth(clock: Clock, token: str | None = TOKEN) -> ControlAuth:
    throttle = Throttle(failures=5, window=60, backoff=30, max_sources=3, clock=clock)
    return ControlAuth("the admin API", "gateway.admin_token", lambda: token, throttle)


def outcome(check: ControlAuth, context: Context) -> grpc.StatusCode:
    try:
        check.check(context)
    except (Unauthenticated, Overloaded, ControlOff) as exc:
        return exc.code
    return grpc.StatusCode.OK


def test_wrong_tokens_are_throttled_per_address_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    check = auth(clock)
    codes = [outcome(check, Context("wrong-guess")) for _ in range(50)]
    assert codes[:5] == [grpc.StatusCode.UNAUTHENTICATED] * 5
    assert codes[5:] == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 45
    # Even the right token waits out the backoff: nothing is checked meanwhile.
    assert outcome(check, Context(TOKEN)) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert outcome(check, Context(TOKEN, "ipv4:10.0.0.8:1")) == grpc.StatusCode.OK
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 5 and all("10.0.0.7" in r.getMessage() for r in warnings)
    assert "refusing that address for 30s" in warnings[-1].getMessage()
    assert not any("wrong-guess" in r.getMessage() for r in caplog.records)
    clock.now += 31
    assert outcome(check, Context(TOKEN)) == grpc.StatusCode.OK


def test_failures_spread_beyond_the_window_are_not_throttled() -> None:
    clock = Clock()
    check = auth(clock)
    for _ in range(20):
        assert outcome(check, Context("wrong")) == grpc.StatusCode.UNAUTHENTICATED
        clock.now += 16  # fewer than 5 failures a minute


def test_a_success_forgets_the_failures_and_sources_stay_bounded() -> None:
    clock = Clock()
    throttle = Throttle(failures=2, window=60, backoff=30, max_sources=3, clock=clock)
    throttle.failed("a")
    throttle.succeeded("a")
    assert not throttle.failed("a")
    for source in ("b", "c", "d"):
        throttle.failed(source)
    assert not throttle.failed("a"), "a, the oldest, was forgotten to keep 3 sources"


def test_without_a_token_control_is_off_whatever_is_sent() -> None:
    check = auth(Clock(), token=None)
    assert outcome(check, Context(TOKEN)) == grpc.StatusCode.PERMISSION_DENIED


def test_a_reload_applies_a_new_token_but_not_turning_the_admin_api_on(tmp_path: Path) -> None:
    def gateway(token: str | None) -> Settings:
        return load_settings(write(tmp_path, {"gateway": {"admin_token": token}}), "gateway")

    assert _needs_restart(gateway(TOKEN), gateway(TOKEN[::-1])) == []
    # The admin service is registered at start, or not: turning it on or off needs a restart.
    assert _needs_restart(gateway(None), gateway(TOKEN)) == ["gateway.admin_token"]
    assert _needs_restart(gateway(TOKEN), gateway(None)) == ["gateway.admin_token"]
