"""The input spec: ``--input-shape`` parsed, checked against what a model file says of its inputs, and the
one error for a model that does not run on the spec it was given."""

from __future__ import annotations

from edgekit.errors import InputSpecError
from edgekit.model import Model, TensorSpec
from edgekit.quiet import first_line


def parse_shapes(specs: list[str] | None) -> list[tuple[str | None, tuple[int, ...]]]:
    """``--input-shape 1,3,224,224`` or ``image:1,3,224,224`` (repeat per input)."""
    out = []
    for spec in specs or []:
        name, _, dims = spec.rpartition(":")
        try:
            shape = tuple(int(d) for d in dims.replace("x", ",").split(",") if d.strip())
        except ValueError:
            raise InputSpecError(f"--input-shape {spec!r}: expected e.g. 1,3,224,224 or image:1,3,224,224") from None
        if not shape or any(d <= 0 for d in shape):
            raise InputSpecError(f"--input-shape {spec!r}: every dimension must be a positive integer")
        out.append((name or None, shape))
    return out


def inputs_from_shapes(shapes, source, names: list[str]) -> list[TensorSpec]:
    """Input specs from --input-shape alone (a model kind that carries no shape), named from ``names``."""
    if not shapes:
        raise InputSpecError(f"{source}: this model kind carries no input shape; give --input-shape (e.g. 1,3,224,224)")
    out = []
    for i, (name, shape) in enumerate(shapes):
        out.append(TensorSpec(name or (names[i] if i < len(names) else f"input_{i}"), shape, "float32"))
    return out


def tf_inputs(source: str, found: list[tuple[str, tuple, str]], shapes) -> list[TensorSpec]:
    """Static input specs from the model's own (batch possibly None) shapes and --input-shape."""
    if shapes and len(shapes) != len(found):
        raise InputSpecError(f"{source}: the model has {len(found)} input(s), --input-shape gave {len(shapes)}")
    out = []
    for i, (name, dims, dtype) in enumerate(found):
        if shapes:
            shape = shapes[i][1]
            if dims and (len(shape) != len(dims) or any(d is not None and d != s for d, s in zip(dims, shape, strict=True))):
                raise InputSpecError(
                    f"{source}: input {name!r} has shape {[d if d is not None else '?' for d in dims]}, "
                    f"--input-shape {list(shape)} does not fit it"
                )
        elif dims and all(d is not None for d in dims[1:]):
            shape = (1 if dims[0] is None else dims[0], *dims[1:])  # dynamic batch: edge deployment runs batch 1
        else:
            raise InputSpecError(
                f"{source}: input {name!r} has dynamic dimensions {[d if d is not None else '?' for d in dims]}; "
                "give --input-shape (NHWC, e.g. 1,224,224,3)"
            )
        out.append(TensorSpec(name, tuple(int(d) for d in shape), dtype))
    return out


def does_not_run(model: Model, exc: BaseException, fix: str) -> InputSpecError:
    """The error for a model that fails on zeros at its fixed input spec (``fix`` says what to check)."""
    shapes = ", ".join(f"{s.name}{list(s.shape)}" for s in model.inputs)
    return InputSpecError(f"{model.source}: the model does not run on inputs {shapes} "
                          f"({type(exc).__name__}: {first_line(exc)}); {fix}")


def parse_batch_axes(specs: list[str] | None) -> dict[str, int | None]:
    """``--batch-axis state=1`` or ``--batch-axis sr=none`` (repeat per input or output): name -> axis (None: the
    tensor has no batch axis)."""
    out: dict[str, int | None] = {}
    for spec in specs or []:
        name, sep, val = spec.partition("=")
        name, val = name.strip(), val.strip().lower()
        if not sep or not name or not val:
            raise InputSpecError(f"--batch-axis {spec!r}: expected NAME=AXIS or NAME=none, e.g. --batch-axis state=1")
        if val == "none":
            out[name] = None
            continue
        try:
            out[name] = int(val)
        except ValueError:
            raise InputSpecError(f"--batch-axis {spec!r}: the axis is an integer (0, 1, ...) or none, "
                                 "e.g. --batch-axis state=1") from None
    return out


def _axis(name: str, axis: int | None, shape: tuple[int, ...], what: str) -> int | None:
    if axis is None:
        return None
    if not -len(shape) <= axis < len(shape):
        raise InputSpecError(f"--batch-axis {name}={axis}: {what} {name!r} has shape {list(shape)}, which has no "
                             f"axis {axis}; give an axis from 0 to {len(shape) - 1}, or none")
    return axis % len(shape)


def apply_batch_axes(model: Model, axes: dict[str, int | None]) -> Model:
    """``model`` with the batch axes ``--batch-axis`` declares set on its inputs and outputs (names checked);
    an output shaped like a declared state input (same shape) takes that input's axis unless declared itself.
    Every input with a batch axis must then hold the same number of samples per run."""
    import dataclasses

    if not axes:
        return model
    ins, outs = {s.name: s for s in model.inputs}, {s.name: s for s in model.outputs}
    for name in axes:
        if name not in ins and name not in outs:
            folded = model.onnx_prep is not None and name in (model.onnx_prep.consts or {})
            raise InputSpecError(
                f"--batch-axis {name}=...: the model has no input or output {name!r}"
                + (" (it was folded as a constant by --const)" if folded else "")
                + f" (its inputs: {', '.join(ins)}; outputs: {', '.join(outs)})")
    inputs = [dataclasses.replace(s, batch_axis=_axis(s.name, axes[s.name], s.shape, "input"))
              if s.name in axes else s for s in model.inputs]
    states = {s.shape: s.batch_axis for s in inputs if s.name in axes and s.batch_axis != 0}
    outputs = []
    for s in model.outputs:
        if s.name in axes:
            s = dataclasses.replace(s, batch_axis=_axis(s.name, axes[s.name], s.shape, "output"))
        elif s.shape in states:  # the state a recurrent model hands back: batched as the state it takes
            s = dataclasses.replace(s, batch_axis=states[s.shape])
        outputs.append(s)
    batched = [(s.name, s.batch_axis, s.batch) for s in inputs if s.batch_axis is not None and s.shape]
    sizes = {b for _, _, b in batched}
    if len(sizes) > 1:
        listed = ", ".join(f"{n} has {b} on axis {a}" for n, a, b in batched)
        raise InputSpecError(f"--batch-axis: the inputs' batch axes hold different numbers of samples ({listed}); "
                             "declare each input's batch axis with --batch-axis NAME=AXIS, or NAME=none for an input "
                             "that has none")
    unbatched = [s.name for s in inputs if s.batch_axis is None]
    if unbatched and sizes and next(iter(sizes)) > 1:
        raise InputSpecError(f"--batch-axis {unbatched[0]}=none: an input without a batch axis takes one sample per "
                             f"run, the other inputs take {next(iter(sizes))}; give --input-shape with batch 1")
    return dataclasses.replace(model, inputs=inputs, outputs=outputs)
