"""The access rules on their own (app/serve/access.py): which Host and Origin values a server
answers, how the options are read, the key on each path, and what the start-up lines say."""
from __future__ import annotations

import pytest

from app.cli import build_parser
from app.serve.access import Access, display_url, normal_origin, parse_hosts, parse_origins, split_host
from app.serve.errors import AuthError, ForbiddenError
from app.serve_cli import api_key, serve_access
from app.ui_cli import ui_access
from engine.errors import SettingsError

LOCAL = Access("127.0.0.1", 8080)
LAN = Access("0.0.0.0", 8080, allowed_hosts=parse_hosts(["tandem.lan", "192.168.1.20:8080"]),
             allowed_origins=parse_origins(["https://tools.example"]), api_key="k")


@pytest.mark.parametrize("value, expected", [
    ("localhost:8080", ("localhost", 8080)), ("LOCALHOST", ("localhost", None)),
    ("[::1]:8080", ("::1", 8080)), ("[fe80::1]", ("fe80::1", None)), ("fe80::1", ("fe80::1", None)),
    ("", None), ("a:b", None), ("a:0", None), ("a:70000", None), ("http://a", None),
    ("[::1", None), ("[::1]x", None), ("user@a", None), (":8080", None),
])
def test_split_host(value, expected):
    assert split_host(value) == expected


@pytest.mark.parametrize("value, expected", [
    ("HTTP://Tools.Example/", "http://tools.example"), ("https://a:443", "https://a"),
    ("http://a:8443", "http://a:8443"), ("http://[::1]:80", "http://[::1]"),
    ("null", None), ("file:///x", None), ("http://a/path", None), ("a.example", None),
    ("http://a:99999", None), ("http://u:p@a", None),
])
def test_normal_origin(value, expected):
    assert normal_origin(value) == expected


@pytest.mark.parametrize("host", ["localhost:8080", "127.0.0.1:8080", "[::1]:8080", "LocalHost:8080"])
def test_the_names_of_this_machine_are_answered(host):
    LOCAL.check_host(host)


@pytest.mark.parametrize("host", ["attacker.example:8080", "attacker.example", "localhost:8081",
                                  "localhost", "0.0.0.0:8080", "", None, "127.0.0.1.evil:8080"])
def test_any_other_host_is_403_naming_the_setting(host):
    with pytest.raises(ForbiddenError, match="--allowed-hosts .*TANDEM_ALLOWED_HOSTS") as info:
        LOCAL.check_host(host)
    assert info.value.status == 403 and info.value.code == "host_not_allowed"


def test_listed_names_are_answered_on_their_port_or_any():
    for host in ("tandem.lan", "tandem.lan:443", "192.168.1.20:8080", "localhost:8080"):
        LAN.check_host(host)
    for host in ("192.168.1.20:9000", "0.0.0.0:8080", "other.lan:8080"):
        with pytest.raises(ForbiddenError):
            LAN.check_host(host)
    # Bound to one address, that address is a name of the server too.
    Access("192.168.1.20", 7860).check_host("192.168.1.20:7860")


def test_origins_own_listed_and_foreign():
    assert LOCAL.check_origin(None, "127.0.0.1:8080") is False
    assert LOCAL.check_origin("http://127.0.0.1:8080", "127.0.0.1:8080") is False  # its own page
    assert LAN.check_origin("https://tools.example", "tandem.lan") is True
    for origin, host in (("http://attacker.example", "127.0.0.1:8080"), ("null", "127.0.0.1:8080"),
                         ("http://localhost:8080", "127.0.0.1:8080"),  # another name is another origin
                         ("http://127.0.0.1:3000", "127.0.0.1:8080"), ("garbage", "127.0.0.1:8080")):
        with pytest.raises(ForbiddenError, match="--allowed-origins"):
            LOCAL.check_origin(origin, host)


