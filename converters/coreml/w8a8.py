"""Core ML W8A8 without Core ML predict (Linux): the torch program quantized with the PT2E flow, a quantizer of
Core ML's placement (int8 inputs and per-channel int8 weights of conv / linear / matmul; every other op fp16, as
the Neural Engine runs it), which coremltools converts into iOS 17 ``quantize`` / ``dequantize`` ops and int8
weight constants."""

from __future__ import annotations

from typing import Any

from edgekit.converters import ConvertJob

from edgekit.deps import require
from edgekit.errors import HostCannotError, UnsupportedOpError

W8A8_CONSUMERS = frozenset({"conv", "linear", "matmul"})  # the ops whose weights w8a8_quantizer stores int8


def pt2e_w8a8(job: ConvertJob) -> dict[str, Any]:
    """W8A8 without Core ML predict: the torch program quantized with the PT2E flow (``w8a8_quantizer``:
    int8 inputs and per-channel int8 weights of conv / linear / matmul, per-tensor activations calibrated on
    --calib, the observer chosen by measuring each fake-quant program against float), converted by
    coremltools into iOS 17 ``quantize`` / ``dequantize`` ops before those layers and int8 weight constants:
    the int8-int8 compute the Neural Engine runs; every other op stays fp16, as Core ML runs it."""
    from edgekit.converters.common.pt2e import (
        calibrated,
        choose_observer,
        exported_module,
        torch_module,
        torch_sample,
    )

    m = job.model
    if not m.is_torch or m.kind == "torchscript":
        raise HostCannotError(
            f"{m.source}: precision int8 (W8A8) on Linux quantizes a torch.export program (PT2E); this model "
            "is TorchScript: run this conversion on a Mac (Core ML predict), or choose int8-weight")
    assert job.calib is not None  # the pipeline refuses int8 without --calib
    sample = torch_sample(m)
    module = exported_module(job, torch_module(job), sample)
    comparisons_as_coreml_reads_them(module)
    # the PT2E steps are android's (observer chosen by measuring, calibration), with Core ML's quantizer
    keep = tuple(job.options.get("keep_float_nodes") or ())

    def quantizer_for(observer: str) -> Any:
        return w8a8_quantizer(observer, keep)

    chosen, measured = choose_observer(job, module, sample, quantizer_for)
    with job.substep("calibration"):
        converted, q, n_batches = calibrated(job, module, sample, chosen, quantizer_for, fold=True)
    layers = q.layers
    if not layers and not keep:  # every layer kept by mixed precision: built, and judged as not INT8
        raise UnsupportedOpError(f"{m.source}: precision int8 (W8A8) quantizes conv / linear / matmul inputs and "
                                 "weights, and this model has none: choose fp16")
    job.log(f"W8A8 (PT2E in torch): {layers} conv/linear/matmul layer(s) int8, observer {chosen}, "
            f"{n_batches} batches")
    return {"module": converted, "sample": sample, "observer": chosen, "measured_snr_db": measured,
            "batches": n_batches, "layers": layers, "kept": list(keep)}


def w8a8_quantizer(observer: str, keep: tuple[str, ...] = ()) -> Any:
    """A PT2E quantizer for Core ML W8A8: the inputs of conv / linear / matmul int8 per tensor (observer
    ``histogram`` or ``minmax``) and their weights int8 symmetric per channel; no other op is annotated, so it
    stays fp16 in the ML program (the Neural Engine computes elementwise ops, pools and concats in fp16; as
    TensorRT's Q/DQ placement does). The specs are litert-torch's symmetric config (the android extra). The fx
    nodes named in ``keep`` are left unannotated: fp16 (mixed precision)."""
    import dataclasses

    torch = require("torch")
    pq = require("litert_torch.quantize.pt2e_quantizer", "android")
    from edgekit.converters.common.pt2e import weight_scale_floor_off
    from torchao.quantization.pt2e import MinMaxObserver
    from torchao.quantization.pt2e.quantizer import QuantizationAnnotation, Quantizer

    cfg = weight_scale_floor_off(pq.get_symmetric_quantization_config(is_per_channel=True, is_dynamic=False))
    act, weight = cfg.input_activation, cfg.weight
    if observer == "minmax":
        act = dataclasses.replace(act, observer_or_fake_quant_ctr=MinMaxObserver.with_args(eps=2**-12))
    a = torch.ops.aten
    # conv_transpose stays fp16: its per-channel int8 weights come out wrong through coremltools
    weighted = {a.conv1d.default, a.conv2d.default, a.linear.default}
    batched = {a.matmul.default, a.bmm.default}

    class CoreMLW8A8Quantizer(Quantizer):
        layers = 0

        def annotate(self, model):
            for n in model.graph.nodes:
                if n.op != "call_function" or n.target not in weighted | batched or n.name in keep:
                    continue
                ins = [x for x in n.args[:2] if isinstance(x, torch.fx.Node)]
                if len(ins) < 2:
                    continue
                in_map = {ins[0]: act, ins[1]: weight if n.target in weighted else act}
                n.meta["quantization_annotation"] = QuantizationAnnotation(input_qspec_map=in_map, _annotated=True)
                self.layers += 1
            return model

        def validate(self, model):
            return None

    return CoreMLW8A8Quantizer()


def comparisons_as_coreml_reads_them(gm: Any) -> int:
    """aten.greater_equal / greater / less_equal / less (what onnx2torch writes for ONNX comparisons) as their
    aliases ge / gt / le / lt, which coremltools' torch.export frontend converts (it has no converter under the
    long names; the float route reaches them through TorchScript, which the W8A8 route cannot take)."""
    torch = require("torch")
    a = torch.ops.aten
    alias = {a.greater_equal.Tensor: a.ge.Tensor, a.greater_equal.Scalar: a.ge.Scalar,
             a.greater.Tensor: a.gt.Tensor, a.greater.Scalar: a.gt.Scalar,
             a.less_equal.Tensor: a.le.Tensor, a.less_equal.Scalar: a.le.Scalar,
             a.less.Tensor: a.lt.Tensor, a.less.Scalar: a.lt.Scalar}
    n = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in alias:
            node.target = alias[node.target]
            n += 1
    if n:
        gm.recompile()
    return n


def inputs_float(program: Any, kept: tuple[str, ...]) -> Any:
    """A copy of the W8A8 fake-quant ``program`` where the nodes named in ``kept`` read their inputs and weight
    in float: each ``dequantize(quantize(x))`` argument of theirs replaced by ``x`` (another reader of ``x`` keeps
    its own rounding). The same program as a calibration with those nodes left unannotated."""
    import copy

    torch = require("torch")
    if not kept:
        return program
    gm = copy.deepcopy(program)
    names = set(kept)

    def source(a):
        if isinstance(a, torch.fx.Node) and "dequantize" in str(a.target) and a.args:
            q = a.args[0]
            if isinstance(q, torch.fx.Node) and "quantize" in str(q.target) and q.args:
                return q.args[0]
        return a

    for n in gm.graph.nodes:
        if n.op == "call_function" and n.name in names:
            n.args = tuple(source(a) for a in n.args)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm
