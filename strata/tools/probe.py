"""A container probe that costs what starting Python costs: `python -I -S strata/tools/probe.py
ADDRESS`.

Asks `GET /readyz` (or the path given second, e.g. `/livez`) on a service's metrics port,
host:port ADDRESS, and exits 0 only on HTTP 200; anything else exits 1 with the reason on
stderr. The service answers /readyz 200 while its gRPC health service says SERVING.

It imports `_socket` and `sys` and nothing else: with `-I -S` a probe costs about 10 ms of
CPU, where `import socket` (its enums) doubles that, urllib more than fivefold, and
`python -m strata.tools.healthcheck` (grpc and the config package) costs 0.5 s. Run as a file, so
`-I` keeps the working directory off the path and nothing of the serving stack is imported.
"""

import _socket
import sys

TIMEOUT_SECONDS = 2.0


def status(address: str, path: str = "/readyz", timeout: float = TIMEOUT_SECONDS) -> int:
    """The HTTP status `GET path` gets at `address` (host:port). OSError when unreachable."""
    host, _, port = address.rpartition(":")
    family = _socket.AF_INET6 if ":" in host else _socket.AF_INET
    connection = _socket.socket(family, _socket.SOCK_STREAM)
    try:
        connection.settimeout(timeout)
        connection.connect((host.strip("[]"), int(port)))
        connection.sendall(f"GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        line = connection.recv(64).split(b"\r\n", 1)[0]
    finally:
        connection.close()
    parts = line.split()
    if len(parts) < 2 or not parts[1].isdigit():
        raise OSError(f"not an HTTP answer: {line[:32]!r}")
    return int(parts[1])


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print(
            "usage: python -I -S strata/tools/probe.py HOST:PORT [/readyz|/livez]", file=sys.stderr
        )
        return 2
    address, path = argv[0], argv[1] if len(argv) == 2 else "/readyz"
    try:
        code = status(address, path)
    except OSError as exc:
        print(f"{address}{path}: {exc}", file=sys.stderr)
        return 1
    if code != 200:
        print(f"{address}{path}: HTTP {code}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
