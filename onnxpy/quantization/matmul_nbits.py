"""Weight-only block quantization of MatMul weights to com.microsoft.MatMulNBits (2/4/8 bits)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from .graph import GraphState, topo_sort
from .quant_utils import MS_DOMAIN, ONNXModel, QuantFormat, add_domain, load_model, onnx_opset


class WeightOnlyQuantConfig:
    def __init__(self, algorithm, quant_format=QuantFormat.QOperator, op_types_to_quantize=None, quant_axes=None):
        self.algorithm = algorithm
        self.quant_format = quant_format
        self.op_types_to_quantize = set(op_types_to_quantize) if op_types_to_quantize else {"MatMul"}
        self.quant_axes = dict(quant_axes) if quant_axes else {"MatMul": 0}


class DefaultWeightOnlyQuantConfig(WeightOnlyQuantConfig):
    def __init__(self, block_size=128, is_symmetric=False, accuracy_level=None, quant_format=QuantFormat.QOperator,
                 op_types_to_quantize=None, quant_axes=None, bits=4, channel_wised_quantize=False):
        super().__init__("DEFAULT", quant_format, op_types_to_quantize, quant_axes)
        self.block_size = block_size
        self.is_symmetric = is_symmetric
        self.bits = bits
        self.accuracy_level = accuracy_level
        self.channel_wised_quantize = channel_wised_quantize


class RTNWeightOnlyQuantConfig(DefaultWeightOnlyQuantConfig):
    def __init__(self, ratios=None, quant_format=QuantFormat.QOperator, op_types_to_quantize=None, block_size=128,
                 is_symmetric=False, bits=4, accuracy_level=None):
        super().__init__(block_size, is_symmetric, accuracy_level, quant_format, op_types_to_quantize, bits=bits)
        self.algorithm = "RTN"
        self.ratios = ratios or {}


def pack_bits(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack unsigned codes along the last axis, little-endian within each byte (element 0 in the low bits)."""
    codes = codes.astype(np.uint8)
    if bits == 8:
        return codes
    per = 8 // bits
    n = codes.shape[-1]
    pad = (-n) % per
    if pad:
        codes = np.concatenate([codes, np.zeros(codes.shape[:-1] + (pad,), np.uint8)], axis=-1)
    grouped = codes.reshape(codes.shape[:-1] + (-1, per)).astype(np.uint16)
    shifts = (np.arange(per, dtype=np.uint16) * bits)
    return (grouped << shifts).sum(axis=-1).astype(np.uint8)


