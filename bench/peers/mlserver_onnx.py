"""An MLServer runtime for one ONNX file (MLServer 1.7 ships none): runs in MLServer's venv.

MLServer imports this module by the `implementation` of the benchmark's model-settings.json
(bench/peers/servers.py writes it, and puts this folder on MLServer's PYTHONPATH). The model
file is the settings' `parameters.uri`. Its adaptive batcher hands `predict` whole batches.
"""

from __future__ import annotations

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from one_session import one_thread_session


class OnnxModel(MLModel):
    """One CPU session with one thread, as one Strata inference worker has."""

    async def load(self) -> bool:
        self._session = await one_thread_session(self._settings)
        self._inputs = {i.name for i in self._session.get_inputs()}
        self._outputs = [o.name for o in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {
            i.name: NumpyCodec.decode_input(i).astype(np.float32)
            for i in payload.inputs
            if i.name in self._inputs
        }
        results = self._session.run(self._outputs, feeds)
        outputs = [
            NumpyCodec.encode_output(name, value)
            for name, value in zip(self._outputs, results, strict=True)
        ]
        return InferenceResponse(model_name=self.name, id=payload.id, outputs=outputs)
