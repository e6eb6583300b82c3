"""Full-integer INT8 op coverage for litert-torch's PT2E quantizer: the ops that TFLite runs with
int8 kernels and that litert-torch 0.10's annotators leave float.

litert-torch annotates conv, linear, add, mul, cat, pools and (only after an annotated op)
sigmoid/softmax; everything else stays float between DEQUANTIZE and QUANTIZE in the .tflite even
where TFLite has an int8 kernel (PAD, RESIZE_*, LEAKY_RELU, HARD_SWISH, PRELU, SUB, RELU, TANH,
SOFTMAX after an unannotated op ...). Two steps close that gap:

``transform(gm)``  (before annotation) rewrites what TFLite has no int8 kernel for into ops that
                   quantize well: a BatchNorm that no conv folds (after a ReLU) becomes a
                   depthwise 1x1 conv whose weights are the BN scale and whose bias is its shift, so
                   the per-channel scale is quantized as a conv weight (per channel), not as an
                   activation tensor; PReLU likewise becomes ``relu(x) - relu(-x) * alpha`` with
                   alpha as depthwise conv weights; ``x ** 2`` becomes ``x * x``, ``a / sqrt(b)``
                   ``a * rsqrt(b)`` and ``a / c`` (a constant) ``a * (1 / c)``: a LayerNorm written out
                   (paddle2onnx, older exporters) then runs on TFLite's int8 MUL / RSQRT / MEAN / SUB;
                   a transposed conv whose kernel equals its stride (an r x r up-sampling, as a DB
                   text detector's head makes) becomes a 1x1 conv to out x r x r channels and a pixel
                   shuffle (int8 RESHAPE / TRANSPOSE in the .tflite):
                   litert-torch lowers conv_transpose to a float TRANSPOSE_CONV even where annotated.
``annotate(gm, cfg)``  (after litert-torch's annotators) gives every remaining op with an int8
                   kernel its quantization spec, by how TFLite's int8 kernel treats scales
                   (tensorflow/lite/tools/optimize/operator_property.cc): ops that move values
                   (PAD, RESIZE_NEAREST, reshape, transpose, max pool) keep their input's scale,
                   SOFTMAX / LOGISTIC / TANH have fixed output scales, the rest get their own
                   calibrated output range.

Every build is still audited op by op after converting (:func:`edgekit.converters.tflite.audit.audit`).
"""

from __future__ import annotations

from typing import Any

from edgekit.deps import require


def _ops():
    torch = require("torch")
    a = torch.ops.aten
    # the output keeps the input's scale and zero point (TFLite requires it, or it is exact there)
    same = {a.constant_pad_nd.default, a.pad.default, a.upsample_nearest2d.vec, a.upsample_nearest2d.default,
            a.max_pool2d.default, a.avg_pool2d.default, a.adaptive_avg_pool2d.default, a.mean.dim, a.mean.default,
            a.view.default, a.reshape.default, a.flatten.using_ints, a.permute.default, a.transpose.int,
            a.squeeze.dim, a.squeeze.dims, a.squeeze.default, a.unsqueeze.default, a.slice.Tensor, a.select.int,
            a.contiguous.default, a.clone.default, a.hardtanh.default, a.relu6.default, a.clamp.default,
            a.amax.default, a.max.dim, a.split.Tensor, a.split_with_sizes.default, a.chunk.default,
            a.expand.default, a.repeat.default, a.pixel_shuffle.default, a.dropout.default, a.flip.default,
            a.index_select.default}  # GATHER_ND: a constant index (a reversed Slice, a state's layers), values copied
    # own calibrated output range
    free = {a.relu.default, a.leaky_relu.default, a.hardswish.default, a.elu.default, a.gelu.default,
            a.upsample_bilinear2d.vec, a.upsample_bilinear2d.default, a.sub.Tensor, a.rsub.Scalar,
            a.sub.Scalar, a.mul.Scalar, a.add.Scalar, a.div.Tensor, a.div.Scalar, a.neg.default,
            a.maximum.default, a.minimum.default, a.add.Tensor, a.mul.Tensor, a.matmul.default, a.bmm.default,
            a.sum.dim_IntList, a.abs.default, a.square.default, a.silu.default, a.hardsigmoid.default,
            a.rsqrt.default}
    # fixed output scale: softmax / sigmoid 1/256 at -128, tanh 1/128 at 0 (TFLite's int8 kernels)
    fixed = {a.softmax.int: (1 / 256, -128), a._softmax.default: (1 / 256, -128), a.sigmoid.default: (1 / 256, -128),
             a.tanh.default: (1 / 128, 0), a.log_softmax.int: (16 / 256, 127)}
    return same, free, fixed


