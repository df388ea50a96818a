"""The study tools: they read run folders and never train. ``compare`` (the comparison protocol),
``results`` (a comparison's numbers), ``paired`` (paired bootstraps), ``sampled`` (sampled
behaviour), ``probe`` (teacher probes of a checkpoint) and ``report`` (the HTML pages). Nothing
below this package imports it."""
