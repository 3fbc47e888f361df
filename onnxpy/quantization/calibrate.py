"""Calibration: run the float model in onnxpy with intermediate tensors exposed and collect their ranges."""

from __future__ import annotations

import abc
import json

import numpy as np
import onnx

from .quant_utils import CalibrationMethod, load_model

_FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
                onnx.TensorProto.DOUBLE)


class CalibrationDataReader(abc.ABC):
    """Feeds calibration inputs: ``get_next()`` returns a dict ``{input name: array}`` or None at the end."""

    @abc.abstractmethod
    def get_next(self) -> dict | None:
        raise NotImplementedError

    def __iter__(self):
        return self

    def __next__(self):
        item = self.get_next()
        if item is None:
            raise StopIteration
        return item

    def set_range(self, start_index: int, end_index: int) -> None:
        raise NotImplementedError


class TensorData:
    """Range (and optionally histogram) of one tensor."""

    _allowed = ("avg", "std", "lowest", "highest", "hist", "hist_edges", "bins")

    def __init__(self, **kwargs):
        for k, v in kwargs.items():
            if k not in self._allowed:
                raise ValueError(f"unexpected TensorData field '{k}'")
            setattr(self, k, v)

    @property
    def range_value(self):
        return (self.lowest, self.highest)

    def to_dict(self):
        return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in self.__dict__.items()}


class TensorsData:
    def __init__(self, calibration_method, data: dict):
        self.calibration_method = calibration_method
        self.data = {}
        for k, v in data.items():
            if isinstance(v, TensorData):
                self.data[k] = v
            else:
                lo, hi = v
                self.data[k] = TensorData(lowest=np.float32(lo), highest=np.float32(hi))

    def __iter__(self):
        return iter(self.data)

    def __contains__(self, key):
        return key in self.data

    def __getitem__(self, key) -> TensorData:
        return self.data[key]

    def __setitem__(self, key, value):
        self.data[key] = value

    def items(self):
        return self.data.items()

    def values(self):
        return self.data.values()

    def keys(self):
        return self.data.keys()


