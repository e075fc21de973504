"""The preprocess service, and the options of every preprocess step.

Each step kind has a model here, picked by its `kind`: the keys it takes, their defaults and
limits, checked when the config loads. The step's class in services/preprocess/steps takes
the model, validated, as its options (strata.registry); what needs a file (a vocabulary, a
tokenizer, statistics) is checked there, when the class is built.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BeforeValidator, ConfigDict, Field, model_validator

from strata.config.base import (
    OUTPUT,
    Count,
    Number,
    NumericDatatype,
    PluginStage,
    Strict,
    WritesOutput,
    kinds,
    stage_union,
)
from strata.registry import Family

Level = Annotated[int, Field(strict=True, ge=0, le=255)]


def _level(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 255


def _colour(value: object) -> object:
    """A gray level or an [r, g, b] triple as it is, else one error that says both forms
    (pydantic's own for the union would be one per form, each of several lines)."""
    if _level(value):
        return value
    if isinstance(value, list | tuple) and len(value) == 3 and all(map(_level, value)):
        return tuple(value)
    raise ValueError(f"must be a gray level 0-255 or [r, g, b] of three 0-255, got {value!r}")


# An opaque colour: a gray level (all three channels) or [r, g, b]; checked whole before the
# union sees it.
Colour = Annotated[Level | tuple[Level, Level, Level], BeforeValidator(_colour)]

Mode = Literal["L", "RGB", "RGBA", "BGR"]
Interpolation = Literal["area", "bilinear", "bicubic", "lanczos", "nearest"]
Offset = Annotated[int, Field(strict=True, ge=0)]

# In a file option, the number of the model version the request's arm calls: the version's
# own statistics, vocabulary or tokenizer (docs/preprocess-postprocess.md).
VERSION = "{version}"
FILE_OPTIONS = ("stats", "vocabulary", "tokenizer")
PER_VERSION = (
    f" May contain {VERSION}: the number of the model version the request's arm calls, so "
    "each version is fed its own file (e.g. m/{version}/stats.json)."
)

DEFAULT_MAX_PIXELS = 4096 * 4096
DEFAULT_MAX_BYTES = 16 * 1024 * 1024

KIND = "Which step this is; picks the keys it takes."
BACKGROUND = (
    "A gray level 0-255 or [r, g, b] that transparent pixels are laid over when the alpha "
    "channel is dropped; without it, alpha is simply dropped."
)
INTERPOLATION = (
    "Pillow's filters, antialiased when shrinking as Pillow and torchvision are: area (box: "
    "averages the pixels each output pixel covers), bilinear, bicubic, lanczos or nearest."
)
MODE = "L (grayscale), RGB, RGBA or BGR (RGB in reversed order, as OpenCV models expect)."


class PreprocessSettings(Strict):
    """Where the preprocess steps run."""

    inline_max_bytes: int = Field(
        default=16384,
        ge=0,
        description="A call whose tensors hold at most this many bytes runs its steps on the "
        "event loop (a thread hand-off costs more than the steps of a small input); larger "
        "calls, e.g. big images or long texts, run on a worker thread so the loop stays free.",
    )
    threads: int = Field(
        default=1,
        ge=1,
        description="Calls whose steps run at once in one replica (the worker threads of calls "
        "over inline_max_bytes), and the threads the steps' native libraries may use (the "
        "tokenizer's pool, OpenBLAS/OpenMP). 1: a replica works on one core, so replicas scale "
        "as processes (docs/preprocess-postprocess.md#replicas); more lets one replica use "
        "more cores, contending with the other replicas on the same ones.",
    )
    version_check_seconds: float = Field(
        default=1.0,
        ge=0,
        description="Pipelines fed per model version ({version} in a file option): how often "
        "a version's files are looked at again (sizes and times), to rebuild and check its "
        "steps after a hot swap replaced them; 0: at every request.",
    )


class StepSpec(Strict):
    """What every preprocess step takes beside its own options."""

    kind: str = Field(description=KIND)
    name: str | None = Field(
        default=None,
        min_length=1,
        description="Name in timings and logs; defaults to kind; unique among the pipeline's "
        "steps (give one a name to use a kind twice).",
    )

    @property
    def label(self) -> str:
        """The step's name in timings and logs."""
        return self.name or self.kind


class NormalizeTextStep(StepSpec, WritesOutput):
    """Strip, lowercase and Unicode-normalise each string; the shape is kept."""

    kind: Literal["normalize_text"] = Field(description=KIND)
    input: str = Field(description="BYTES tensor.")
    output: str | None = Field(default=None, description=OUTPUT)
    strip: bool = Field(default=True, description="Remove leading and trailing whitespace.")
    lowercase: bool = Field(default=False, description="Lowercase (str.lower()).")
    unicode: Literal["NFC", "NFKC", "NFD", "NFKD", "none"] = Field(
        default="NFC", description="Unicode normal form, or none to leave the text as it is."
    )


class TokenizeStep(StepSpec):
    """INT64 [batch, length] token ids, attention mask and token type ids."""

    kind: Literal["tokenize"] = Field(description=KIND)
    input: str = Field(description="BYTES tensor of texts; consumed, not passed on.")
    tokenizer: str = Field(
        description="Path of the tokenizer.json, relative to the repository." + PER_VERSION
    )
    max_length: Count = Field(description="Most tokens per text (special tokens included).")
    truncation: bool = Field(
        default=True, description="Cut longer texts; false refuses them with INVALID_ARGUMENT."
    )
    padding: Literal["longest", "max_length"] = Field(
        default="longest",
        description="Pad to the longest text in the batch (longest) or to max_length.",
    )
    pair: str | None = Field(
        default=None,
        description="A second BYTES tensor: sentence pairs (token_type_ids tell them apart); "
        "consumed too.",
    )
    add_special_tokens: bool = Field(default=True, description="Add e.g. [CLS] and [SEP].")
    pad_token: str | None = Field(
        default=None,
        description="The pad token; the file's own, else [PAD], when unset. Must be in the "
        "vocabulary.",
    )
    input_ids: str | None = Field(
        default="input_ids", description="Output tensor of token ids; null drops it."
    )
    attention_mask: str | None = Field(
        default="attention_mask", description="Output tensor of the attention mask; null drops it."
    )
    token_type_ids: str | None = Field(
        default="token_type_ids", description="Output tensor of token type ids; null drops it."
    )

    @model_validator(mode="after")
    def _some_output(self) -> TokenizeStep:
        if self.input_ids is None and self.attention_mask is None and self.token_type_ids is None:
            raise ValueError("every output is switched off; keep at least input_ids")
        return self


class VocabularyStep(StepSpec, WritesOutput):
    """Each string to its INT64 id from a vocabulary file, same shape."""

    kind: Literal["vocabulary"] = Field(description=KIND)
    input: str = Field(description="BYTES tensor (any shape).")
    vocabulary: str = Field(
        description="The file, relative to the repository: .txt (one entry a line; the id is "
        "the line number from 0) or .json (a list, ids by position, or an object of entry -> id)."
        + PER_VERSION
    )
    output: str | None = Field(default=None, description=OUTPUT)
    oov_id: Annotated[int, Field(strict=True)] | None = Field(
        default=None,
        description="Id of unknown entries; without it an unknown entry is INVALID_ARGUMENT.",
    )


class DecodeStep(StepSpec, WritesOutput):
    """PNG or JPEG bytes, or raw UINT8 pixel arrays, to one UINT8 image batch."""

    kind: Literal["decode"] = Field(description=KIND)
    input: str = Field(description="BYTES of PNG/JPEG ([batch]), or UINT8 images.")
    output: str | None = Field(default=None, description=OUTPUT)
    mode: Mode = Field(default="RGB", description=f"{MODE} Converted as color does.")
    max_pixels: Count = Field(
        default=DEFAULT_MAX_PIXELS,
        description="Largest width x height accepted, checked from the header before decoding.",
    )
    max_bytes: Count = Field(
        default=DEFAULT_MAX_BYTES, description="Largest encoded image accepted."
    )
    max_batch_pixels: Count = Field(
        default=4 * DEFAULT_MAX_PIXELS,
        description="Most pixels all the images of one request may decode to.",
    )
    height: int | None = Field(
        default=None,
        strict=True,
        gt=0,
        description="Resize every image to this height (give width too).",
    )
    width: int | None = Field(
        default=None,
        strict=True,
        gt=0,
        description="Resize every image to this width (give height too).",
    )
    interpolation: Interpolation = Field(
        default="area", description=f"For that resize: {INTERPOLATION}"
    )
    background: Colour | None = Field(default=None, description=BACKGROUND)
    exif_orientation: bool = Field(default=True, description="Rotate/flip by the EXIF tag.")

    @model_validator(mode="after")
    def _both_sizes(self) -> DecodeStep:
        if (self.height is None) != (self.width is None):
            raise ValueError("give both height and width, or neither")
        return self


class ColorStep(StepSpec, WritesOutput):
    """Convert UINT8 images between grayscale, RGB and RGBA."""

    kind: Literal["color"] = Field(description=KIND)
    input: str = Field(description="UINT8 images (three channels are read as RGB).")
    output: str | None = Field(default=None, description=OUTPUT)
    mode: Mode = Field(description=MODE)
    background: Colour | None = Field(default=None, description=BACKGROUND)


class ResizeStep(StepSpec):
    """Resize [batch, H, W] or [batch, H, W, C] images: UINT8 stays UINT8, other types to
    FP32."""

    kind: Literal["resize"] = Field(description=KIND)
    input: str = Field(description="Images, resized in place.")
    height: Count | None = Field(default=None, description="Output height (give width too).")
    width: Count | None = Field(default=None, description="Output width (give height too).")
    shorter: Count | None = Field(
        default=None,
        description="Instead of height and width: the shorter side's length, the aspect kept "
        "(the longer side rounded down, as torchvision's Resize(n)).",
    )
    interpolation: Interpolation = Field(default="area", description=INTERPOLATION)
    crop_window: bool = Field(
        default=True,
        description="Straight after a decode, with a crop of the same images next: resize only "
        "the window the crop keeps (Pillow's box), 50-60% of the resize's cost, the same pixels "
        "within one level in a few tenths of a percent of values (none for area); false: "
        "exactly those of resizing the whole image, then cropping.",
    )

    @model_validator(mode="after")
    def _one_size(self) -> ResizeStep:
        sized = (self.height is not None, self.width is not None)
        if self.shorter is None and sized != (True, True):
            raise ValueError("give height and width, or shorter")
        if self.shorter is not None and any(sized):
            raise ValueError("give height and width, or shorter, not both")
        return self


class CropStep(StepSpec, WritesOutput):
    """A height x width window of every image: centred, or at top/left."""

    kind: Literal["crop"] = Field(description=KIND)
    input: str = Field(description="Images [batch, H, W(, C)], any numeric type (kept).")
    output: str | None = Field(default=None, description=OUTPUT)
    height: Count = Field(description="Crop height.")
    width: Count = Field(description="Crop width.")
    top: Offset | None = Field(
        default=None, description="First row of the box; centred when top and left are unset."
    )
    left: Offset | None = Field(default=None, description="First column of the box.")

    @model_validator(mode="after")
    def _both_corners(self) -> CropStep:
        if (self.top is None) != (self.left is None):
            raise ValueError("give both top and left (a box), or neither (a centre crop)")
        return self


class PadStep(StepSpec, WritesOutput):
    """Borders of a constant value around every image; the type is kept."""

    kind: Literal["pad"] = Field(description=KIND)
    input: str = Field(description="Images [batch, H, W(, C)], any numeric type.")
    output: str | None = Field(default=None, description=OUTPUT)
    top: Offset = Field(default=0, description="Rows added above.")
    bottom: Offset = Field(default=0, description="Rows added below.")
    left: Offset = Field(default=0, description="Columns added on the left.")
    right: Offset = Field(default=0, description="Columns added on the right.")
    value: Number = Field(default=0.0, description="The border's value (must fit the type).")


class LayoutStep(StepSpec, WritesOutput):
    """Channels last (HWC) to channels first (CHW), or back."""

    kind: Literal["layout"] = Field(description=KIND)
    input: str = Field(description="Images [batch, H, W, C] (or [batch, C, H, W] for HWC).")
    output: str | None = Field(default=None, description=OUTPUT)
    to: Literal["CHW", "HWC"] = Field(
        description="CHW: [batch, H, W, C] -> [batch, C, H, W]; HWC: the reverse. Grayscale "
        "[batch, H, W] gains a channel axis of 1."
    )


class NormalizeStep(StepSpec, WritesOutput):
    """(x * scale - mean) / std per channel, to FP32: ImageNet-style normalisation."""

    kind: Literal["normalize"] = Field(description=KIND)
    input: str = Field(description="Numeric images [batch, H, W(, C)] or [batch, C, H, W].")
    output: str | None = Field(default=None, description=OUTPUT)
    mean: list[Number] = Field(
        min_length=1, description="One per channel (or one for all), after scale."
    )
    std: list[Annotated[float, Field(strict=True, gt=0)]] = Field(
        min_length=1, description="One per channel (or one for all); each above 0."
    )
    scale: Number = Field(
        default=1.0, description="Multiplies x first, e.g. 0.00392156862745098 (1/255)."
    )
    layout: Literal["HWC", "CHW"] = Field(
        default="HWC", description="Where the channels are: last (HWC) or after the batch (CHW)."
    )

    @model_validator(mode="after")
    def _as_many(self) -> NormalizeStep:
        if len(self.mean) != len(self.std):
            raise ValueError(f"{len(self.mean)} means but {len(self.std)} stds; give as many")
        return self


class ScaleStep(StepSpec):
    """x * factor + offset, cast to FP32."""

    kind: Literal["scale"] = Field(description=KIND)
    input: str = Field(description="Numeric tensor, scaled in place.")
    factor: Number = Field(default=1.0, description="Multiplier.")
    offset: Number = Field(default=0.0, description="Added after the multiplication.")


class ClipStep(StepSpec):
    """Clamp values into [low, high]; infinities go to the bounds."""

    kind: Literal["clip"] = Field(description=KIND)
    input: str = Field(description="Numeric tensor, clipped in place; integers keep their type.")
    low: Number | None = Field(default=None, description="Lowest value; open when unset.")
    high: Number | None = Field(default=None, description="Highest value; open when unset.")
    nan: Number | None = Field(
        default=None, description="What NaN becomes; without it, NaN is INVALID_ARGUMENT."
    )

    @model_validator(mode="after")
    def _a_range(self) -> ClipStep:
        if self.low is None and self.high is None:
            raise ValueError("clip needs 'low', 'high' or both")
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"clip: low {self.low} is above high {self.high}")
        return self


