"""tritonclient's system shared memory against the gateway, gRPC and HTTP, as JSON.

Run in its own process (tritonclient and Strata's stubs register the same protobuf names).
usage: triton_shm.py GRPC_URL HTTP_URL
For each protocol: registers an input and an output region, sends digits images from one and
has the scores written into the other (the labels come back in the answer as usual), then
tries what must be refused: bytes past a region, another client's region, a key outside the
shared memory root, a region larger than its object, a CUDA region. Before all that, as
Triton's shm examples begin, it unregisters every CUDA region and asks their status (none).
"""

import base64
import json
import os
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

IMAGES = np.arange(2 * 64, dtype=np.uint8).reshape(2, 8, 8)
OTHER = {"x-client-id": "someone-else"}

# What tritonclient.utils.cuda_shared_memory.get_raw_handle gives: a base64 IPC handle.
HANDLE = base64.b64encode(b"not a real handle")


def attempt(call):
    try:
        value = call()
        return {"status": "OK", "value": value}
    except InferenceServerException as exc:
        return {"status": str(exc.status()), "message": exc.message()}


def infer(module, client, offset=0, headers=None):
    images = module.InferInput("images", list(IMAGES.shape), "UINT8")
    images.set_shared_memory("in", IMAGES.nbytes, offset=offset)
    scores = module.InferRequestedOutput("scores")
    scores.set_shared_memory("out", 1024)
    labels = module.InferRequestedOutput("labels")
    result = client.infer("digits", [images], outputs=[scores, labels], headers=headers)
    return [[item.decode() for item in row] for row in result.as_numpy("labels").tolist()]


def plain_scores(module, client):
    images = module.InferInput("images", list(IMAGES.shape), "UINT8")
    images.set_data_from_numpy(IMAGES)
    result = client.infer("digits", [images], outputs=[module.InferRequestedOutput("scores")])
    return result.as_numpy("scores").tolist()


def statuses(client, headers=None):
    status = client.get_system_shared_memory_status(headers=headers)
    if isinstance(status, list):  # HTTP
        return sorted(region["name"] for region in status)
    return sorted(status.regions)


def cuda_names(status):
    if isinstance(status, list):  # HTTP
        return [region["name"] for region in status]
    return sorted(status.regions)


def one_protocol(module, url, tag):
    client = module.InferenceServerClient(url)
    begin = {
        "cuda_unregister_all": attempt(lambda: client.unregister_cuda_shared_memory()),
        "cuda_status_all": attempt(lambda: cuda_names(client.get_cuda_shared_memory_status())),
    }
    inputs = shm.create_shared_memory_region("in", f"/strata_e2e_in_{tag}", IMAGES.nbytes)
    outputs = shm.create_shared_memory_region("out", f"/strata_e2e_out_{tag}", 1024)
    try:
        shm.set_shared_memory_region(inputs, [IMAGES])
        client.register_system_shared_memory("in", f"/strata_e2e_in_{tag}", IMAGES.nbytes)
        client.register_system_shared_memory("out", f"/strata_e2e_out_{tag}", 1024)
        report = {
            **begin,
            "status": statuses(client),
            "labels": infer(module, client),
            "scores": shm.get_contents_as_numpy(outputs, np.float32, [2, 3]).tolist(),
            "plain_scores": plain_scores(module, client),
            "past_the_region": attempt(lambda: infer(module, client, offset=64)),
            "other_client": attempt(lambda: infer(module, client, headers=OTHER)),
            "other_status": statuses(client, OTHER),
            "twice": attempt(
                lambda: client.register_system_shared_memory("in", f"/strata_e2e_in_{tag}", 8)
            ),
            "escape": attempt(
                lambda: client.register_system_shared_memory("x", "/../etc/passwd", 8)
            ),
            "missing": attempt(
                lambda: client.register_system_shared_memory("x", "/strata_e2e_none", 8)
            ),
            "too_big": attempt(
                lambda: client.register_system_shared_memory("x", f"/strata_e2e_out_{tag}", 4096)
            ),
            "cuda_register": attempt(
                lambda: client.register_cuda_shared_memory("gpu", HANDLE, 0, 64)
            ),
            "cuda_status_one": attempt(lambda: client.get_cuda_shared_memory_status("gpu")),
            "cuda_unregister_one": attempt(lambda: client.unregister_cuda_shared_memory("gpu")),
        }
        client.unregister_system_shared_memory()
        report["after_unregister"] = statuses(client)
        return report
    finally:
        shm.destroy_shared_memory_region(inputs)
        shm.destroy_shared_memory_region(outputs)


def main(grpc_url, http_url):
    report = {
        # Names of this process's own: suites running at once share /dev/shm.
        "grpc": one_protocol(grpcclient, grpc_url, f"grpc_{os.getpid()}"),
        "http": one_protocol(httpclient, http_url, f"http_{os.getpid()}"),
    }
    print(json.dumps(report, default=str))


if __name__ == "__main__":
    main(*sys.argv[1:3])