def float_tensor_names(model: onnx.ModelProto) -> list[str]:
    """Names of the float activations of the top graph (graph inputs and node outputs, not initializers)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001
        inferred = model
    g = inferred.graph
    types = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        if vi.type.HasField("tensor_type"):
            types[vi.name] = vi.type.tensor_type.elem_type
    inits = {i.name for i in g.initializer}
    names = []
    for vi in g.input:
        if vi.name not in inits and types.get(vi.name) in _FLOAT_TYPES:
            names.append(vi.name)
    for node in g.node:
        if node.op_type == "Constant":
            continue
        for o in node.output:
            # unknown types are included; non-float arrays are skipped when collected
            if o and (types.get(o, 0) in _FLOAT_TYPES or o not in types):
                names.append(o)
    return list(dict.fromkeys(names))


class CalibraterBase:
    def __init__(self, model, op_types_to_calibrate=None, augmented_model_path="augmented_model.onnx",
                 symmetric=False, use_external_data_format=False, providers=None):
        self.model = load_model(model)
        self.op_types_to_calibrate = set(op_types_to_calibrate) if op_types_to_calibrate else None
        self.augmented_model_path = augmented_model_path
        self.symmetric = symmetric
        self.use_external_data_format = use_external_data_format
        self.providers = providers
        self.tensors_to_calibrate = None
        self.augmented_model = None
        self.session = None
        self.num_batches = 0

    def select_tensors_to_calibrate(self, model):
        names = float_tensor_names(model)
        if self.op_types_to_calibrate is None:
            return names
        wanted = set()
        for node in model.graph.node:
            if node.op_type in self.op_types_to_calibrate:
                wanted.update(node.input)
                wanted.update(node.output)
        return [n for n in names if n in wanted]

    def augment_graph(self):
        model = onnx.ModelProto()
        model.CopyFrom(self.model)
        self.tensors_to_calibrate = self.select_tensors_to_calibrate(model)
        existing = {o.name for o in model.graph.output}
        for name in self.tensors_to_calibrate:
            if name not in existing:
                model.graph.output.append(onnx.ValueInfoProto(name=name))
        self.augmented_model = model

    def create_inference_session(self):
        from .. import InferenceSession

        if self.augmented_model is None:
            self.augment_graph()
        self.session = InferenceSession(self.augmented_model.SerializeToString())

    def get_augment_model(self):
        return self.augmented_model

    def collect_data(self, data_reader: CalibrationDataReader):
        if self.session is None:
            self.create_inference_session()
        out_names = [o.name for o in self.session.get_outputs()]
        wanted = set(self.tensors_to_calibrate)
        count = 0
        while True:
            feeds = data_reader.get_next()
            if feeds is None:
                break
            if not isinstance(feeds, dict):
                raise TypeError(f"CalibrationDataReader.get_next() must return a dict or None, got "
                                f"{type(feeds).__name__}")
            outputs = self.session.run(None, feeds)
            batch = {}
            for name, value in zip(out_names, outputs):
                if name in wanted and isinstance(value, np.ndarray) and value.dtype.kind == "f":
                    batch[name] = value
            for name in wanted:
                if name in feeds and name not in batch:
                    batch[name] = np.asarray(feeds[name])
            self._collect(batch)
            count += 1
        if count == 0:
            raise ValueError("the calibration data reader returned no data (get_next() gave None first)")
        self.num_batches += count

    def _collect(self, batch: dict):
        raise NotImplementedError

    def compute_data(self) -> TensorsData:
        raise NotImplementedError

    def compute_range(self):
        return self.compute_data()


class MinMaxCalibrater(CalibraterBase):
    def __init__(self, model, op_types_to_calibrate=None, augmented_model_path="augmented_model.onnx",
                 symmetric=False, use_external_data_format=False, moving_average=False, averaging_constant=0.01,
                 max_intermediate_outputs=None, providers=None):
        super().__init__(model, op_types_to_calibrate, augmented_model_path, symmetric, use_external_data_format,
                         providers)
        if not 0 <= averaging_constant <= 1:
            raise ValueError("averaging_constant must be in [0, 1]")
        self.moving_average = moving_average
        self.averaging_constant = averaging_constant
        self.ranges: dict[str, list[float]] = {}

    def _collect(self, batch):
        for name, v in batch.items():
            if v.size == 0:
                continue
            lo, hi = float(np.min(v)), float(np.max(v))
            if name not in self.ranges:
                self.ranges[name] = [lo, hi]
            elif self.moving_average:
                c = self.averaging_constant
                r = self.ranges[name]
                r[0] = r[0] + c * (lo - r[0])
                r[1] = r[1] + c * (hi - r[1])
            else:
                r = self.ranges[name]
                r[0], r[1] = min(r[0], lo), max(r[1], hi)

    def compute_data(self) -> TensorsData:
        data = {}
        for name, (lo, hi) in self.ranges.items():
            if self.symmetric:
                m = max(abs(lo), abs(hi))
                lo, hi = -m, m
            data[name] = TensorData(lowest=np.float32(lo), highest=np.float32(hi))
        return TensorsData(CalibrationMethod.MinMax, data)


class HistogramCalibrater(CalibraterBase):
    """Histogram of each tensor's values (or absolute values) over all batches; bins are re-binned as the
    observed range grows."""

    def __init__(self, model, op_types_to_calibrate=None, augmented_model_path="augmented_model.onnx",
                 use_external_data_format=False, method="percentile", symmetric=False, num_bins=128,
                 num_quantized_bins=2048, percentile=99.999, scenario="same", providers=None):
        super().__init__(model, op_types_to_calibrate, augmented_model_path, symmetric, use_external_data_format,
                         providers)
        self.method = method
        self.num_bins = int(num_bins)
        self.num_quantized_bins = int(num_quantized_bins)
        self.percentile = float(percentile)
        if not 0 < self.percentile <= 100:
            raise ValueError("percentile must be in (0, 100]")
        self.hists: dict[str, tuple[np.ndarray, np.ndarray, float, float]] = {}
        self.absolute = method == "entropy" or symmetric
        self.raw_range: dict[str, tuple[float, float]] = {}

    def _collect(self, batch):
        for name, v in batch.items():
            v = np.asarray(v, np.float64).ravel()
            v = v[np.isfinite(v)]
            if v.size == 0:
                continue
            raw = self.raw_range.get(name)
            rlo, rhi = float(v.min()), float(v.max())
            self.raw_range[name] = (rlo, rhi) if raw is None else (min(raw[0], rlo), max(raw[1], rhi))
            if self.absolute:
                v = np.abs(v)
            lo, hi = float(v.min()), float(v.max())
            if name in self.hists:
                hist, edges, old_lo, old_hi = self.hists[name]
                lo, hi = min(lo, old_lo), max(hi, old_hi)
            if self.absolute:
                lo = 0.0
            if hi <= lo:
                hi = lo + 1e-12
            new_edges = np.linspace(lo, hi, self.num_bins + 1)
            new_hist = np.histogram(v, bins=new_edges)[0].astype(np.float64)
            if name in self.hists:
                centers = (edges[:-1] + edges[1:]) / 2
                new_hist += np.histogram(np.clip(centers, lo, hi), bins=new_edges, weights=hist)[0]
            self.hists[name] = (new_hist, new_edges, lo, hi)

    def _clip_to_observed(self, name, thr):
        """(-thr, thr), narrowed to the observed values (a non-negative tensor keeps a [0, thr] range)."""
        if self.symmetric:
            return (-thr, thr)
        rlo, rhi = self.raw_range[name]
        return (max(-thr, rlo), min(thr, rhi))

    def compute_data(self) -> TensorsData:
        data = {}
        for name, (hist, edges, lo, hi) in self.hists.items():
            if self.method == "entropy":
                thr = _entropy_threshold(hist, edges, self.num_quantized_bins)
                rng = self._clip_to_observed(name, thr)
            elif self.method == "percentile":
                cdf = np.cumsum(hist) / max(hist.sum(), 1.0)
                if self.absolute:
                    i = int(np.searchsorted(cdf, self.percentile / 100.0))
                    thr = float(edges[min(i + 1, len(edges) - 1)])
                    rng = self._clip_to_observed(name, thr)
                else:
                    tail = (100.0 - self.percentile) / 200.0
                    i_lo = int(np.searchsorted(cdf, tail))
                    i_hi = int(np.searchsorted(cdf, 1.0 - tail))
                    rng = (float(edges[i_lo]), float(edges[min(i_hi + 1, len(edges) - 1)]))
            else:  # distribution: mean / std of the histogram
                centers = (edges[:-1] + edges[1:]) / 2
                w = hist / max(hist.sum(), 1.0)
                avg = float((w * centers).sum())
                std = float(np.sqrt((w * (centers - avg) ** 2).sum()))
                data[name] = TensorData(avg=np.float32(avg), std=np.float32(std), lowest=np.float32(lo),
                                        highest=np.float32(hi), hist=hist, hist_edges=edges)
                continue
            data[name] = TensorData(lowest=np.float32(rng[0]), highest=np.float32(rng[1]), hist=hist,
                                    hist_edges=edges)
        method = {"entropy": CalibrationMethod.Entropy, "percentile": CalibrationMethod.Percentile}.get(
            self.method, CalibrationMethod.Distribution)
        return TensorsData(method, data)


def _entropy_threshold(hist: np.ndarray, edges: np.ndarray, num_quantized_bins: int) -> float:
    """The |x| threshold minimising KL(P || Q) where Q is P re-quantized to ``num_quantized_bins`` levels."""
    n = len(hist)
    nq = max(2, min(int(num_quantized_bins), n))
    if hist.sum() == 0:
        return float(edges[-1])
    best_kl, best_i = np.inf, n
    step = max(1, (n - nq) // 256)  # at most ~256 candidate thresholds
    for i in list(range(nq, n, step)) + [n]:
        p = hist[:i].copy()
        p[-1] += hist[i:].sum()
        # merge the first i bins into nq groups, spread each group's mass over its non-empty bins
        group = (np.arange(i) * nq) // i
        nonzero = (hist[:i] > 0).astype(np.float64)
        gsum = np.bincount(group, weights=hist[:i], minlength=nq)
        gcnt = np.bincount(group, weights=nonzero, minlength=nq)
        q = np.where(nonzero > 0, gsum[group] / np.maximum(gcnt[group], 1), 0.0)
        ps, qs = p.sum(), q.sum()
        if qs == 0:
            continue
        p, q = p / ps, q / qs
        mask = p > 0
        qm = np.where(q[mask] > 0, q[mask], 1e-12)
        kl = float(np.sum(p[mask] * np.log(p[mask] / qm)))
        if kl < best_kl:
            best_kl, best_i = kl, i
    return float(edges[best_i])


class EntropyCalibrater(HistogramCalibrater):
    def __init__(self, model, op_types_to_calibrate=None, augmented_model_path="augmented_model.onnx",
                 use_external_data_format=False, method="entropy", symmetric=False, num_bins=2048,
                 num_quantized_bins=128, providers=None):
        super().__init__(model, op_types_to_calibrate, augmented_model_path, use_external_data_format, method,
                         symmetric, num_bins, num_quantized_bins, providers=providers)


class PercentileCalibrater(HistogramCalibrater):
    def __init__(self, model, op_types_to_calibrate=None, augmented_model_path="augmented_model.onnx",
                 use_external_data_format=False, method="percentile", symmetric=False, num_bins=2048,
                 percentile=99.999, providers=None):
        super().__init__(model, op_types_to_calibrate, augmented_model_path, use_external_data_format, method,
                         symmetric, num_bins, percentile=percentile, providers=providers)


class DistributionCalibrater(HistogramCalibrater):
    def __init__(self, model, op_types_to_calibrate=None, augmented_model_path="augmented_model.onnx",
                 use_external_data_format=False, method="distribution", num_bins=128, scenario="same",
                 providers=None):
        super().__init__(model, op_types_to_calibrate, augmented_model_path, use_external_data_format, method,
                         False, num_bins, scenario=scenario, providers=providers)


def create_calibrator(model, op_types_to_calibrate=None, augmented_model_path="augmented_model.onnx",
                      calibrate_method=CalibrationMethod.MinMax, use_external_data_format=False, providers=None,
                      extra_options=None):
    extra = dict(extra_options or {})
    symmetric = bool(extra.get("symmetric", False))
    if calibrate_method == CalibrationMethod.MinMax:
        cal = MinMaxCalibrater(model, op_types_to_calibrate, augmented_model_path, symmetric=symmetric,
                               use_external_data_format=use_external_data_format,
                               moving_average=bool(extra.get("moving_average", False)),
                               averaging_constant=float(extra.get("averaging_constant", 0.01)))
    elif calibrate_method == CalibrationMethod.Entropy:
        cal = EntropyCalibrater(model, op_types_to_calibrate, augmented_model_path, use_external_data_format,
                                symmetric=symmetric, num_bins=int(extra.get("num_bins", 2048)),
                                num_quantized_bins=int(extra.get("num_quantized_bins", 128)))
    elif calibrate_method == CalibrationMethod.Percentile:
        cal = PercentileCalibrater(model, op_types_to_calibrate, augmented_model_path, use_external_data_format,
                                   symmetric=symmetric, num_bins=int(extra.get("num_bins", 2048)),
                                   percentile=float(extra.get("percentile", 99.999)))
    elif calibrate_method == CalibrationMethod.Distribution:
        cal = DistributionCalibrater(model, op_types_to_calibrate, augmented_model_path, use_external_data_format,
                                     num_bins=int(extra.get("num_bins", 128)))
    else:
        raise ValueError(f"unsupported calibration method {calibrate_method!r}")
    cal.augment_graph()
    cal.create_inference_session()
    return cal


def write_calibration_table(calibration_cache, dir="."):  # noqa: A002
    import os

    data = {}
    items = calibration_cache.items() if hasattr(calibration_cache, "items") else []
    for k, v in items:
        lo, hi = v.range_value if isinstance(v, TensorData) else v
        data[k] = [float(lo), float(hi)]
    with open(os.path.join(dir, "calibration.json"), "w") as f:
        json.dump(data, f)


def save_tensors_data(tensors: TensorsData, path) -> None:
    with open(path, "w") as f:
        json.dump({"method": tensors.calibration_method.name,
                   "data": {k: v.to_dict() for k, v in tensors.items()}}, f)


def load_tensors_data(path) -> TensorsData:
    with open(path) as f:
        raw = json.load(f)
    data = {}
    for k, v in raw["data"].items():
        data[k] = TensorData(**{kk: (np.asarray(vv) if isinstance(vv, list) else np.float32(vv)
                                     if isinstance(vv, float) else vv) for kk, vv in v.items()})
    return TensorsData(CalibrationMethod[raw["method"]], data)