def test_the_key_on_each_path():
    LAN.check_key("/health", None)
    LAN.check_key("/v1/models", "Bearer k")
    LAN.check_key("/v1/models", "bearer  k ")
    for path in ("/", "/v1/models", "/docs", "/v1"):
        with pytest.raises(AuthError, match="missing API key"):
            LAN.check_key(path, None)
        with pytest.raises(AuthError, match="wrong API key"):
            LAN.check_key(path, "Bearer nope")
        with pytest.raises(AuthError):
            LAN.check_key(path, "Basic k")
    app_api = Access("127.0.0.1", 7860, api_key="k", keyed=("/v1",))
    app_api.check_key("/", None)  # the page
    app_api.check_key("/gradio_api/info", None)
    app_api.check_key("/v1x", None)
    with pytest.raises(AuthError):
        app_api.check_key("/v1/chat/completions", None)
    Access("127.0.0.1", 8080).check_key("/v1/models", None)  # no key set


def test_start_up_notes_say_who_can_connect_and_never_the_key():
    assert LOCAL.notes() == []
    notes = LAN.notes()
    assert "--allowed-hosts" in notes[0] and "tandem.lan" in notes[0]
    assert any("API key is required on every route but /health" in line for line in notes)
    assert any("https://tools.example" in line for line in notes)
    open_lan = Access("0.0.0.0", 8080).notes()
    assert any("No API key" in line and "TANDEM_API_KEY" in line for line in open_lan)
    secret = Access("0.0.0.0", 8080, api_key="sk-very-secret", keyed=("/v1",))
    assert not any("sk-very-secret" in line for line in secret.notes())
    assert any("the /v1 routes" in line for line in secret.notes())


def test_display_url():
    assert display_url("0.0.0.0", 7860) == "http://localhost:7860/"
    assert display_url("::1", 8080) == "http://[::1]:8080/"
    assert display_url("192.168.1.20", 8080) == "http://192.168.1.20:8080/"


def args(*argv: str):
    return build_parser().parse_args(list(argv))


def test_options_and_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TANDEM_ALLOWED_HOSTS", "a.lan, b.lan:9000,")
    monkeypatch.setenv("TANDEM_ALLOWED_ORIGINS", "https://x.example")
    access = serve_access(args("serve"))
    assert access.allowed_hosts == (("a.lan", None), ("b.lan", 9000))
    assert access.allowed_origins == ("https://x.example",)
    # The option replaces the variable; it may be repeated and comma-separated.
    access = serve_access(args("serve", "--allowed-hosts", "c.lan,d.lan", "--allowed-hosts", "e.lan"))
    assert [name for name, _ in access.allowed_hosts] == ["c.lan", "d.lan", "e.lan"]


def test_the_key_comes_from_the_option_a_file_or_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("TANDEM_API_KEY", raising=False)
    assert api_key(args("serve")) is None
    monkeypatch.setenv("TANDEM_API_KEY", "from-env")
    assert api_key(args("serve")) == "from-env"
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    assert api_key(args("serve", "--api-key-file", str(key_file))) == "from-file"
    assert api_key(args("serve", "--api-key", "from-flag")) == "from-flag"
    monkeypatch.setenv("TANDEM_API_KEY", "")
    assert api_key(args("serve")) is None  # `export TANDEM_API_KEY=` leaves no key
    for content in ("", "\n", "two\nlines\n"):
        key_file.write_text(content)
        with pytest.raises(SettingsError, match="one non-empty line"):
            api_key(args("serve", "--api-key-file", str(key_file)))
    # The app reads the variable only when it serves the API.
    monkeypatch.setenv("TANDEM_API_KEY", "from-env")
    assert ui_access(args("ui")).api_key is None
    assert ui_access(args("ui", "--api")).api_key == "from-env"


@pytest.mark.parametrize("argv, words", [
    (["serve", "--allowed-hosts", "http://a.lan"], "--allowed-hosts takes host names"),
    (["serve", "--allowed-hosts", "a.lan:0"], "--allowed-hosts"),
    (["serve", "--allowed-origins", "a.lan"], "--allowed-origins takes origins"),
    (["serve", "--allowed-origins", "https://a.lan/path"], "--allowed-origins"),
    (["serve", "--port", "70000"], "--port must be between 1 and 65535"),
])
def test_bad_access_options_are_one_line_errors(argv, words):
    with pytest.raises(SettingsError, match=words):
        serve_access(args(*argv))