# a RELU inserted by transform() to requantize a fixed-scale output for a concatenation (meta key)
REQUANTIZE = "edgekit_requantize"


def _compare_ops():
    """Comparisons (bool out): TFLite's GREATER / GREATER_EQUAL / LESS / LESS_EQUAL take int8 inputs (each
    rescaled), so only their inputs are annotated; ``where`` is SELECT_V2, whose int8 kernel copies values and
    so needs both branches and its output at one scale (shared)."""
    torch = require("torch")
    a = torch.ops.aten
    return ({a.ge.Tensor, a.ge.Scalar, a.gt.Tensor, a.gt.Scalar, a.le.Tensor, a.le.Scalar, a.lt.Tensor, a.lt.Scalar},
            {a.where.self})


def transform(gm: Any, fused_hard: bool = False) -> int:
    """Rewrite unfoldable BatchNorm and PReLU into depthwise 1x1 convs (constants as weights), squares into
    products, divisions by a square root or a constant into products. HardSwish and HardSigmoid are written out
    as ``x * (clip(x + 3, 0, 6) * 1/6)`` (ADD with a fused RELU6, then MUL: XNNPACK's int8 kernels take those,
    while int8 HARD_SWISH and RELU_0_TO_1 run on TFLite's reference kernels and split the delegated graph at each
    one); ``fused_hard``: the other way, the written-out pattern fused into one hardswish (one rounding instead
    of three: closer to float, slower). Returns the number of nodes rewritten."""
    torch = require("torch")
    a = torch.ops.aten
    n_done = 0
    non_negative = {op for op, (_, zero) in _ops()[2].items() if zero == -128}  # outputs in [0, 1): 1/256 at -128
    _float_constants(gm)
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in (a.batch_norm.default, a._native_batch_norm_legit_no_training.default):
            x, w, b, mean, var = node.args[:5]
            if node.target == a.batch_norm.default and node.args[5]:  # training=True: not a frozen BN
                continue
            eps = node.args[7] if node.target == a.batch_norm.default else node.args[6]
            if _producer_is_conv(x) or any(not _const(gm, t) for t in (w, b, mean, var) if t is not None):
                continue  # a conv before it: litert-torch folds it into the conv's weights
            mean_t, var_t = _value(gm, mean), _value(gm, var)
            w_t = _value(gm, w) if w is not None else torch.ones_like(mean_t)
            b_t = _value(gm, b) if b is not None else torch.zeros_like(mean_t)
            scale = w_t / torch.sqrt(var_t + eps)
            shift = b_t - mean_t * scale
            rank = _rank(x)
            if rank not in (3, 4):
                continue
            with gm.graph.inserting_before(node):
                out = _depthwise(gm, node, x, scale, shift, rank)
            if node.target != a.batch_norm.default:  # the legit op returns a tuple: its users index it
                for u in list(node.users):
                    if u.target is __import__("operator").getitem and u.args[1] == 0:
                        u.replace_all_uses_with(out)
                        gm.graph.erase_node(u)
                if node.users:
                    continue
            else:
                node.replace_all_uses_with(out)
            gm.graph.erase_node(node)
            n_done += 1
        elif node.target == a.prelu.default:
            x, alpha = node.args[:2]
            rank = _rank(x)
            if not _const(gm, alpha) or rank not in (2, 3, 4):
                continue
            alpha_t = _value(gm, alpha).reshape(-1)
            channels = _shape(x)[1] if rank > 1 else 1
            if alpha_t.numel() not in (1, channels):
                continue
            alpha_t = alpha_t.expand(channels).clone()
            with gm.graph.inserting_before(node):
                pos = _call(gm, node, a.relu.default, (x,))
                neg = _call(gm, node, a.relu.default, (_call(gm, node, a.neg.default, (x,)),))
                scaled = _depthwise(gm, node, neg, -alpha_t, None, rank)
                out = _call(gm, node, a.add.Tensor, (pos, scaled))
            node.replace_all_uses_with(out)
            gm.graph.erase_node(node)
            n_done += 1
        elif node.target in (a.pow.Tensor_Scalar, a.pow.Tensor_Tensor):
            x, e = node.args[:2]
            ev = e if not isinstance(e, torch.fx.Node) else _value(gm, e) if _const(gm, e) else None
            if ev is None or (torch.is_tensor(ev) and ev.numel() != 1) or float(ev) != 2.0:
                continue
            with gm.graph.inserting_before(node):  # x ** 2 -> x * x (TFLite has no int8 POW; MUL is int8)
                out = _call(gm, node, a.mul.Tensor, (x, x))
            node.replace_all_uses_with(out)
            gm.graph.erase_node(node)
            n_done += 1
        elif node.target == a.conv_transpose2d.input and _upsampling_deconv(gm, node):
            x, w = node.args[:2]
            b = node.args[2] if len(node.args) > 2 else None
            w_t = _value(gm, w)  # [in, out, r, r]
            ci, co, r, _ = w_t.shape
            # y[n, o, r*h + i, r*w + j] = sum_c x[n, c, h, w] W[c, o, i, j] + b[o]: a 1x1 conv to out*r*r channels
            # (channel o*r*r + i*r + j), then pixel_shuffle(r) puts each where the transposed conv wrote it
            w1 = w_t.permute(1, 2, 3, 0).reshape(co * r * r, ci, 1, 1).contiguous().float()
            b1 = _value(gm, b).float().repeat_interleave(r * r) if b is not None else None
            with gm.graph.inserting_before(node):
                conv = _call(gm, node, a.conv2d.default, (
                    x, _attr(gm, node, "weight", w1), _attr(gm, node, "bias", b1) if b1 is not None else None,
                    [1, 1], [0, 0], [1, 1], 1))
                out = _call(gm, node, a.pixel_shuffle.default, (conv, r))
            node.replace_all_uses_with(out)
            gm.graph.erase_node(node)
            n_done += 1
        elif node.target in (a.cat.default, a.concat.default) and isinstance(node.args[0], (list, tuple)):
            # CONCATENATION takes every input at its output's scale; a SOFTMAX / LOGISTIC output is fixed at 1/256,
            # so it must be requantized first. litert-torch lowers a dequantize -> quantize pair between them to
            # nothing (the concatenation then failed: "violate the same scale constraint"; ddddocr's YOLOX head
            # concatenates boxes with sigmoid scores), so the requantization is a RELU: exact on these
            # non-negative outputs, and TFLite's int8 RELU rescales (annotate takes its input at the fixed scale)
            parts = list(node.args[0])
            for i, x in enumerate(parts):
                if isinstance(x, torch.fx.Node) and x.target in non_negative:
                    with gm.graph.inserting_before(node):
                        parts[i] = _call(gm, x, a.relu.default, (x,))
                    parts[i].meta[REQUANTIZE] = True
                    n_done += 1
            if any(p is not q for p, q in zip(parts, node.args[0], strict=True)):
                node.args = (parts, *node.args[1:])
        elif not fused_hard and node.target in (a.hardswish.default, a.hardsigmoid.default):
            x = node.args[0]
            with gm.graph.inserting_before(node):
                clip = _call(gm, node, a.hardtanh.default, (_call(gm, node, a.add.Tensor, (x, 3.0)), 0.0, 6.0))
                out = _call(gm, node, a.mul.Tensor, (clip, 1 / 6))
                if node.target == a.hardswish.default:
                    out = _call(gm, node, a.mul.Tensor, (x, out))
            node.replace_all_uses_with(out)
            gm.graph.erase_node(node)
            n_done += 1
        elif fused_hard and node.target == a.mul.Tensor and (x := _hardswish_input(gm, node)) is not None:
            # x * clip(x + 3, 0, 6) * (1/6), HardSwish as paddle2onnx writes it: four int8 ops, each rounding its
            # output on a per-tensor grid (their errors add up), where TFLite runs one HARD_SWISH
            with gm.graph.inserting_before(node):
                out = _call(gm, node, a.hardswish.default, (x,))
            node.replace_all_uses_with(out)
            gm.graph.erase_node(node)
            n_done += 1
        elif node.target == a.div.Tensor and isinstance(node.args[1], torch.fx.Node):
            num, den = node.args[:2]
            if getattr(den, "target", None) == a.sqrt.default and all(
                    u.target == a.div.Tensor and u.args[1] is den and u.args[0] is not den for u in den.users):
                with gm.graph.inserting_before(node):  # a / sqrt(b) -> a * rsqrt(b): TFLite RSQRT and MUL are int8
                    out = _call(gm, node, a.mul.Tensor, (num, _call(gm, node, a.rsqrt.default, (den.args[0],))))
            elif _const(gm, den) and bool(torch.all(_value(gm, den) != 0)):
                with gm.graph.inserting_before(node):  # a / c -> a * (1 / c)
                    out = _call(gm, node, a.mul.Tensor, (num, _attr(gm, node, "reciprocal", 1.0 / _value(gm, den))))
            else:
                continue
            node.replace_all_uses_with(out)
            gm.graph.erase_node(node)
            n_done += 1
    if n_done:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return n_done


