"""An MLServer runtime doing the image workload (bench/peers/photo.py) and the model: runs in
MLServer's venv.

The benchmark's model-settings.json names this class; the model file is its
`parameters.uri`. MLServer's adaptive batcher hands `predict` whole batches: the JPEGs of a
batch ([N] BYTES) are decoded and prepared one by one, as a user's runtime would, then run
through the model in one session call, and answered as Strata's `images` pipeline answers,
`scores` FP32 [N, 5] and `classes` INT64 [N, 5].
"""

from __future__ import annotations

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from one_session import one_thread_session
from photo import reference, top5


class ImageModel(MLModel):
    """One CPU session with one thread, as one Strata inference worker has."""

    async def load(self) -> bool:
        self._session = await one_thread_session(self._settings)
        self._input = self._session.get_inputs()[0].name
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        data = payload.inputs[0].data
        photos = getattr(data, "root", data)
        pixels = np.stack([reference(bytes(photo)) for photo in photos])
        (logits,) = self._session.run(None, {self._input: pixels})
        scores, classes = top5(logits)
        outputs = [
            NumpyCodec.encode_output("scores", scores),
            NumpyCodec.encode_output("classes", classes),
        ]
        return InferenceResponse(model_name=self.name, id=payload.id, outputs=outputs)
