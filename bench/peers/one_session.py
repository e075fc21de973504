"""The ONNX Runtime session every MLServer runtime here loads: CPU, one thread, as one Strata
inference worker has. Imported by name from this folder (the runtimes run with it on
PYTHONPATH, inside MLServer's own environment)."""

from __future__ import annotations

import onnxruntime
from mlserver.settings import ModelSettings
from mlserver.utils import get_model_uri


async def one_thread_session(settings: ModelSettings) -> onnxruntime.InferenceSession:
    """The model file `settings` names, in a one-thread CPU session."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    path = await get_model_uri(settings)
    return onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
