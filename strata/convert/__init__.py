"""Model conversion: a PyTorch model to an ONNX model-repository entry (`strata convert`).

Export (dynamic batch and sequence axes, opset 17+), optimise (ONNX Runtime's transformer
optimiser for BERT-like models), optionally quantise to int8, check parity against PyTorch
on sample inputs, and write model.yaml, the version folder and validation cases. PyTorch is
needed here only (the `convert` extra); serving never imports this package.

The modules that need PyTorch are imported on use, so `strata convert --help` works without.
"""
