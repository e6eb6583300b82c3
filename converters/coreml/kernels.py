"""The op functions of the host MIL interpreter (:mod:`edgekit.converters.coreml.interpreter`): each takes torch
and the op's inputs by name (tensors, or Python values for the op's constant attributes) and returns its
output(s), in fp32, as MIL defines the op."""

from __future__ import annotations

from edgekit.errors import VerificationError


def _pad_input(torch, x, args, kernel, strides, dilations):
    import torch.nn.functional as F

    pad_type = args.get("pad_type", "valid")
    nd = len(kernel)
    if pad_type == "custom":
        pad = list(args.get("pad") or [0] * 2 * nd)  # [d0_begin, d0_end, d1_begin, d1_end]
    elif pad_type == "valid":
        pad = [0] * 2 * nd
    elif pad_type in ("same", "same_lower"):
        pad = []
        for i in range(nd):
            size = x.shape[2 + i]
            eff = (kernel[i] - 1) * dilations[i] + 1
            out = -(-size // strides[i])
            total = max((out - 1) * strides[i] + eff - size, 0)
            lo = total // 2 if pad_type == "same" else total - total // 2
            pad += [lo, total - lo]
    else:
        raise VerificationError(f"MIL interpreter: pad_type {pad_type!r} not handled")
    torch_pad = []
    for i in reversed(range(nd)):
        torch_pad += [pad[2 * i], pad[2 * i + 1]]
    return F.pad(x, torch_pad) if any(torch_pad) else x


def conv(torch, a):
    import torch.nn.functional as F

    x, w = a["x"], a["weight"]
    nd = w.dim() - 2
    strides = a.get("strides") or [1] * nd
    dil = a.get("dilations") or [1] * nd
    x = _pad_input(torch, x, a, list(w.shape[2:]), strides, dil)
    fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
    return fn(x, w, a.get("bias"), stride=strides, dilation=dil, groups=int(a.get("groups") or 1))


def pool(kind):
    def run(torch, a):
        import torch.nn.functional as F

        x, k = a["x"], list(a["kernel_sizes"])
        strides = a.get("strides") or k
        nd = len(k)
        pad_type = a.get("pad_type", "valid")
        ceil = bool(a.get("ceil_mode", False))
        if pad_type == "custom" and kind == "avg" and not a.get("exclude_padding_from_average", False):
            xp = _pad_input(torch, x, a, k, strides, [1] * nd)
            return getattr(F, f"avg_pool{nd}d")(xp, k, strides, ceil_mode=ceil)
        if pad_type == "valid" or not any(a.get("pad") or []):
            fn = getattr(F, f"{kind}_pool{nd}d")
            return fn(x, k, strides, ceil_mode=ceil)
        pad = list(a.get("pad") or [])
        sym = all(pad[2 * i] == pad[2 * i + 1] for i in range(nd))
        if pad_type != "custom" or not sym:
            raise VerificationError(f"MIL interpreter: {kind}_pool with pad_type {pad_type} / pad {pad} not handled")
        p = [pad[2 * i] for i in range(nd)]
        if kind == "max":
            return getattr(F, f"max_pool{nd}d")(x, k, strides, p, ceil_mode=ceil)
        return getattr(F, f"avg_pool{nd}d")(x, k, strides, p, ceil_mode=ceil, count_include_pad=False)

    return run


def reduce_op(name):
    def run(torch, a):
        x = a["x"]
        axes = a.get("axes")
        keep = bool(a.get("keep_dims", False))
        dims = tuple(range(x.dim())) if axes is None else tuple(axes)
        if name == "mean":
            return x.mean(dim=dims, keepdim=keep)
        if name == "sum":
            return x.sum(dim=dims, keepdim=keep)
        out = x
        for d in sorted((d % x.dim() for d in dims), reverse=True):
            out = (out.amax if name == "max" else out.amin)(dim=d, keepdim=keep)
        return out

    return run


def cast(torch, a):
    dt = a["dtype"]
    x = a["x"]
    if dt == "fp16":
        return x.float().half().float()
    if dt == "fp32":
        return x.float()
    if dt in ("int32", "int64", "int16", "int8", "uint8"):
        return x.to(torch.int64)
    if dt == "bool":
        return x.bool()
    raise VerificationError(f"MIL interpreter: cast to {dt} not handled")


def matmul(torch, a):
    x, y = a["x"], a["y"]
    if a.get("transpose_x"):
        x = x.transpose(-1, -2)
    if a.get("transpose_y"):
        y = y.transpose(-1, -2)
    return torch.matmul(x, y)


def batch_norm(torch, a):
    x = a["x"]
    shape = [1, -1] + [1] * (x.dim() - 2)
    mean, var = a["mean"].reshape(shape), a["variance"].reshape(shape)
    y = (x - mean) / torch.sqrt(var + float(a.get("epsilon", 1e-5)))
    if a.get("gamma") is not None:
        y = y * a["gamma"].reshape(shape)
    if a.get("beta") is not None:
        y = y + a["beta"].reshape(shape)
    return y


def gelu(torch, a):
    mode = a.get("mode", "EXACT")
    return torch.nn.functional.gelu(a["x"], approximate="tanh" if mode == "TANH_APPROXIMATION" else "none")


def _qparams(torch, a, x):
    """quantize / dequantize's scale and zero point, shaped to broadcast along ``axis`` where per channel."""
    scale, zp = a["scale"], a.get("zero_point")
    scale = scale.float() if torch.is_tensor(scale) else torch.tensor(scale, dtype=torch.float32)
    if zp is None:
        zp = torch.zeros(())
    zp = zp.float() if torch.is_tensor(zp) else torch.tensor(zp, dtype=torch.float32)
    if scale.numel() > 1 or zp.numel() > 1:
        shape = [1] * x.dim()
        shape[int(a.get("axis") or 0) % x.dim()] = -1
        scale = scale.reshape(shape) if scale.numel() > 1 else scale.reshape(())
        zp = zp.reshape(shape) if zp.numel() > 1 else zp.reshape(())
    return scale, zp


def quantize(torch, a):
    """iOS 17 ``quantize``: round(x / scale) + zero point, saturated to int8 / uint8 (held as integers here, so
    the interpreter's fp16 storage rounding never touches them)."""
    x = a["input"].float()
    scale, zp = _qparams(torch, a, x)
    lo, hi = (0, 255) if str(a.get("output_dtype")) == "uint8" else (-128, 127)
    return torch.clamp(torch.round(x / scale) + zp, lo, hi).to(torch.int32)


def dequantize(torch, a):
    """iOS 17 ``dequantize``: (q - zero point) x scale."""
    x = a["input"]
    scale, zp = _qparams(torch, a, x)
    return (x.float() - zp) * scale



def gather(torch, a):
    x, axis = a["x"], int(a.get("axis", 0)) % a["x"].dim()
    if int(a.get("batch_dims", 0) or 0):
        raise VerificationError("MIL interpreter: gather with batch_dims is not handled")
    idx = torch.as_tensor(a["indices"]).long()
    flat = idx.reshape(-1) % x.shape[axis]
    y = torch.index_select(x, axis, flat)
    return y.reshape(list(x.shape[:axis]) + list(idx.shape) + list(x.shape[axis + 1:]))


def axes_of(a, x):
    axes = a.get("axes")
    return list(range(x.dim())) if axes is None else [int(d) for d in axes]


def conv_transpose(torch, a):
    import torch.nn.functional as F

    x, w = a["x"], a["weight"]  # weight: [C_in, C_out / groups, *kernel]
    nd = w.dim() - 2
    strides = list(a.get("strides") or [1] * nd)
    dil = list(a.get("dilations") or [1] * nd)
    pad = list(a.get("pad") or [0] * 2 * nd) if a.get("pad_type", "valid") == "custom" else [0] * 2 * nd
    y = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[nd](
        x, w, a.get("bias"), stride=strides, dilation=dil, groups=int(a.get("groups") or 1))
    idx = [slice(None), slice(None)] + [slice(pad[2 * i], y.shape[2 + i] - pad[2 * i + 1]) for i in range(nd)]
    y = y[tuple(idx)]
    shape = a.get("output_shape")
    if shape is not None and list(y.shape[2:]) != list(shape)[-nd:]:
        raise VerificationError(f"MIL interpreter: conv_transpose output {list(y.shape)} != {list(shape)}")
    return y


def mil_pad(torch, a):
    import torch.nn.functional as F

    x, pad = a["x"], [int(p) for p in a["pad"]]  # [d0_begin, d0_end, ...] over the last len(pad) / 2 dims
    k = len(pad) // 2
    tp = []
    for i in reversed(range(k)):
        tp += [pad[2 * i], pad[2 * i + 1]]
    mode = {"constant": "constant", "reflect": "reflect", "replicate": "replicate"}[a.get("mode", "constant")]
    if mode == "constant":
        return F.pad(x, tp, value=float(a.get("constant_val", 0.0)))
    # reflect / replicate: one padded dim at a time (the padding is separable), that dim moved last and the
    # others folded into one, as torch pads a [B, L] tensor: any rank, any padded dims
    lead = x.dim() - k
    for i in range(k):
        lo, hi = pad[2 * i], pad[2 * i + 1]
        if not (lo or hi):
            continue
        d = lead + i
        y = x.movedim(d, -1)
        shape = list(y.shape)
        y = F.pad(y.reshape(-1, shape[-1]), [lo, hi], mode=mode)
        x = y.reshape(shape[:-1] + [y.shape[-1]]).movedim(-1, d)
    return x


def slice_by_index(torch, a):
    x = a["x"]
    n = x.dim()
    begin, end = list(a["begin"]), list(a["end"])
    stride = list(a.get("stride") or [1] * n)
    bm = list(a.get("begin_mask") or [False] * n)
    em = list(a.get("end_mask") or [False] * n)
    sm = list(a.get("squeeze_mask") or [False] * n)
    idx = []
    for d in range(n):
        st = int(stride[d])
        b = None if bm[d] else int(begin[d])
        e = None if em[d] else int(end[d])
        if sm[d]:
            idx.append(int(begin[d]))
            continue
        if st < 0:
            rows = list(range(x.shape[d]))[slice(b, e, st)]
            idx.append(torch.tensor(rows, dtype=torch.long))
            continue
        idx.append(slice(b, e, st))
    out = x
    for d in reversed(range(n)):  # one dim at a time: tensor indices on several dims would broadcast
        full = [slice(None)] * d + [idx[d]]
        out = out[tuple(full)]
    return out


def split(torch, a):
    x, axis = a["x"], int(a["axis"])
    sizes = a.get("split_sizes")
    if sizes is None:
        sizes = [x.shape[axis] // int(a["num_splits"])] * int(a["num_splits"])
    return tuple(torch.split(x, [int(s) for s in sizes], dim=axis))


def layer_norm(torch, a):
    x = a["x"]
    axes = axes_of(a, x)
    mean = x.mean(dim=axes, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=axes, keepdim=True)
    y = (x - mean) / torch.sqrt(var + float(a.get("epsilon", 1e-5)))
    if a.get("gamma") is not None:
        y = y * a["gamma"]
    if a.get("beta") is not None:
        y = y + a["beta"]
    return y


def lstm(torch, a):
    """MIL lstm (iOS15 recurrent.lstm): x [T, B, I]; weights [4H, I] / [4H, H], gates ordered i, f, o, z;
    bias [4H] (input + recurrent); initial_h / initial_c [B, D*H]; outputs (y, h, c)."""
    if a.get("peephole") is not None or a.get("clip") is not None:
        raise VerificationError("MIL interpreter: lstm with peepholes or clip is not handled")
    acts = (a.get("recurrent_activation", "sigmoid"), a.get("cell_activation", "tanh"), a.get("activation", "tanh"))
    if acts != ("sigmoid", "tanh", "tanh"):
        raise VerificationError(f"MIL interpreter: lstm activations {acts} are not handled")
    x = a["x"]
    T, B = x.shape[0], x.shape[1]
    H = a["weight_hh"].shape[1]
    direction = a.get("direction", "forward")
    dirs = [("f", a["weight_ih"], a["weight_hh"], a.get("bias"))]
    if direction == "bidirectional":
        dirs.append(("b", a["weight_ih_back"], a["weight_hh_back"], a.get("bias_back")))
    elif direction == "reverse":
        dirs = [("b", a["weight_ih"], a["weight_hh"], a.get("bias"))]
    h0 = a["initial_h"].reshape(B, -1)
    c0 = a["initial_c"].reshape(B, -1)
    ys, hs, cs = [], [], []
    for k, (way, wi, wh, b) in enumerate(dirs):
        h, c = h0[:, k * H:(k + 1) * H], c0[:, k * H:(k + 1) * H]
        steps = range(T) if way == "f" else range(T - 1, -1, -1)
        seq = [None] * T
        for t in steps:
            g = x[t] @ wi.T + h @ wh.T + (0 if b is None else b)
            i, f, o, z = g.split(H, dim=1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(z)
            h = torch.sigmoid(o) * torch.tanh(c)
            seq[t] = h
        ys.append(torch.stack(seq) if a.get("output_sequence", False) else h.unsqueeze(0))
        hs.append(h)
        cs.append(c)
    return torch.cat(ys, dim=-1), torch.cat(hs, dim=-1), torch.cat(cs, dim=-1)


def squeeze_axes(x, axes):
    for d in sorted((d % x.dim() for d in axes), reverse=True):
        x = x.squeeze(d)
    return x


def expand_axes(x, axes):
    rank = x.dim() + len(axes)
    for d in sorted(d % rank for d in axes):
        x = x.unsqueeze(d)
    return x

