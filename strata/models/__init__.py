"""The model repository on disk (repository), a model version's inputs and outputs as
its ONNX graph declares them (onnxsig), and dataset statistics (normalisation).
"""