def annotate(gm: Any, cfg: Any) -> int:
    """Annotate the ops with int8 kernels that litert-torch left float; returns how many."""
    torch = require("torch")
    from litert_torch.quantize.pt2e_quantizer_utils import get_input_act_qspec, get_output_act_qspec
    from torchao.quantization.pt2e.quantizer import (
        FixedQParamsQuantizationSpec,
        QuantizationAnnotation,
        SharedQuantizationSpec,
    )

    same, free, fixed = _ops()
    compare, select = _compare_ops()
    batched = {torch.ops.aten.matmul.default, torch.ops.aten.bmm.default}
    concat = {torch.ops.aten.cat.default, torch.ops.aten.concat.default}
    act_in, act_out = get_input_act_qspec(cfg), get_output_act_qspec(cfg)
    n_done = 0
    for node in gm.graph.nodes:
        ann = node.meta.get("quantization_annotation")
        if node.meta.get(REQUANTIZE):  # (a kept-float one is marked float again after annotate, as every kept node)
            # transform()'s RELU: its input at the producer's fixed scale, its output at the concatenation's
            x = node.args[0]
            node.meta["quantization_annotation"] = QuantizationAnnotation(
                input_qspec_map={x: SharedQuantizationSpec(x) if _quantized_out(x) else act_in},
                output_qspec=act_out, _annotated=True)
            n_done += 1
            continue
        if (ann is not None and ann._annotated and ann.output_qspec is None and len(node.users) > 1
                and node.op == "call_function" and _is_float_tensor(node)):
            # litert-torch's conv_relu / add_relu / mul_relu fuse the ReLU without checking that the
            # op has no other reader: those readers then get a float tensor (DEQUANTIZE -> float
            # RELU in the .tflite). The op's own output is quantized for them.
            ann.output_qspec = act_out
            n_done += 1
            continue
        if node.op == "call_function" and node.target in compare | select and not (ann is not None and ann._annotated):
            ins = [x for x in _tensor_args(node) if _is_float_tensor(x)]
            if ins and (node.target in compare or (_is_float_tensor(node) and len(ins) == 2)):
                x = ins[0]
                first = SharedQuantizationSpec(x) if _quantized_out(x) else act_in
                in_map = {x: first}
                out = None
                if node.target in select:  # both branches and the output at the first branch's scale
                    out = SharedQuantizationSpec((x, node)) if first is act_in else first
                    in_map[ins[1]] = out
                else:
                    in_map.update({y: act_in for y in ins[1:]})
                node.meta["quantization_annotation"] = QuantizationAnnotation(
                    input_qspec_map=in_map, output_qspec=out, _annotated=True)
                n_done += 1
            continue
        if node.op == "call_function" and node.target in concat and not (ann is not None and ann._annotated):
            # CONCATENATION: one scale for every input and the output (TFLite's int8 spec), the first input's
            # group, as litert-torch's own cat annotator does. That annotator finds cats by source partition,
            # so it misses those of a .pt2 program or of a decomposition (an LSTM's per-step outputs). Left
            # float between DEQUANTIZE and nothing, the converter made such a cat int8 at its first input's
            # scale and clipped the others (a bidirectional LSTM's output lost most of its signal).
            ins = [x for x in _tensor_args(node) if _is_float_tensor(x)]
            if ins and _is_float_tensor(node):
                shared = SharedQuantizationSpec((ins[0], node))
                in_map = {x: shared for x in ins}
                in_map[ins[0]] = act_in
                node.meta["quantization_annotation"] = QuantizationAnnotation(
                    input_qspec_map=in_map, output_qspec=shared, _annotated=True)
                n_done += 1
            continue
        if node.op != "call_function" or node.target not in same | free | set(fixed):
            continue
        if ann is not None and ann._annotated:
            continue
        if not _is_float_tensor(node):
            continue
        ins = [x for x in _tensor_args(node) if _is_float_tensor(x)]
        if not ins:
            continue
        if node.target in same:
            x = ins[0]
            if _quantized_out(x):
                spec = SharedQuantizationSpec(x)
                in_map = {x: spec}
            else:
                in_map = {x: act_in}
                spec = SharedQuantizationSpec((x, node))
            node.meta["quantization_annotation"] = QuantizationAnnotation(
                input_qspec_map=in_map, output_qspec=spec, _annotated=True)
        elif node.target in fixed:
            scale, zp = fixed[node.target]
            out = FixedQParamsQuantizationSpec(dtype=torch.int8, scale=scale, zero_point=zp, quant_min=-128,
                                               quant_max=127, qscheme=torch.per_tensor_affine)
            node.meta["quantization_annotation"] = QuantizationAnnotation(
                input_qspec_map={ins[0]: act_in}, output_qspec=out, _annotated=True)
        elif node.target in batched:
            # BATCH_MATMUL's operands keep their producers' scales: litert-torch lowers a 4-D matmul through
            # RESHAPEs, which must not rescale, so a requantization between an attention softmax (fixed 1/256)
            # and its matmul failed the conversion ("'tfl.reshape' op ... violate the same scale constraint")
            in_map = {x: SharedQuantizationSpec(x) if _quantized_out(x) else act_in for x in ins}
            node.meta["quantization_annotation"] = QuantizationAnnotation(
                input_qspec_map=in_map, output_qspec=act_out, _annotated=True)
        else:
            node.meta["quantization_annotation"] = QuantizationAnnotation(
                input_qspec_map={x: act_in for x in ins}, output_qspec=act_out, _annotated=True)
        n_done += 1
    return n_done


