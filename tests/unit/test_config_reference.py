"""docs/configuration.md: current, complete, and rendered right from small models."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field, SecretStr

from scripts import config_reference
from strata.config.base import PLUGIN
from strata.config.settings import Settings
from tests.support.system import ROOT

PAGE = ROOT / "docs" / "configuration.md"


def test_the_committed_page_is_what_the_models_render() -> None:
    page = PAGE.read_text() if PAGE.exists() else ""
    assert page == config_reference.render(Settings), f"{PAGE.name} is stale: run make config-docs"


def test_check_passes_on_a_current_page_and_names_the_fix_on_a_stale_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(config_reference, "OUT", tmp_path / "configuration.md")
    monkeypatch.setattr(config_reference, "ROOT", tmp_path)
    assert config_reference.main(["--check"]) == 1
    assert config_reference.main([]) == 0
    assert config_reference.main(["--check"]) == 0
    (tmp_path / "configuration.md").write_text("old\n")
    assert config_reference.main(["--check"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "configuration.md is stale: run make config-docs",
        "configuration.md is stale: run make config-docs",
    ]


def test_the_page_is_deterministic_and_names_no_machine_path() -> None:
    page = config_reference.render(Settings)
    assert page == config_reference.render(Settings)
    assert str(ROOT) not in page
    assert "STRATA_SERVICES__GATEWAY__LISTEN" in page


class Leaf(BaseModel):
    """A leaf."""

    size: int = Field(default=3, ge=1, lt=10, description="How big.")


class Resize(BaseModel):
    """Scale an image."""

    kind: Literal["resize"] = Field(description="The step.")
    height: int = Field(gt=0, description="Rows after.")


class Crop(BaseModel):
    """Cut an image."""

    kind: Literal["crop"] = Field(description="The step.")
    box: Leaf = Field(default_factory=Leaf, description="Where.")


Step = Annotated[Resize | Crop, Field(discriminator="kind")]


class Toy(BaseModel):
    """A toy root."""

    leaf: Leaf = Field(default_factory=Leaf, description="Nested, defaulted.")
    maybe: Leaf | None = Field(default=None, description="Nested, optional.")
    by_name: dict[str, Leaf] = Field(min_length=1, description="Keyed.")
    items: list[Leaf] = Field(default_factory=list, description="Listed.")
    steps: list[Step] = Field(default_factory=list, description="Typed steps.")
    one: Resize | Crop = Field(discriminator="kind", description="A single step.")
    mode: Literal["fast", "slow"] | None = Field(default="fast", description="How, or <unset>.")
    tags: list[str] = Field(default_factory=lambda: ["a", "b"], description="Labels.")
    token: SecretStr = Field(default=SecretStr("hunter2"), description="Keep it | hidden.")
    pair: tuple[float, float] = Field(default=(0.0, 1.0), description="Low, high.")


@pytest.mark.parametrize("root", [Settings, Toy])
def test_every_key_of_every_model_is_on_the_page(root: type[BaseModel]) -> None:
    keys = set(rows(config_reference.render(root)))
    schema = root.model_json_schema()
    paths = list(schema_paths(schema, schema, ""))
    assert len(paths) > len(root.model_fields)  # the walk went below the top level
    missing = [path for path in paths if path not in keys]
    assert not missing, f"not on the page: {missing}"


@pytest.fixture(scope="module")
def toy() -> str:
    return config_reference.render(Toy)


def test_nested_dict_list_and_optional_models_are_walked(toy: str) -> None:
    table = rows(toy)
    assert table["leaf"] == ["`mapping`", "`{}`", "", "Nested, defaulted."]
    assert table["leaf.size"] == ["`int`", "`3`", "≥ 1, < 10", "How big."]
    assert table["maybe"][:2] == ["`mapping` or `null`", "`null`"]
    assert "maybe.size" in table
    assert table["by_name"][:3] == ["`dict[str, mapping]`", "required", "min length 1"]
    assert "by_name.<name>.size" in table
    assert table["items"][:2] == ["`list[mapping]`", "`[]`"]
    assert "items[].size" in table


def test_a_discriminated_union_has_a_table_per_member_titled_by_its_tag(toy: str) -> None:
    assert "### `steps[]`" in toy
    resize, crop = toy.index("#### `resize`\n\nScale an image."), toy.index("#### `crop`")
    assert resize < toy.index("| `steps[kind=resize].height` |") < crop
    assert crop < toy.index("| `steps[kind=crop].box.size` |")
    table = rows(toy)
    assert table["steps[kind=resize].kind"][:2] == ["`resize`", "required"]
    assert table["steps[kind=resize].height"][:3] == ["`int`", "required", "> 0"]
    assert "one[kind=crop].box.size" in table
    assert "steps[].height" not in table


def test_types_defaults_and_descriptions_read_plainly(toy: str) -> None:
    table = rows(toy)
    assert table["mode"] == [
        "one of `fast`, `slow` or `null`",
        '`"fast"`',
        "",
        "How, or &lt;unset&gt;.",
    ]
    assert table["tags"][:2] == ["`list[str]`", '`["a", "b"]`']
    assert table["token"] == ["`secret`", "hidden", "", "Keep it \\| hidden."]
    assert "hunter2" not in toy
    assert table["pair"][:2] == ["`[float, float]`", "`[0.0, 1.0]`"]


def test_sections_follow_the_root_fields_each_opening_with_its_docstring(toy: str) -> None:
    headings = re.findall(r"^## `(\w+)`$", toy, flags=re.MULTILINE)
    assert headings == list(Toy.model_fields)
    assert "## `leaf`\n\nA leaf.\n" in toy
    assert "## `steps`\n\n| Key" in toy  # a union has no one docstring
    assert "Environment variables" not in toy  # a plain model reads none


def rows(page: str) -> dict[str, list[str]]:
    """The page's table rows: key -> [type, default, constraints, description]."""
    found = {}
    for line in page.splitlines():
        if line.startswith("| `"):
            key, *cells = (c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1])
            found[key.strip("`")] = cells
    return found


def schema_paths(schema: dict[str, Any], node: dict[str, Any], path: str) -> Iterator[str]:
    """Every key path in a JSON schema, in the page's notation (see its legend)."""
    if "$ref" in node:
        node = schema["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    for key, sub in node.get("properties", {}).items():
        yield (child := f"{path}.{key}" if path else key)
        yield from schema_paths(schema, sub, child)
    if isinstance(node.get("items"), dict):
        yield from schema_paths(schema, node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from schema_paths(schema, node["additionalProperties"], f"{path}.<name>")
    tags = node.get("discriminator", {}).get("mapping", {})
    by_ref = {ref: tag for tag, ref in tags.items()}
    prop = node.get("discriminator", {}).get("propertyName")
    if "oneOf" in node and not tags:  # a stage union (stage_union): by kind, else a plugin
        by_ref, prop = {sub["$ref"]: stage_tag(schema, sub) for sub in node["oneOf"]}, "kind"
    for sub in node.get("anyOf", []) + node.get("oneOf", []):
        tag = by_ref.get(sub.get("$ref"))
        yield from schema_paths(
            schema, sub, f"{path.removesuffix('[]')}[{prop}={tag}]" if tag else path
        )


def stage_tag(schema: dict[str, Any], sub: dict[str, Any]) -> str:
    """A stage model's kind (its `kind` key's constant), or the plugin tag where it has none."""
    kind = schema["$defs"][sub["$ref"].rsplit("/", 1)[-1]]["properties"]["kind"]
    return kind.get("const", PLUGIN)
