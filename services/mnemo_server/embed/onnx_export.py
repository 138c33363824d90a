"""One-time export of a sentence-transformers (BERT-family) model to ONNX.

The exported graph takes input_ids / attention_mask / token_type_ids and returns the last
hidden state; pooling and normalisation happen in numpy (see OnnxEmbedder)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

from mnemo_server.store.durable import rename_tree, replace_file


def export_dir_for(cache_root: Path, model_id: str, model_dir: Path, fingerprint: str) -> Path:
    """Where the model's export is kept: by its name, directory and the fingerprint of its
    files (embed/fingerprint.py). Without the fingerprint, weights replaced in place (an
    upgrade of the package that ships the model) kept their stale export, which `mnemo
    reembed` then used while recording the new files' fingerprint."""
    key = f"{model_id}\0{model_dir.resolve()}\0{fingerprint}"
    return cache_root / f"onnx-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def quantize_int8(onnx_file: Path) -> Path:
    """Dynamic int8 quantisation of the MatMul weights, per output channel (whole-graph or
    per-tensor quantisation costs retrieval quality; this variant measured none)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    target = onnx_file.with_name("model.int8.onnx")
    if target.exists():
        return target
    tmp = onnx_file.with_name("model.int8.onnx.tmp")
    # The quantiser logs a generic pre-processing hint on the root logger; it does not apply here.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        quantize_dynamic(
            str(onnx_file),
            str(tmp),
            weight_type=QuantType.QInt8,
            per_channel=True,
            op_types_to_quantize=["MatMul"],
        )
    finally:
        root.setLevel(level)
    replace_file(tmp, target)
    return target


def export_to_onnx(model_dir: Path, target: Path, fingerprint: str = "") -> Path:
    """Export once into target/ (model.onnx + tokenizer.json); a finished export is reused.
    The export runs in a child process: torch and transformers would otherwise stay in the
    server's memory for good (~400 MB of RSS) after a one-time job. fingerprint (of
    model_dir's files) is recorded beside it, for remove_stale_exports."""
    onnx_file = target / "model.onnx"
    if onnx_file.exists() and (target / "tokenizer.json").exists():
        return onnx_file
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mnemo_server.embed.onnx_export",
            str(model_dir),
            str(target),
            str(os.getpid()),
            fingerprint,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or not onnx_file.exists():
        raise RuntimeError(f"ONNX export of {model_dir} failed: {done.stderr.strip()[-2000:]}")
    return onnx_file


def remove_stale_exports(cache_root: Path, model_dir: Path, fingerprint: str) -> list[Path]:
    """Delete the exports of model_dir's earlier files (another fingerprint): the weights
    they were made from are gone, so no start can use them again, and each kept ~90-113 MB
    after every upgrade of the package that ships the model. Exports of other directories,
    and those that do not record their fingerprint (made before it was recorded), are left.
    Returns what was deleted."""
    here = model_dir.resolve()
    removed = []
    for export in sorted(cache_root.glob("onnx-*")):
        try:
            made = json.loads((export / "source.json").read_text(encoding="utf-8"))
            stale = (
                bool(made["fingerprint"])
                and made["fingerprint"] != fingerprint
                and Path(made["model_dir"]).resolve() == here
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a staging directory, a foreign one, or one from before fingerprints
        if stale:
            shutil.rmtree(export, ignore_errors=True)
            removed.append(export)
    return removed


def _export(model_dir: Path, target: Path, fingerprint: str) -> None:
    """Written to a temporary directory first so a crash never leaves a half file in place."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    base = AutoModel.from_pretrained(str(model_dir)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))

    class LastHidden(torch.nn.Module):
        def __init__(self, model: torch.nn.Module):
            super().__init__()
            self.model = model

        def forward(
            self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
        ) -> torch.Tensor:
            out = self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            )
            hidden: torch.Tensor = out.last_hidden_state
            return hidden

    sample = tokenizer(["an example sentence", "another"], padding=True, return_tensors="pt")
    dynamic = {0: "batch", 1: "tokens"}
    with torch.no_grad():
        torch.onnx.export(
            LastHidden(base),
            (sample["input_ids"], sample["attention_mask"], sample["token_type_ids"]),
            str(tmp / "model.onnx"),
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["last_hidden_state"],
            dynamic_axes={
                "input_ids": dynamic,
                "attention_mask": dynamic,
                "token_type_ids": dynamic,
                "last_hidden_state": dynamic,
            },
            opset_version=17,
            dynamo=False,
        )
    shutil.copy(model_dir / "tokenizer.json", tmp / "tokenizer.json")
    (tmp / "source.json").write_text(json.dumps({"model_dir": str(model_dir), "fingerprint": fingerprint}))
    shutil.rmtree(target, ignore_errors=True)
    rename_tree(tmp, target)


if __name__ == "__main__":
    import warnings

    from mnemo_server.launcher import watch_parent

    # Ends with the server that asked for it: a server killed during its first start left the
    # export running on as an orphan, writing into the staging directory the next start's
    # export uses too (crash probe).
    watch_parent(int(sys.argv[3]), interval_s=0.2)
    warnings.simplefilter("ignore")  # the exporter's tracer warnings are noise here
    _export(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[4] if len(sys.argv) > 4 else "")
