"""The derivation manifest (`gpuval profiles derive --manifest benchmarks/derivation.yaml`): which committed
runs each shipped profile's bounds come from, derived in strict mode (gpuval.derive), and which bounds have
drifted from what their runs give now (a test keeps the shipped profiles and the manifest in step)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from gpuval.config import Profile, validate_model
from gpuval.derive import DEFAULT_K, DEFAULT_MARGIN, DEFAULT_MIN_RUNS, Rule, derive_profile
from gpuval.derive_runs import load_run
from gpuval.errors import UsageError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # k: .inf would leave no bound


class ManifestRun(_Strict):
    path: str
    skip: list[str] = Field(default_factory=list, description="checks not taken from this run (globs)")
    why: str = Field("", description="why those checks are skipped")


class ManifestProfile(_Strict):
    profile: str = Field(description="the profile file: the base, and where the derived profile is written")
    keep: list[str] = Field(
        default_factory=list,
        description="checks (globs) not derived from any run: their hand-set bounds stay",
    )
    runs: list[str | ManifestRun]


class Manifest(_Strict):
    root: str = Field(".", description="the folder profile paths are relative to, from the manifest's folder")
    results: str = Field("benchmarks/results", description="the folder run paths are relative to, from root")
    k: float = Field(DEFAULT_K, ge=0)
    min_runs: int = Field(DEFAULT_MIN_RUNS, ge=2)
    margin: float = Field(DEFAULT_MARGIN, ge=0, lt=1)
    profiles: dict[str, ManifestProfile]


@dataclass(frozen=True)
class Derived:
    name: str
    path: Path
    text: str
    base: Profile
    profile: Profile


def from_manifest(
    manifest_path: Path, only: list[str] | None = None, notes: list[str] | None = None
) -> list[Derived]:
    """Every profile the manifest lists (or those in `only`), derived in strict mode; nothing written.
    What was left out goes to `notes`, each line after its profile's name."""
    from gpuval.config import read_yaml

    manifest = validate_model(Manifest, read_yaml(manifest_path, "manifest"), f"manifest '{manifest_path}'")
    root = (manifest_path.parent / manifest.root).resolve()
    rule = Rule(k=manifest.k, min_runs=manifest.min_runs, margin=manifest.margin)
    unknown = [name for name in only or [] if name not in manifest.profiles]
    if unknown:
        raise UsageError(
            f"manifest '{manifest_path}' lists no profile '{unknown[0]}': {', '.join(manifest.profiles)}"
        )
    derived = []
    for name, entry in manifest.profiles.items():
        if only and name not in only:
            continue
        runs = []
        for item in entry.runs:
            run = item if isinstance(item, ManifestRun) else ManifestRun(path=item)
            skip = frozenset([*run.skip, *entry.keep])
            runs.append(load_run(root / manifest.results / run.path, label=run.path, skip=skip))
        path = root / entry.profile
        found: list[str] = []
        try:
            text, base, profile = derive_profile(path, runs, rule, strict=True, notes=found)
        finally:
            if notes is not None:
                notes += [f"{name}: {line}" for line in found]
        derived.append(Derived(name, path, text, base, profile))
    return derived


def drifted(derived: Derived) -> list[str]:
    """The checks whose bounds in the profile file differ from what its runs give now."""
    shipped, now = derived.base.checks, derived.profile.checks
    return [name for name in dict.fromkeys([*shipped, *now]) if shipped.get(name) != now.get(name)]
