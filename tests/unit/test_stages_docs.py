"""docs/pipelines.md's config examples are the default config's cascade and the text
config's two-stage topics, valid as written, and the cascade's graph fits the demo models'
signatures."""

import re

import yaml

from strata.config import load_settings
from strata.config.pipelines import Pipeline
from strata.shapes import wiring
from tests.support.system import DEFAULT_CONFIG, ROOT

DOC = ROOT / "docs" / "pipelines.md"


def example() -> dict:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S)
    return yaml.safe_load(blocks[0])["pipelines"]["digits-cascade"]


def test_the_example_is_the_default_configs_cascade() -> None:
    shown = Pipeline.model_validate(example())
    served = load_settings(DEFAULT_CONFIG).pipelines["digits-cascade"]
    assert shown == served
    assert [stage.label for stage in shown.stages] == ["large"]


def test_the_examples_graph_fits_the_demo_models() -> None:
    settings = load_settings(DEFAULT_CONFIG)
    flows = wiring.model_flows(settings.repository, "digits-cascade", Pipeline(**example()))
    assert [label for label, _ in flows] == [
        "model 'digits' version 1, model 'digits-large' version 1"
    ]
    ((_, given),) = flows
    assert sorted(given.tensors) == ["logits"]
    assert (given.tensors["logits"].made.datatype, given.tensors["logits"].made.rank) == ("FP32", 2)


def test_each_deployment_loads_the_stage_models_its_routes_name() -> None:
    settings = load_settings(DEFAULT_CONFIG)
    # The cascade's digits-large has no routes: it runs on the first deployment, a.
    assert "digits-large" in settings.models_of("a")
    assert "digits-large" not in settings.models_of("b")


def test_the_text_example_is_the_text_configs_two_stages() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S)
    (block,) = [b for b in blocks if "topics-staged:" in b]
    shown = Pipeline.model_validate(yaml.safe_load(block)["topics-staged"])
    served = load_settings(ROOT / "configs" / "text.yaml").pipelines["topics-staged"]
    assert shown == served
    assert shown.stage_names() == ["minilm", "classify"]
