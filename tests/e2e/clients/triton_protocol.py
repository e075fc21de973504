"""tritonclient (gRPC and HTTP) against the gateway's protocol extensions, as JSON.

Run in its own process (tritonclient and Strata's stubs register the same protobuf names).
usage: triton_protocol.py GRPC_URL HTTP_URL ADMIN_TOKEN
Reads the image pipeline's model config as Triton's image client does (format, batch, dims),
asks for the top classes of its scores (classification), controls the model repository
(index, unload, load; with and without the admin token) and reads and changes the log and
trace settings, on both protocols.
"""

import base64
import json
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

PIPELINE = "photos"
OUTPUT = "probabilities"

# What tritonclient.utils.cuda_shared_memory.get_raw_handle gives: a base64 IPC handle.
HANDLE = base64.b64encode(b"not a real handle")


def attempt(call):
    try:
        return {"status": "OK", "value": call()}
    except InferenceServerException as exc:
        return {"status": str(exc.status()), "message": exc.message()}


def classify(module, client, class_count, output=OUTPUT):
    images = np.arange(2 * 64, dtype=np.uint8).reshape(2, 8, 8, 1)
    tensor = module.InferInput("images", list(images.shape), "UINT8")
    tensor.set_data_from_numpy(images)
    wanted = [module.InferRequestedOutput(output, class_count=class_count)]
    result = client.infer(PIPELINE, [tensor], outputs=wanted)
    return [[item.decode() for item in row] for row in result.as_numpy(output).tolist()]


def configs(grpc, http):
    return {
        "grpc": grpc.get_model_config(PIPELINE, as_json=True)["config"],
        "grpc_tabular": grpc.get_model_config("tabular", as_json=True)["config"],
        "http": http.get_model_config(PIPELINE),
        "http_versioned": http.get_model_config(PIPELINE, model_version="1"),
        "http_unknown": attempt(lambda: http.get_model_config("nope")),
    }


def classification(grpc, http):
    return {
        "grpc": classify(grpcclient, grpc, 3),
        "http": classify(httpclient, http, 3),
        "bytes_output": attempt(lambda: classify(grpcclient, grpc, 2, "label")),
    }


def repository(grpc, http, token):
    auth = {"authorization": f"Bearer {token}"}
    return {
        "no_token": {
            "grpc": attempt(lambda: grpc.get_model_repository_index()),
            "http": attempt(lambda: http.get_model_repository_index()),
        },
        "wrong_token": attempt(
            lambda: grpc.unload_model("tabular", headers={"authorization": "Bearer wrong"})
        ),
        "index": grpc.get_model_repository_index(headers=auth, as_json=True).get("models", []),
        "unload": attempt(lambda: grpc.unload_model("tabular", headers=auth)),
        "after_unload": {
            "ready": grpc.is_model_ready("tabular"),
            "index": http.get_model_repository_index(headers=auth),
        },
        "load": attempt(lambda: http.load_model("tabular", headers=auth)),
        "after_load": {
            "ready": http.is_model_ready("tabular"),
            "index": http.get_model_repository_index(headers=auth),
        },
        "unknown": {
            "grpc": attempt(lambda: grpc.load_model("nope", headers=auth)),
            "http": attempt(lambda: http.unload_model("nope", headers=auth)),
        },
        "with_config": attempt(lambda: grpc.load_model("tabular", headers=auth, config="{}")),
    }


def settings(grpc, http, token):
    auth = {"authorization": f"Bearer {token}"}
    return {
        "log": grpc.get_log_settings(as_json=True)["settings"],
        "verbose": http.update_log_settings({"log_verbose_level": 1}, headers=auth),
        "back": grpc.update_log_settings(
            {"log_info": True, "log_verbose_level": 0}, headers=auth, as_json=True
        )["settings"],
        "no_token": attempt(lambda: http.update_log_settings({"log_info": False})),
        "log_file": attempt(
            lambda: grpc.update_log_settings({"log_file": "elsewhere.log"}, headers=auth)
        ),
        "trace": grpc.get_trace_settings(as_json=True)["settings"],
        "model_trace": http.get_trace_settings(model_name="digits"),
        "trace_no_token": attempt(lambda: http.update_trace_settings(settings={"trace_rate": "2"})),
        "trace_change": attempt(
            lambda: http.update_trace_settings(settings={"trace_rate": "2"}, headers=auth)
        ),
        "trace_of_a_model": attempt(
            lambda: grpc.update_trace_settings("photos", {"trace_rate": "2"}, headers=auth)
        ),
    }


def sequence(module, client):
    images = np.zeros((1, 8, 8, 1), np.uint8)
    tensor = module.InferInput("images", list(images.shape), "UINT8")
    tensor.set_data_from_numpy(images)
    return attempt(lambda: client.infer(PIPELINE, [tensor], sequence_id=7, sequence_start=True))


def unimplemented(grpc):
    return {"grpc": attempt(lambda: grpc.register_cuda_shared_memory("gpu", HANDLE, 0, 64))}


def main(grpc_url, http_url, token):
    grpc = grpcclient.InferenceServerClient(grpc_url)
    http = httpclient.InferenceServerClient(http_url)
    report = {
        "extensions": {
            "grpc": grpc.get_server_metadata(as_json=True)["extensions"],
            "http": http.get_server_metadata()["extensions"],
        },
        "config": configs(grpc, http),
        "classification": classification(grpc, http),
        "repository": repository(grpc, http, token),
        "settings": settings(grpc, http, token),
        "sequence": {"grpc": sequence(grpcclient, grpc), "http": sequence(httpclient, http)},
        "unimplemented": unimplemented(grpc),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:4])
