"""Mixed precision: the search primitives converters offer (:mod:`edgekit.mixed.search`) and the pipeline's
fallback stage that drives them (:mod:`edgekit.mixed.fallback`)."""
