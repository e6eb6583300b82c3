"""User errors, kept apart from bugs.

Every mistake a user can make (a bad path, a wrong shape, an unknown board, a missing
toolchain) raises an :class:`EdgekitError` subclass whose message says what was wrong
and what to do. The CLI prints that message on one line and exits with code 2; any
other exception is a bug and keeps its traceback.
"""

from __future__ import annotations


class EdgekitError(Exception):
    """A user-facing error: the message names the problem and the fix."""

    exit_code = 2


class ModelLoadError(EdgekitError):
    """The model file is missing, truncated, or not a model edgekit can read."""


class UnsupportedInputError(ModelLoadError):
    """A model format the target's converter does not take (e.g. Keras for jetson): a limitation of edgekit's
    converters, not of the model or the target."""


class InputSpecError(EdgekitError):
    """An input shape, dtype or data set that does not fit the model."""


class ProfileError(EdgekitError):
    """An unknown or invalid board/target profile, or a bad --set override."""


class UnsupportedOpError(EdgekitError):
    """The model holds an op the target cannot run."""


class MatrixSpecError(EdgekitError):
    """An invalid `edgekit matrix` spec (SPEC.toml), or no Ray cluster where one was asked for."""


class MissingToolchainError(EdgekitError):
    """An optional toolchain is not installed; the message names the extra."""


class ConversionError(EdgekitError):
    """The toolchain refused the model; the message carries its reason."""


class VerificationError(EdgekitError):
    """The converted artifact does not match the float model within tolerance."""


class OutputError(EdgekitError):
    """The output path cannot be written (exists and is not an edgekit output, ...)."""


class HostCannotError(ConversionError):
    """The target takes the model, but this host cannot build or check it (e.g. Core ML W8A8 calibration runs
    Core ML predict, macOS only): a limitation of the host, not of the model or the target."""
