"""litert-torch's PT2E quantizer as android's int8 build uses it: every binary add/mul annotated, the int8 ops
litert-torch leaves float annotated or rewritten (:mod:`.int8_rewrites`), the activation observer chosen, and
the nodes mixed precision keeps float left unannotated."""

from __future__ import annotations

from edgekit.converters.common.pt2e import weight_scale_floor_off
from edgekit.converters.tflite.options import EXTRA
from edgekit.deps import require


def pt2e_quantizer(dynamic: bool, observer: str = "histogram", keep: tuple[str, ...] = (), fused_hard: bool = False):
    """litert-torch's PT2EQuantizer, with every binary ``aten.add``/``aten.mul`` annotated, activations
    observed by ``observer`` (histogram: HistogramObserver's L2-optimal range; minmax: the observed range),
    the fx nodes named in ``keep`` left float (mixed precision), and HardSwish / HardSigmoid written out into
    ops XNNPACK's int8 kernels take unless ``fused_hard`` (``--option hard_activations=fused``)."""
    torch = require("torch")
    pq = require("litert_torch.quantize.pt2e_quantizer", EXTRA)
    from litert_torch.quantize.pt2e_quantizer_utils import (
        get_input_act_qspec,
        get_output_act_qspec,
        propagate_annotation,
    )
    from torchao.quantization.pt2e import MinMaxObserver
    from torchao.quantization.pt2e.quantizer import QuantizationAnnotation, SharedQuantizationSpec

    from edgekit.converters.tflite import int8_rewrites

    class EdgekitPT2EQuantizer(pq.PT2EQuantizer):
        fixed_adds = 0  # binary add/mul nodes annotated here (litert-torch's annotators missed them)
        binary_nodes = 0  # every binary add/mul on two tensors: all of them end up annotated
        int8_ops = rewritten = 0  # ops annotated / rewritten by int8_rewrites

        def transform_for_annotation(self, model):
            model = super().transform_for_annotation(model)
            if not dynamic:
                self.rewritten += int8_rewrites.transform(model, fused_hard)
            return model

        def annotate(self, model):
            binary = (torch.ops.aten.add.Tensor, torch.ops.aten.add_.Tensor, torch.ops.aten.mul.Tensor,
                      torch.ops.aten.mul_.Tensor)
            if dynamic:
                return super().annotate(model)
            for n in model.graph.nodes:  # kept float: marked annotated with no quantization spec
                if n.name in keep:
                    n.meta["quantization_annotation"] = QuantizationAnnotation(_annotated=True)
            model = self._annotate_for_static_quantization_config(model)
            cfg = self.global_config
            # The stock "add"/"mul" annotators find their nodes through source partitions
            # (node.meta["source_fn_stack"]), which a program loaded from a .pt2 does not carry:
            # those nodes are left unannotated, and where an ADD feeds another ADD (MobileNetV2
            # residuals) the result is DEQUANTIZE -> float ADD -> QUANTIZE in the .tflite.
            # Annotate every binary add/mul on tensors here.
            for n in model.graph.nodes:
                if n.op != "call_function" or n.target not in binary or not all(
                        isinstance(a, torch.fx.Node) for a in n.args[:2]):
                    continue
                self.binary_nodes += 1
                if "quantization_annotation" not in n.meta:
                    n.meta["quantization_annotation"] = QuantizationAnnotation(
                        input_qspec_map={a: get_input_act_qspec(cfg) for a in n.args[:2]},
                        output_qspec=get_output_act_qspec(cfg), _annotated=True,
                    )
                    self.fixed_adds += 1
            self.int8_ops += int8_rewrites.annotate(model, cfg)
            if keep:  # a spec shared with a kept node's edge cannot be: those nodes stay float too
                for n in model.graph.nodes:  # again: int8_rewrites quantizes the output of a fused op's other readers
                    if n.name in keep:
                        n.meta["quantization_annotation"] = QuantizationAnnotation(_annotated=True)
                changed = True
                while changed:
                    changed = False
                    float_nodes = {n for n in model.graph.nodes if n.name in keep or _blank(n)}
                    for n in model.graph.nodes:
                        a = n.meta.get("quantization_annotation")
                        if a is None or n in float_nodes:
                            continue
                        specs = [*a.input_qspec_map.values(), a.output_qspec]
                        if any(isinstance(q, SharedQuantizationSpec) and any(
                                x in float_nodes for x in (q.edge_or_node if isinstance(q.edge_or_node, tuple)
                                                           else (q.edge_or_node,))) for q in specs):
                            n.meta["quantization_annotation"] = QuantizationAnnotation(_annotated=True)
                            changed = True
            propagate_annotation(model)
            return model

    cfg = weight_scale_floor_off(pq.get_symmetric_quantization_config(is_per_channel=True, is_dynamic=dynamic))
    if observer == "minmax" and not dynamic:
        import dataclasses

        act = cfg.input_activation
        act = dataclasses.replace(act, observer_or_fake_quant_ctr=MinMaxObserver.with_args(eps=2**-12))
        cfg = dataclasses.replace(cfg, input_activation=act, output_activation=act)
    return EdgekitPT2EQuantizer().set_global(cfg)


def _blank(n) -> bool:
    a = n.meta.get("quantization_annotation")
    return a is not None and not a.input_qspec_map and a.output_qspec is None and a._annotated