# ---------------------------------------------------------------- helpers


def _float_constants(gm: Any) -> None:
    """An integer constant in float arithmetic (``20 * x`` in a .pt2 program: PT2E's transform lifts the 20 into an
    int64 tensor constant; an integer mask): the add / mul annotation put an observer on it (HistogramObserver
    raised "histogram_cpu not implemented for 'Long'"). Such a constant becomes float32, the value the op computes
    with (type promotion), and is then quantized like any other constant operand."""
    torch = require("torch")
    a = torch.ops.aten
    arith = {a.add.Tensor, a.mul.Tensor, a.sub.Tensor, a.div.Tensor, a.rsub.Tensor}
    for node in gm.graph.nodes:
        if node.op != "get_attr" or not node.users:
            continue
        if not all(u.op == "call_function" and u.target in arith and _is_float_tensor(u) for u in node.users):
            continue
        value = _value(gm, node)
        if not isinstance(value, torch.Tensor) or value.is_floating_point() or value.is_complex():
            continue
        owner_path, _, attr = node.target.rpartition(".")
        owner = gm.get_submodule(owner_path) if owner_path else gm
        setattr(owner, attr, value.to(torch.float32))
        if node.meta.get("val") is not None:
            node.meta["val"] = node.meta["val"].to(torch.float32)