def quantize_blockwise(w: np.ndarray, bits: int, block_size: int, symmetric: bool):
    """w [K, N] -> codes [N, n_blocks, block_size] (uint), scales [N, n_blocks], zero points [N, n_blocks]."""
    K, N = w.shape
    nb = -(-K // block_size)
    wt = np.zeros((N, nb * block_size), np.float32)
    wt[:, :K] = w.T
    blocks = wt.reshape(N, nb, block_size)
    qmax = (1 << bits) - 1
    if symmetric:
        mid = 1 << (bits - 1)
        amax = np.abs(blocks).max(axis=-1)
        scale = amax / np.float32(mid - 1 if bits > 1 else 1)
        zp = np.full(scale.shape, mid, np.int64)
    else:
        lo = np.minimum(blocks.min(axis=-1), 0)
        hi = np.maximum(blocks.max(axis=-1), 0)
        scale = (hi - lo) / np.float32(qmax)
        safe = np.where(scale == 0, 1, scale)
        zp = np.clip(np.rint(-lo / safe), 0, qmax).astype(np.int64)
    scale = scale.astype(np.float32)
    safe = np.where(scale == 0, np.float32(1), scale)
    codes = np.clip(np.rint(blocks / safe[..., None]) + zp[..., None], 0, qmax).astype(np.uint8)
    return codes, scale, zp


class MatMulNBitsQuantizer:
    """``MatMulNBitsQuantizer(model, bits=4, block_size=128, is_symmetric=False, ...)``; ``.process()`` rewrites
    every MatMul whose B is a constant 2-D float initializer into ``com.microsoft.MatMulNBits`` (QOperator) or
    ``DequantizeLinear(blocked) -> MatMul`` (QDQ, opset >= 21); ``.model`` is the result (``.model.model`` the
    ModelProto, ``.model.save_model_to_file(path)``)."""

    def __init__(self, model, bits=4, block_size=128, is_symmetric=False, accuracy_level=None,
                 nodes_to_exclude=None, nodes_to_include=None, quant_format=QuantFormat.QOperator,
                 op_types_to_quantize=None, quant_axes=None, channel_wised_quantize=False, algo_config=None):
        if algo_config is not None:
            bits = getattr(algo_config, "bits", bits)
            block_size = getattr(algo_config, "block_size", block_size)
            is_symmetric = getattr(algo_config, "is_symmetric", is_symmetric)
            accuracy_level = getattr(algo_config, "accuracy_level", accuracy_level)
            quant_format = getattr(algo_config, "quant_format", quant_format)
            if getattr(algo_config, "algorithm", "DEFAULT") not in ("DEFAULT", "RTN"):
                raise ValueError(f"algorithm {algo_config.algorithm} is not supported (DEFAULT / RTN only)")
        if bits not in (2, 4, 8):
            raise ValueError(f"bits must be 2, 4 or 8, got {bits}")
        if block_size < 16 or block_size & (block_size - 1):
            raise ValueError(f"block_size must be a power of 2 and >= 16, got {block_size}")
        if isinstance(quant_format, str):
            quant_format = QuantFormat.from_string(quant_format)
        ops = set(op_types_to_quantize) if op_types_to_quantize else {"MatMul"}
        unsupported = ops - {"MatMul"}
        if unsupported:
            raise ValueError(f"MatMulNBitsQuantizer quantizes MatMul only, got {sorted(unsupported)}")
        self.model = ONNXModel(load_model(model))
        self.bits, self.block_size, self.is_symmetric = int(bits), int(block_size), bool(is_symmetric)
        self.accuracy_level = accuracy_level
        self.nodes_to_exclude = set(nodes_to_exclude or [])
        self.nodes_to_include = set(nodes_to_include) if nodes_to_include else None
        self.quant_format = quant_format
        self.channel_wised_quantize = channel_wised_quantize
        self.algo_config = algo_config

    def _selected(self, node):
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
            return False
        if node.name in self.nodes_to_exclude:
            return False
        return self.nodes_to_include is None or node.name in self.nodes_to_include

    def process(self):
        model = self.model.model
        if self.quant_format == QuantFormat.QDQ and onnx_opset(model) < 21:
            raise ValueError(f"QDQ weight-only quantization needs ai.onnx opset >= 21 (blocked DequantizeLinear); "
                             f"the model has opset {onnx_opset(model)}")
        st = GraphState(model)
        out = []
        changed = False
        for node in model.graph.node:
            w = st.const(node.input[1]) if self._selected(node) and len(node.input) == 2 else None
            if w is None or w.ndim != 2 or w.dtype not in (np.float32, np.float16):
                out.append(node)
                continue
            K, N = w.shape
            bs = K if self.channel_wised_quantize else self.block_size
            if self.channel_wised_quantize:
                bs = max(16, 1 << int(np.ceil(np.log2(K))))
            codes, scale, zp = quantize_blockwise(w.astype(np.float32), self.bits, bs, self.is_symmetric)
            nb = codes.shape[1]
            base = node.name or node.output[0]
            if self.quant_format == QuantFormat.QOperator:
                packed = pack_bits(codes.reshape(N, nb * bs), self.bits).reshape(N, nb, bs * self.bits // 8)
                ins = [node.input[0], st.add_init(packed, node.input[1] + f"_Q{self.bits}"),
                       st.add_init(scale.astype(w.dtype).reshape(-1), node.input[1] + "_scales")]
                if not self.is_symmetric:
                    ins.append(st.add_init(pack_bits(zp.astype(np.uint8), self.bits).reshape(-1),
                                           node.input[1] + "_zero_points"))
                attrs = dict(K=K, N=N, bits=self.bits, block_size=bs)
                if self.accuracy_level is not None:
                    attrs["accuracy_level"] = int(self.accuracy_level)
                out.append(helper.make_node("MatMulNBits", ins, list(node.output), name=st.unique(base + "_Q4"),
                                            domain=MS_DOMAIN, **attrs))
            else:
                import ml_dtypes

                # DequantizeLinear with block_size (opset 21) along K on the [K, N] weight
                if self.bits not in (4, 8):
                    raise ValueError("QDQ weight-only quantization supports 4 or 8 bits")
                off = 1 << (self.bits - 1)
                signed = (codes.astype(np.int16) - off)
                dt = ml_dtypes.int4 if self.bits == 4 else np.int8
                q = signed.reshape(N, nb * bs)[:, :K].T.astype(dt)
                if nb * bs != K:
                    raise ValueError("QDQ weight-only quantization needs K to be a multiple of block_size")
                zpt = (zp - off).T.astype(dt)
                ins = [st.add_init(q, node.input[1] + "_DQ_Q"), st.add_init(scale.T.astype(w.dtype),
                                                                            node.input[1] + "_DQ_scales")]
                if not self.is_symmetric:
                    ins.append(st.add_init(zpt, node.input[1] + "_DQ_zero_points"))
                dq = st.unique(node.input[1] + "_DQ")
                out.append(helper.make_node("DequantizeLinear", ins, [dq], name=st.unique(base + "_DQ"), axis=0,
                                            block_size=bs))
                out.append(helper.make_node("MatMul", [node.input[0], dq], list(node.output), name=node.name))
            changed = True
        g = model.graph
        del g.node[:]
        g.node.extend(topo_sort(g, out))
        if changed:
            if self.quant_format == QuantFormat.QOperator:
                add_domain(model, MS_DOMAIN)
            used = {i for n in g.node for i in n.input} | {o.name for o in g.output} | {i.name for i in g.input}
            keep = [t for t in g.initializer if t.name in used]
            del g.initializer[:]
            g.initializer.extend(keep)
        return self.model


def quantize_matmul_nbits(model, bits=4, block_size=128, is_symmetric=False, **kwargs) -> onnx.ModelProto:
    q = MatMulNBitsQuantizer(model, bits=bits, block_size=block_size, is_symmetric=is_symmetric, **kwargs)
    return q.process().model
