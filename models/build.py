"""Build the demo model repository: `python -m models.build --out build`.

Writes, per model, `repository/<model>/model.yaml`, `repository/<model>/<version>/model.onnx`
and golden validation cases, and the client-form test split under `data/`. Every run writes the
same bytes: training runs on one BLAS thread, since the sums' order (and so the weights' last
bits) follows the thread count, and on a busy machine BLAS threads spin (digits took 32 s of
CPU on two threads, 1.6 s on one).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import numpy as np
import yaml
from threadpoolctl import threadpool_limits

from models import accumulator, digits, repeat, tabular
from models.common import BuiltModel
from models.onnx_export import session
from strata.models.repository import write_npz

# Keyed by name, or name@version for a model's later versions.
BUILDERS: dict[str, Callable[[Path], BuiltModel]] = {
    "digits": digits.build,
    "digits@2": digits.build_v2,
    "digits-large": digits.build_large,
    "tabular": tabular.build,
}
MAX_BATCH_SIZE = 64
CASE_ROWS = (1, 4, 16)
TOLERANCE = 1e-4


def predict(model: BuiltModel, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the exported graph in ONNX Runtime; returns output name -> array."""
    runner = session(model.graph)
    names = [output.name for output in runner.get_outputs()]
    return dict(zip(names, runner.run(names, inputs), strict=True))


def check_agreement(model: BuiltModel) -> float:
    """Fail unless ONNX and scikit-learn predict the same classes; return the test accuracy."""
    logits = predict(model, model.test_inputs)["logits"]
    predictions = logits.argmax(axis=1)
    mismatches = int((predictions != model.sklearn_predictions).sum())
    if mismatches:
        raise AssertionError(f"{model.name}: ONNX disagrees with scikit-learn on {mismatches} rows")
    return float((predictions == model.test_labels).mean())


def write_cases(model: BuiltModel, directory: Path) -> None:
    """Golden cases from consecutive, distinct rows of the test split."""
    start = 0
    for index, rows in enumerate(CASE_ROWS):
        inputs = {name: value[start : start + rows] for name, value in model.test_inputs.items()}
        outputs = predict(model, inputs)
        arrays = {f"input.{name}": value for name, value in inputs.items()}
        arrays |= {f"output.{name}": value for name, value in outputs.items()}
        arrays |= {"atol": np.float64(TOLERANCE), "rtol": np.float64(TOLERANCE)}
        write_npz(directory / f"case_{index:03d}.npz", arrays)
        start += rows


def write_model(model: BuiltModel, out: Path) -> None:
    """The repository entry the inference service loads, and the client-form test data."""
    root = out / "repository" / model.name
    version = root / model.version
    version.mkdir(parents=True, exist_ok=True)
    (version / "model.onnx").write_bytes(model.graph.SerializeToString())
    config = {
        "platform": "onnxruntime_onnx",
        "max_batch_size": MAX_BATCH_SIZE,
        "labels": model.labels,
        **model.config,
    }
    (root / "model.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    write_cases(model, version / "validation")
    if model.version == "1":
        write_npz(out / "data" / f"{model.name}_test.npz", model.client_test)


def train(builder: Callable[[Path], BuiltModel], repository: Path) -> BuiltModel:
    """`builder`'s model, trained on one BLAS thread: the same bytes on any machine."""
    with threadpool_limits(1):
        return builder(repository)


def build_all(out: Path) -> dict[str, float]:
    """Build every demo model into `out`; returns each model's test accuracy in ONNX Runtime."""
    accuracies = {}
    for name, builder in BUILDERS.items():
        model = train(builder, out / "repository")
        accuracies[name] = check_agreement(model)
        write_model(model, out)
        print(
            f"{name}: train {model.train_size}, test {len(model.test_labels)}, "
            f"onnxruntime accuracy {accuracies[name]:.4f}"
        )
    accumulator.write(out)  # stateful, and trained on nothing: checked against numpy instead
    print(f"{accumulator.NAME}: checked against numpy")
    repeat.write(out)  # decoupled, and trained on nothing: checked against numpy too
    print(f"{repeat.NAME}: checked against numpy")
    return accuracies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build"), help="output directory")
    build_all(parser.parse_args().out)


if __name__ == "__main__":
    main()