def _quantized_out(x: Any) -> bool:
    """Whether ``x``'s producer is annotated with an output spec: a reader can take ``x`` at that scale
    (SharedQuantizationSpec) instead of requantizing it."""
    src = x.meta.get("quantization_annotation")
    return src is not None and src._annotated and src.output_qspec is not None


def _scalar_is(gm: Any, v: Any, want: float, rtol: float = 1e-5) -> bool:
    """``v`` (a constant node or a Python number) is the single value ``want``."""
    if isinstance(v, (int, float)):
        return abs(float(v) - want) <= rtol * abs(want)
    if not _const(gm, v):
        return False
    t = _value(gm, v)
    return t.numel() == 1 and abs(float(t.reshape(-1)[0]) - want) <= rtol * abs(want)


def _hardswish_input(gm: Any, node: Any) -> Any:
    """The ``x`` of ``mul(mul(x, clip(add(x, 3), 0, 6)), 1/6)`` ending at ``node`` (either operand order; clip as
    hardtanh or clamp), each intermediate read only by the next; else None."""
    torch = require("torch")
    a = torch.ops.aten
    for inner, k in ((node.args[0], node.args[1]), (node.args[1], node.args[0])):
        if (not isinstance(inner, torch.fx.Node) or inner.target != a.mul.Tensor or len(inner.users) != 1
                or not _scalar_is(gm, k, 1 / 6)):
            continue
        for x, clip in ((inner.args[0], inner.args[1]), (inner.args[1], inner.args[0])):
            if (not isinstance(clip, torch.fx.Node) or len(clip.users) != 1
                    or clip.target not in (a.hardtanh.default, a.clamp.default) or len(clip.args) < 3
                    or clip.args[1] != 0 or clip.args[2] != 6):
                continue
            add = clip.args[0]
            if (isinstance(add, torch.fx.Node) and add.target == a.add.Tensor and len(add.users) == 1
                    and x in add.args[:2] and _scalar_is(gm, add.args[1] if add.args[0] is x else add.args[0], 3.0)):
                return x
    return None


