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
