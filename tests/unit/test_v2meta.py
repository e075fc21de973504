"""A pipeline described as Triton's model config: batch dimension, input formats."""

from __future__ import annotations

from strata.config.pipelines import Pipeline
from strata.proto.inference import model_config_pb2 as mc
from strata.wire.v2meta import model_config


def described(first: int, layout: str | None) -> mc.ModelConfig:
    pipeline = Pipeline(
        inputs=[{"name": "i", "datatype": "UINT8", "shape": [first, 8, 8, 3], "format": layout}],
        outputs=[{"name": "o", "datatype": "FP32", "shape": [first, 10]}],
        max_batch_size=16,
        model={"name": "m"},
    )
    batch = pipeline.max_batch_size if pipeline.batched else 0
    return model_config("p", "strata_pipeline", batch, pipeline.inputs, pipeline.outputs).config


def test_a_batched_pipeline_leaves_the_batch_dimension_out() -> None:
    config = described(-1, "NHWC")
    assert config.max_batch_size == 16
    assert list(config.input[0].dims) == [8, 8, 3] and list(config.output[0].dims) == [10]
    assert config.input[0].format == mc.ModelInput.FORMAT_NHWC


def test_a_pipeline_of_one_fixed_shape_is_described_whole() -> None:
    config = described(1, "NCHW")
    assert config.max_batch_size == 0
    assert list(config.input[0].dims) == [1, 8, 8, 3] and list(config.output[0].dims) == [1, 10]
    assert config.input[0].format == mc.ModelInput.FORMAT_NCHW


def test_an_input_without_a_format_says_none() -> None:
    assert described(-1, None).input[0].format == mc.ModelInput.FORMAT_NONE
