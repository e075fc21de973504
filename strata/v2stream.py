"""ModelStreamInfer as the gateway and the inference service both serve it.

Each request of the stream is answered on its own, in the order answers are ready. A failed
request gets `error_message` (its status code's name, then what was wrong) and the stream goes
on, as Triton's does; the `id` a client sets tells its answers apart.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

from strata.errors import cut, status_of
from strata.grpc_errors import log_failure
from strata.proto.inference import grpc_service_pb2 as v2

Infer = Callable[[v2.ModelInferRequest], Awaitable[v2.ModelInferResponse]]


async def answer_stream(
    requests: AsyncIterator[v2.ModelInferRequest], infer: Infer
) -> AsyncIterator[v2.ModelStreamInferResponse]:
    """Run `infer` on every request of the stream concurrently; yield each answer when ready."""
    answers: asyncio.Queue[v2.ModelStreamInferResponse | None] = asyncio.Queue()

    async def answer(request: v2.ModelInferRequest) -> None:
        try:
            reply = await infer(request)
        except Exception as exc:  # one request's failure, reported in the stream
            code, detail = status_of(exc)
            log_failure("ModelStreamInfer", code, detail)
            failed = v2.ModelInferResponse(model_name=cut(request.model_name), id=cut(request.id))
            await answers.put(
                v2.ModelStreamInferResponse(
                    error_message=f"{code.name}: {detail}", infer_response=failed
                )
            )
        else:
            await answers.put(v2.ModelStreamInferResponse(infer_response=reply))

    async def read() -> None:
        async with asyncio.TaskGroup() as group:
            async for request in requests:
                group.create_task(answer(request))
        await answers.put(None)

    reader = asyncio.create_task(read())
    try:
        while (item := await answers.get()) is not None:
            yield item
    finally:
        reader.cancel()
