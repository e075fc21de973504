"""A closed loop from one tritonclient.grpc.aio client (one connection, as every tritonclient
user has): IN_FLIGHT callers, each sending its next call as its last is answered, CALLS
times; print the count of each answer code as JSON.

usage: triton_concurrent.py URL PIPELINE IN_FLIGHT CALLS
"""

import asyncio
import collections
import json
import sys

import numpy as np
import tritonclient.grpc.aio as tc
from tritonclient.utils import InferenceServerException


async def main(url: str, pipeline: str, in_flight: int, calls: int) -> None:
    codes: collections.Counter = collections.Counter()
    client = tc.InferenceServerClient(url)

    async def call(i: int) -> None:
        tensor = tc.InferInput("images", [1, 8, 8], "UINT8")
        tensor.set_data_from_numpy(np.full((1, 8, 8), i % 256, np.uint8))
        try:
            result = await client.infer(pipeline, [tensor], client_timeout=60)
            codes["OK" if result.get_response().outputs else "no outputs"] += 1
        except InferenceServerException as exc:
            codes[f"{exc.status()}: {exc.message()}"] += 1

    async def caller(i: int) -> None:
        for _ in range(calls):
            await call(i)

    try:
        await asyncio.gather(*(caller(i) for i in range(in_flight)))
    finally:
        await client.close()
    print(json.dumps(codes))


if __name__ == "__main__":
    url, pipeline, in_flight, calls = sys.argv[1:]
    asyncio.run(main(url, pipeline, int(in_flight), int(calls)))
