"""What a converter offers mixed precision, each capability a typed protocol.

The registry (:mod:`edgekit.converters`) declares which capabilities each converter has, as data
(``ConverterInfo.mixed``); the pipeline's ``mixed`` stage (:mod:`edgekit.mixed.fallback`) asks that declaration
and takes the converter as the protocol of a declared capability (:func:`offered`): nothing is found by probing
the converter object. A converter that declares a capability implements every method of its protocol
(tests/test_converter_contract.py checks that).

    layers         LayerSearch    the INT8 build searched for the layers that fail it, rebuilt with the fewest kept
    unsearchable   Unsearchable   some of its INT8 builds have no per-layer control: which, and why
    activations16  Activations16  the build again with 16-bit activations everywhere, and its own layer search

Beside mixed precision, ``ConverterInfo.speed`` declares :class:`HostSpeed`: the converter times a build against
the same model's float build on the target's host runtime (:mod:`edgekit.speed`; the pipeline's ``speed`` stage).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol, cast, overload

if TYPE_CHECKING:  # pragma: no cover
    from edgekit.converters.job import Artifact, ConvertJob
    from edgekit.mixed.search import Search
    from edgekit.speed import Speed

LAYERS, UNSEARCHABLE, ACTIVATIONS16 = "layers", "unsearchable", "activations16"
Capability = Literal["layers", "unsearchable", "activations16"]


class LayerSearch(Protocol):
    """The layer search: its candidates and their rebuilds (:class:`edgekit.mixed.search.Search`), and the build
    again with the ``kept`` layers at higher precision (``calibration``: the method the search measured best)."""

    def mixed_search(self, job: ConvertJob, artifact: Artifact) -> Search: ...

    def keep_layers(self, job: ConvertJob, artifact: Artifact, kept: list[str],
                    calibration: str | None = None) -> Artifact: ...


class Unsearchable(Protocol):
    """Why this job's build path keeps no chosen layer at higher precision (None: the layer search runs)."""

    def mixed_unavailable(self, job: ConvertJob) -> str | None: ...


class Activations16(Protocol):
    """The build again with every activation 16-bit (None: the user chose the activations), and the layer search
    of that build (its candidates, and its rebuild with ``kept`` ops float)."""

    def activations16(self, job: ConvertJob, artifact: Artifact) -> Artifact | None: ...

    def a16_search(self, job: ConvertJob, artifact: Artifact) -> Search: ...

    def a16_keep(self, job: ConvertJob, artifact: Artifact, kept: list[str],
                 calibration: str | None = None) -> Artifact: ...


class HostSpeed(Protocol):
    """The build timed against the same model's float build on the target's host runtime, or estimated for the
    board's kernels where the host runtime does not stand for them (``Speed.estimated``: jetson's TensorRT); None
    where neither can be had here; ``judged`` False where the figures do not stand for the board's kernels."""

    def host_speed(self, job: ConvertJob, artifact: Artifact) -> Speed | None: ...


PROTOCOLS: dict[str, type] = {LAYERS: LayerSearch, UNSEARCHABLE: Unsearchable, ACTIVATIONS16: Activations16}


def methods(capability: str) -> tuple[str, ...]:
    """The methods a converter declaring ``capability`` implements."""
    proto = PROTOCOLS[capability]
    return tuple(n for n, v in vars(proto).items() if callable(v) and not n.startswith("_"))


@overload
def offered(conv: Any, declared: frozenset[str], capability: Literal["layers"]) -> LayerSearch | None: ...
@overload
def offered(conv: Any, declared: frozenset[str], capability: Literal["unsearchable"]) -> Unsearchable | None: ...
@overload
def offered(conv: Any, declared: frozenset[str], capability: Literal["activations16"]) -> Activations16 | None: ...
def offered(conv: Any, declared: frozenset[str], capability: Capability) -> Any:
    """``conv`` as the protocol of ``capability`` where ``declared`` (the registry's ``ConverterInfo.mixed``)
    holds it, else None."""
    if capability not in PROTOCOLS:
        raise ValueError(f"unknown mixed-precision capability {capability!r}; known: {', '.join(PROTOCOLS)}")
    return cast(PROTOCOLS[capability], conv) if capability in declared else None