def _upsampling_deconv(gm: Any, node: Any) -> bool:
    """A conv_transpose2d whose kernel equals its stride (square), with no padding, output padding, dilation or
    groups, and constant weights: each input pixel writes its own r x r block (the 2x up-sampling of a DB
    text detector's head, of U-Nets), which a 1x1 conv and a pixel shuffle compute exactly."""
    args = list(node.args) + [None] * (8 - len(node.args))
    x, w, b, stride, padding, out_pad, groups, dilation = args[:8]
    if not _const(gm, w) or (b is not None and not _const(gm, b)) or _rank(x) != 4:
        return False
    shape = list(_value(gm, w).shape)
    stride = list(stride or [1, 1])
    return (len(shape) == 4 and shape[2] == shape[3] == stride[0] == stride[-1] and shape[2] > 1
            and all(p == 0 for p in (padding or [0])) and all(p == 0 for p in (out_pad or [0]))
            and (groups or 1) == 1 and all(d == 1 for d in (dilation or [1])))


def _depthwise(gm: Any, like: Any, x: Any, scale: Any, shift: Any, rank: int) -> Any:
    """A depthwise 1x1 conv of ``x`` (rank 3 or 4, channels on dim 1; rank 2 viewed as [N, C, 1])."""
    torch = require("torch")
    a = torch.ops.aten
    c = scale.numel()
    w = scale.reshape(c, 1, *([1] * (max(rank, 3) - 2))).contiguous().float()
    w_node = _attr(gm, like, "weight", w)
    b_node = _attr(gm, like, "bias", shift.float()) if shift is not None else None
    conv = a.conv2d.default if rank == 4 else a.conv1d.default
    inp = x
    if rank == 2:
        inp = _call(gm, like, a.unsqueeze.default, (x, -1))
    k = max(rank, 3) - 2
    out = _call(gm, like, conv, (inp, w_node, b_node, [1] * k, [0] * k, [1] * k, c))
    if rank == 2:
        out = _call(gm, like, a.squeeze.dim, (out, -1))
    return out


