"""``toolscout tune``: Ray Tune sweeps over any method's config keys (see :mod:`workflows.tune.sweep`)."""
