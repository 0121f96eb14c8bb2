"""The paper's experiments, each a module with a ``run`` function and its plots."""
