"""The load tool's command line: ghz's flags, Go durations, and refusals that name the flag."""

import pytest

from bench.load.cli import main
from bench.load.options import UsageError, from_args, method_path, parse_duration, parser

DATA = '{"model_name": "digits"}'


def options(*args: str):
    return from_args(parser().parse_args([*args, "127.0.0.1:8001"]))


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("10s", 10.0),
        ("500ms", 0.5),
        ("1m30s", 90.0),
        ("2h", 7200.0),
        ("250us", 250e-6),
        ("1.5s", 1.5),
        ("3", 3.0),
    ],
)
def test_durations_read_as_go_writes_them(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["10x", "s", "1m 30s", "ms10"])
def test_malformed_durations_are_refused(text: str) -> None:
    with pytest.raises(UsageError, match="bad duration"):
        parse_duration(text)


def test_both_call_spellings_name_the_same_grpc_path() -> None:
    path = "/inference.GRPCInferenceService/ModelInfer"
    assert method_path("inference.GRPCInferenceService.ModelInfer") == path
    assert method_path("inference.GRPCInferenceService/ModelInfer") == path
    with pytest.raises(UsageError, match=r"package\.Service\.Method"):
        method_path("ModelInfer")


def test_ghz_flags_fill_the_options() -> None:
    got = options(
        "--insecure",
        "--call",
        "inference.GRPCInferenceService.ModelInfer",
        "-d",
        DATA,
        "-c",
        "8",
        "-n",
        "100",
        "-z",
        "2s",
        "--rps",
        "50",
        "--connections",
        "3",
        "-t",
        "500ms",
        "-m",
        '{"X-Client-Id": "me"}',
        "-O",
        "json",
        "--workers",
        "2",
    )
    assert (got.concurrency, got.total, got.duration, got.rps) == (8, 100, 2.0, 50.0)
    assert (got.connections, got.timeout, got.workers, got.format) == (3, 0.5, 2, "json")
    assert got.metadata == {"x-client-id": "me"}  # gRPC metadata keys are lower case
    assert got.open_loop


def test_exactly_one_data_source_is_required() -> None:
    call = ("--call", "inference.GRPCInferenceService.ModelInfer")
    with pytest.raises(UsageError, match="exactly one of"):
        options(*call)
    with pytest.raises(UsageError, match="exactly one of"):
        options(*call, "-d", DATA, "--dataset", "digits")


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("-c", "0", "concurrency"),
        ("--rps", "-5", "--rps"),
        ("-z", "0s", "duration"),
        ("-m", "[1]", "JSON object"),
        ("-m", "{", "not JSON"),
    ],
)
def test_bad_values_are_refused_naming_the_flag(flag: str, value: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        options("--call", "inference.GRPCInferenceService.ModelInfer", "-d", DATA, flag, value)


def test_the_command_exits_2_on_a_bad_command_line(capsys: pytest.CaptureFixture) -> None:
    assert main(["--call", "inference.Nope.Infer", "-d", DATA, "127.0.0.1:1"]) == 2
    assert "unknown service 'inference.Nope'" in capsys.readouterr().err


def http_options(*args: str, url: str = "http://127.0.0.1:8000/v2/models/digits/infer"):
    return from_args(parser().parse_args([*args, url]))


def test_an_infer_url_is_an_http_run_with_a_connection_for_each_request_in_flight() -> None:
    got = http_options("-d", "{}", "-c", "16")
    assert got.http and (got.host, got.call) == ("http://127.0.0.1:8000", "/v2/models/digits/infer")
    assert got.connections == 16  # HTTP/1.1: one request at a time on each
    assert http_options("-d", "{}", "--connections", "4").connections == 4
    assert (
        options("--call", "inference.GRPCInferenceService.ModelInfer", "-d", DATA).connections == 1
    )


@pytest.mark.parametrize(
    ("args", "url", "message"),
    [
        (("--call", "inference.GRPCInferenceService.ModelInfer"), None, "--call is for gRPC"),
        (("--cacert", __file__), None, "TLS flags are for gRPC"),
        ((), "https://127.0.0.1:8000/v2/models/digits/infer", "only plaintext http"),
        ((), "http://127.0.0.1:8000/v2/models/digits", "not a v2 infer endpoint"),
    ],
)
def test_http_runs_refuse_what_does_not_apply(args: tuple, url: str | None, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        http_options(*args, "-d", "{}", **({"url": url} if url else {}))


def test_a_grpc_target_still_needs_its_call() -> None:
    with pytest.raises(UsageError, match="--call names the gRPC method"):
        options("-d", DATA)
