"""Strata against its peers: `python -m bench.peers [--quick] [--servers ...]` (`make bench-peers`).

One run drives, with the project's own load tool, the same ONNX file (the digits model version
the pipeline's first arm routes to) behind five servers, one after another on free loopback
ports:

1. the full Strata pipeline through the gateway (ladder pinned at level 0), `images` UINT8;
2. the Strata inference deployment alone, called directly with the model's own inputs;
3. MLServer 1.7.1 with a small ONNX Runtime model class (bench/peers/mlserver_onnx.py) and its
   adaptive batching on (32 rows, 5 ms), over v2 gRPC;
4. KServe 0.21.0's Python model server as a transformer (pre- and postprocessing) calling a
   predictor over v2 gRPC: two processes, the layered peer (bench/peers/kserve_digits.py);
5. a bare single-process grpc.aio + ONNX Runtime v2 server without batching (bench/bare.py):
   the floor.

Strata's gateway and MLServer are driven over their v2 REST endpoints too (`pipeline-rest`,
`mlserver-rest`: the same requests as v2 JSON bodies, HTTP/1.1 keep-alive), in the same run.

MLServer and KServe run from venvs of their own under build/peers/, installed once from the
pinned constraint files beside this module; a peer that cannot be installed is reported as
skipped, with the reason. The gRPC calls share one connection, as tritonclient's do
(`--connections 8` spreads them over eight). At each concurrency (closed loop: 1 and 64;
--quick: 1 and 8) each
server's throughput, P50 and P99, and CPU ms per answered request of each of its processes
(utime + stime from /proc before and after the interval). Results go to `--out`
(bench/results/) as peers.md, peers.json and peers.png.
"""
