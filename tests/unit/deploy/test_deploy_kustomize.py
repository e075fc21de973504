"""A kustomize-style build of deploy/k8s, small enough to trust, and tests of it.

A kustomize binary need not be where the tests run, so the Kubernetes checks render the
overlays with `build`: the subset of kustomize that deploy/k8s uses (resources and bases,
ConfigMap and Secret generators without name hashes, strategic-merge patches found by kind and
name, the namespace and images transformers). Anything else in a kustomization fails loudly
rather than being ignored. Where kubectl is installed, its `kustomize` must render the same.
"""

from __future__ import annotations

import base64
import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

Resource = dict[str, Any]

SUPPORTED = {
    "apiVersion",
    "kind",
    "namespace",
    "resources",
    "configMapGenerator",
    "secretGenerator",
    "generatorOptions",
    "patches",
    "images",
}
# Lists whose items strategic merge matches by a key, as Kubernetes' patch strategy declares.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "imagePullSecrets": "name",
}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume"}
OVERLAYS = Path(__file__).resolve().parents[3] / "deploy" / "k8s" / "overlays"


def load_documents(path: Path) -> list[Resource]:
    """Every non-empty YAML document in `path`."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def build(folder: Path) -> list[Resource]:
    """The resources `kustomize build folder` emits, for the kustomize subset described above."""
    spec = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = sorted(set(spec) - SUPPORTED)
    if unknown:
        raise ValueError(f"{folder}/kustomization.yaml: unsupported fields {unknown}")
    resources: list[Resource] = []
    for entry in spec.get("resources", []):
        path = folder / entry
        resources += build(path) if path.is_dir() else load_documents(path)
    options = spec.get("generatorOptions", {})
    for generator in spec.get("configMapGenerator", []):
        resources.append(generate("ConfigMap", generator, folder, options))
    for generator in spec.get("secretGenerator", []):
        resources.append(generate("Secret", generator, folder, options))
    for patch in spec.get("patches", []):
        if set(patch) != {"path"}:
            raise ValueError(f"{folder}: only `patches: - path: FILE` is supported, got {patch}")
        for document in load_documents(folder / patch["path"]):
            target = find(resources, document["kind"], document["metadata"]["name"])
            resources[resources.index(target)] = strategic_merge(target, document)
    if "namespace" in spec:
        for resource in resources:
            if resource["kind"] not in CLUSTER_SCOPED:
                resource.setdefault("metadata", {})["namespace"] = spec["namespace"]
    for image in spec.get("images", []):
        set_image(resources, image)
    return resources


def generate(kind: str, generator: dict, folder: Path, options: dict) -> Resource:
    """A ConfigMap or Secret from `files` and `literals`, as kustomize's generators make them."""
    if not options.get("disableNameSuffixHash"):
        raise ValueError(f"{folder}: generators need disableNameSuffixHash (no hash support)")
    data: dict[str, str] = {}
    for entry in generator.get("files", []):
        key, _, path = entry.rpartition("=")
        # As the file is, line ends and all (deploy/front's refusal is an HTTP response: CRLF).
        data[key or Path(path).name] = (folder / path).read_bytes().decode()
    for entry in generator.get("literals", []):
        key, _, value = entry.partition("=")
        data[key] = value
    resource: Resource = {
        "apiVersion": "v1",
        "kind": kind,
        "metadata": {"name": generator["name"]},
    }
    if kind == "Secret":
        resource["type"] = "Opaque"
        resource["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    else:
        resource["data"] = data
    return resource


def find(resources: list[Resource], kind: str, name: str) -> Resource:
    """The one resource of `kind` named `name`."""
    matches = [r for r in resources if r["kind"] == kind and r["metadata"]["name"] == name]
    if len(matches) != 1:
        raise LookupError(f"{len(matches)} resources are {kind}/{name}")
    return matches[0]


def strategic_merge(base: Any, patch: Any, field: str = "") -> Any:
    """`patch` merged into a copy of `base`: maps merge, keyed lists merge by key, null deletes."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = strategic_merge(out[key], value, key)
            else:
                out[key] = copy.deepcopy(value)
        return out
    key = MERGE_KEYS.get(field)
    if key and isinstance(base, list) and isinstance(patch, list):
        out = copy.deepcopy(base)
        for item in patch:
            index = next((i for i, old in enumerate(out) if old.get(key) == item[key]), None)
            if index is None:
                out.append(copy.deepcopy(item))
            else:
                out[index] = strategic_merge(out[index], item, field)
        return out
    return copy.deepcopy(patch)


def pod_containers(resource: Resource) -> list[dict]:
    """The containers of a workload's pod template (none for other kinds)."""
    template = resource.get("spec", {}).get("template", {})
    spec = template.get("spec", {})
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def set_image(resources: list[Resource], rule: dict) -> None:
    """kustomize's images transformer: rename and retag containers running `rule['name']`."""
    for resource in resources:
        for container in pod_containers(resource):
            if "image" not in container:
                continue
            name, tag = split_image(container["image"])
            if name == rule["name"]:
                name = rule.get("newName", name)
                tag = rule.get("newTag", tag)
                container["image"] = f"{name}:{tag}" if tag else name


def split_image(image: str) -> tuple[str, str]:
    """(name, tag) of an image reference; the tag is empty when none is given."""
    name, sep, tag = image.rpartition(":")
    if not sep or "/" in tag:
        return image, ""
    return name, tag


def test_merge_matches_containers_and_env_by_name() -> None:
    base = {
        "spec": {
            "replicas": 2,
            "containers": [
                {"name": "a", "image": "x", "env": [{"name": "K", "value": "1"}]},
                {"name": "b", "image": "y"},
            ],
        }
    }
    patch = {
        "spec": {
            "replicas": 1,
            "containers": [{"name": "a", "env": [{"name": "K", "value": "2"}, {"name": "L"}]}],
        }
    }
    merged = strategic_merge(base, patch)
    assert merged["spec"]["replicas"] == 1
    first, second = merged["spec"]["containers"]
    assert first == {"name": "a", "image": "x", "env": [{"name": "K", "value": "2"}, {"name": "L"}]}
    assert second == {"name": "b", "image": "y"}
    assert base["spec"]["replicas"] == 2  # the base is not changed


def test_merge_replaces_unkeyed_lists_and_null_deletes() -> None:
    base = {"args": ["a", "b"], "ports": [{"containerPort": 1}], "drop": 1}
    merged = strategic_merge(base, {"args": ["c"], "ports": [{"containerPort": 2}], "drop": None})
    assert merged == {"args": ["c"], "ports": [{"containerPort": 2}]}


def test_build_applies_generators_patches_namespace_and_images(tmp_path: Path) -> None:
    base = tmp_path / "base"
    overlay = tmp_path / "overlay"
    base.mkdir()
    overlay.mkdir()
    (base / "app.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "app"},
                "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "img"}]}}},
            }
        )
    )
    (base / "conf.yaml").write_text("key: value\n")
    (base / "kustomization.yaml").write_text(
        "resources: [app.yaml]\n"
        "configMapGenerator: [{name: conf, files: [conf.yaml]}]\n"
        "generatorOptions: {disableNameSuffixHash: true}\n"
    )
    (overlay / "patch.yaml").write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: app}\nspec: {replicas: 3}\n"
    )
    (overlay / "kustomization.yaml").write_text(
        "namespace: ns\nresources: [../base]\npatches: [{path: patch.yaml}]\n"
        "images: [{name: img, newName: reg/img, newTag: '1.0'}]\n"
        "secretGenerator: [{name: s, literals: [token=t]}]\n"
        "generatorOptions: {disableNameSuffixHash: true}\n"
    )
    resources = build(overlay)
    app = find(resources, "Deployment", "app")
    assert app["spec"]["replicas"] == 3
    assert app["spec"]["template"]["spec"]["containers"][0]["image"] == "reg/img:1.0"
    assert find(resources, "ConfigMap", "conf")["data"] == {"conf.yaml": "key: value\n"}
    assert find(resources, "Secret", "s")["data"] == {"token": "dA=="}
    assert {r["metadata"]["namespace"] for r in resources} == {"ns"}


def test_build_refuses_what_it_does_not_implement(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("commonLabels: {a: b}\n")
    with pytest.raises(ValueError, match="commonLabels"):
        build(tmp_path)


def keyed_lists_sorted(value: Any, field: str = "") -> Any:
    """`value` with every list strategic merge keys sorted by its key: kustomize puts items a
    patch adds first, `build` last, and Kubernetes reads either the same."""
    if isinstance(value, dict):
        return {k: keyed_lists_sorted(v, k) for k, v in value.items()}
    if isinstance(value, list):
        items = [keyed_lists_sorted(v) for v in value]
        key = MERGE_KEYS.get(field)
        return sorted(items, key=lambda item: item[key]) if key else items
    return value


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
@pytest.mark.slow  # kubectl
@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_kubectl_kustomize_renders_what_build_renders(overlay: str) -> None:
    folder = OVERLAYS / overlay
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(folder)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout

    def by_name(resources: list[Resource]) -> dict[tuple[str, str], Resource]:
        return {(r["kind"], r["metadata"]["name"]): keyed_lists_sorted(r) for r in resources}

    real = [doc for doc in yaml.safe_load_all(rendered) if doc]
    assert by_name(real) == by_name(build(folder))
