"""Demo models for Strata: trained on scikit-learn's bundled datasets, exported to ONNX.

`python -m models.build --out build` writes the model repository the inference service loads,
plus the client-form test data the end-to-end tests and benchmarks send.
"""
