"""Which GGUF file a model name means: a path, a manifest name, a variant ("name:quant"), or a
model on the Hugging Face hub ("hf://OWNER/REPO/FILE.gguf", "hf://OWNER/REPO:QUANT").

It sits above `models` and `variants`, which know nothing of each other's callers.
"""

from __future__ import annotations

import os
from pathlib import Path

from hybridllm.errors import ModelNotFoundError
from hybridllm.local import hub, models, variants


def _looks_like_path(model: str) -> bool:
    return "/" in model or os.sep in model or model.endswith(".gguf") or model.startswith("~")


def resolve_model(
    model: str | Path, *, pull: bool = False, progress: models.Progress | None = None
) -> Path:
    """A GGUF path for `model`: an existing file path, or a manifest name (pulled if asked).

    "name:quant" is a variant requantized on this machine (see `hybridllm.local.variants`); `pull`
    makes it when it is missing. An "hf://" name is downloaded from the hub when `pull` (else
    its cached file, or `ModelNotFoundError`).
    """
    if hub.is_hub_ref(model):
        assert isinstance(model, str)
        if pull:
            return hub.fetch(model, progress=progress)
        cached = hub.cached(model)
        if cached is None:
            raise ModelNotFoundError(
                f"{model} is not in the hub cache; run `hybridllm models pull {model}`",
                path=hub.hub_cache_dir(),
            )
        return cached
    if isinstance(model, str) and ":" in model and not _looks_like_path(model):
        return variants.resolve(model, make_missing=pull, progress=progress)
    if isinstance(model, Path) or _looks_like_path(model):
        path = Path(model).expanduser()
        if not path.is_file():
            raise ModelNotFoundError("model file does not exist", path=path)
        return path
    manifest = models.get_manifest(model)
    if models.is_present(manifest):
        return models.cached_path(manifest)
    if pull:
        return models.pull(manifest.name, progress=progress)
    raise ModelNotFoundError(
        f"model {manifest.name!r} has not been pulled; run `hybridllm models pull {manifest.name}`",
        path=models.cached_path(manifest),
    )
