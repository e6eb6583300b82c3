"""edgekit: ship a trained model to an edge board, and prove every step.

Importing edgekit imports no ML framework; the heavy toolchains load inside the
functions that need them.
"""

__version__ = "0.1.0"
