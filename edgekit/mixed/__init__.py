"""Mixed precision: the search primitives converters offer (:mod:`edgekit.mixed.search`) and the pipeline's
fallback stage that drives them (:mod:`edgekit.mixed.fallback`)."""

from edgekit.mixed.search import *  # noqa: F401,F403 - transitional: import from edgekit.mixed.search
from edgekit.mixed.search import db, quant_noise  # noqa: F401
