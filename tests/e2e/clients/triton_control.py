"""tritonclient's model control against the gateway without any token, as JSON.

Run in its own process (tritonclient and Strata's stubs register the same protobuf names).
usage: triton_control.py GRPC_URL HTTP_URL PIPELINE
As Triton's model control examples do against a server in explicit mode: the index, then the
pipeline unloaded and loaded again over gRPC and over HTTP, and its readiness after each.
"""

import json
import sys

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def attempt(call):
    try:
        return {"status": "OK", "value": call()}
    except InferenceServerException as exc:
        return {"status": str(exc.status()), "message": exc.message()}


def cycle(client, pipeline):
    return {
        "unload": attempt(lambda: client.unload_model(pipeline)),
        "ready_after_unload": client.is_model_ready(pipeline),
        "load": attempt(lambda: client.load_model(pipeline)),
        "ready_after_load": client.is_model_ready(pipeline),
    }


def main(grpc_url, http_url, pipeline):
    grpc = grpcclient.InferenceServerClient(grpc_url)
    http = httpclient.InferenceServerClient(http_url)
    report = {
        "index": attempt(lambda: len(http.get_model_repository_index())),
        "grpc": cycle(grpc, pipeline),
        "http": cycle(http, pipeline),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:4])