class CastStep(StepSpec, WritesOutput):
    """Convert to another numeric datatype, refusing values it cannot hold."""

    kind: Literal["cast"] = Field(description=KIND)
    input: str = Field(description="Numeric tensor.")
    output: str | None = Field(default=None, description=OUTPUT)
    datatype: NumericDatatype = Field(description="The v2 datatype to convert to.")
    round: bool = Field(
        default=False, description="Round floats to the nearest integer instead of truncating."
    )


class FlattenStep(StepSpec, WritesOutput):
    """Every dimension after the batch into one."""

    kind: Literal["flatten"] = Field(description=KIND)
    input: str = Field(description="Tensor to flatten.")
    output: str | None = Field(default=None, description=OUTPUT)


class StandardizeStep(StepSpec):
    """(x - mean) / std per feature, with statistics from a stats file."""

    kind: Literal["standardize"] = Field(description=KIND)
    input: str = Field(description="FP32 [batch, features], standardised in place.")
    stats: str = Field(
        description="The stats file (written by fit-stats), relative to the repository."
        + PER_VERSION
    )
    fingerprint: str | None = Field(
        default=None, description="The fingerprint the stats must have."
    )
    model_yaml: str | None = Field(
        default=None,
        description="The model's model.yaml, whose preprocess_fingerprint (for the version "
        "fed, where it records one per version) the stats must have.",
    )

    @model_validator(mode="after")
    def _one_fingerprint(self) -> StandardizeStep:
        if self.fingerprint is not None and self.model_yaml is not None:
            raise ValueError("give fingerprint or model_yaml, not both")
        if self.fingerprint is not None and VERSION in self.stats:
            raise ValueError(
                f"stats per model version ({VERSION}) have a fingerprint per version: give "
                "model_yaml, whose preprocess_fingerprint records each version's"
            )
        return self


BUILTIN_STEPS = (
    NormalizeTextStep,
    TokenizeStep,
    VocabularyStep,
    DecodeStep,
    ColorStep,
    ResizeStep,
    CropStep,
    PadStep,
    LayoutStep,
    NormalizeStep,
    ScaleStep,
    ClipStep,
    CastStep,
    FlattenStep,
    StandardizeStep,
)


class PluginStep(PluginStage, StepSpec):
    """A step of your own code (docs/plugins.md): `kind` is an import path
    (package.module:Name) or an entry point's name in group strata.steps; the other keys
    (but name) are the step's options, validated by its Options where preprocess runs it."""

    model_config = ConfigDict(extra="allow")
    family: ClassVar[Family] = Family(
        "preprocess step", "strata.steps", "process", kinds(BUILTIN_STEPS)
    )


Step = stage_union(BUILTIN_STEPS, PluginStep)


def per_version(steps: list[StepSpec]) -> bool:
    """Whether any step reads a file of the model version it feeds ({version} in a path)."""
    return any(
        VERSION in (getattr(s, option, None) or "") for s in steps for option in FILE_OPTIONS
    )
