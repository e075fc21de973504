"""An MLServer runtime for the embed workload (bench/peers/sentences.py and MiniLM): runs in
MLServer's venv.

The model file is the settings' `parameters.uri`, the tokenizer file `parameters.extra
.tokenizer`. MLServer's adaptive batcher hands `predict` whole batches: the sentences of a
batch ([N] BYTES) are tokenised together and run in one session call, answered as Strata's
`embed` pipeline answers, `embedding` FP32 [N, 384].
"""

from __future__ import annotations

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from one_session import one_thread_session
from sentences import features, tokenizer


class TextModel(MLModel):
    """One CPU session with one thread, as one Strata inference worker has."""

    async def load(self) -> bool:
        self._session = await one_thread_session(self._settings)
        self._tokenizer = tokenizer(self._settings.parameters.extra["tokenizer"])
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        data = payload.inputs[0].data
        texts = [bytes(t).decode() for t in getattr(data, "root", data)]
        (embedding,) = self._session.run(None, features(self._tokenizer, texts))
        outputs = [NumpyCodec.encode_output("embedding", embedding)]
        return InferenceResponse(model_name=self.name, id=payload.id, outputs=outputs)