def _call(gm: Any, like: Any, target: Any, args: tuple) -> Any:
    """A new call node with ``like``'s source metadata and its output's fake value (meta["val"])."""
    torch = require("torch")
    from torch._guards import detect_fake_mode

    node = gm.graph.call_function(target, args)
    node.meta.update({k: v for k, v in like.meta.items() if k in ("stack_trace", "nn_module_stack", "source_fn_stack")})
    vals = [x.meta.get("val") for x in args if isinstance(x, torch.fx.Node)]
    mode = detect_fake_mode([v for v in vals if v is not None])
    if mode is not None and all(v is not None for v in vals):
        with mode:
            node.meta["val"] = target(*[x.meta["val"] if isinstance(x, torch.fx.Node) else x for x in args])
    return node


def _attr(gm: Any, like: Any, kind: str, value: Any) -> Any:
    from torch._guards import detect_fake_mode

    name = f"_edgekit_{like.name}_{kind}"
    gm.register_buffer(name, value)
    node = gm.graph.get_attr(name)
    mode = detect_fake_mode([like.meta["val"]] if like.meta.get("val") is not None else [])
    if mode is not None:
        node.meta["val"] = mode.from_tensor(value)
    return node


def _const(gm: Any, node: Any) -> bool:
    return getattr(node, "op", None) == "get_attr"


def _value(gm: Any, node: Any) -> Any:
    obj = gm
    for part in node.target.split("."):
        obj = getattr(obj, part)
    return obj.detach()


def _shape(node: Any) -> list[int]:
    v = node.meta.get("val")
    return list(v.shape) if v is not None and hasattr(v, "shape") else []


def _rank(node: Any) -> int:
    v = node.meta.get("val")
    return v.dim() if v is not None and hasattr(v, "dim") else -1


def _producer_is_conv(x: Any) -> bool:
    torch = require("torch")
    a = torch.ops.aten
    return getattr(x, "op", None) == "call_function" and x.target in (
        a.conv2d.default, a.conv1d.default, a.convolution.default, a.conv_transpose2d.input) and len(x.users) == 1


def _tensor_args(node: Any) -> list[Any]:
    torch = require("torch")
    out = []
    for arg in node.args:
        if isinstance(arg, torch.fx.Node):
            out.append(arg)
        elif isinstance(arg, (list, tuple)):
            out.extend(x for x in arg if isinstance(x, torch.fx.Node))
    return out


def _is_float_tensor(node: Any) -> bool:
    torch = require("torch")
    v = node.meta.get("val") if hasattr(node, "meta") else None
    if v is None and getattr(node, "op", None) == "get_attr":
        return True  # a constant operand (mul/sub by a tensor constant): quantized with its own range
    return isinstance(v, torch.Tensor) and v.is_floating_point()
