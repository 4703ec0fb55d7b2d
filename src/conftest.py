"""Doctest collection under ``src``: the torchtitan drop-in needs the optional extra."""

import importlib.util

# Importing meshlayout.torch.torchtitan imports torchtitan (the `torchtitan` extra);
# where it is not installed, its doctests are not collected.
collect_ignore = [] if importlib.util.find_spec("torchtitan") else ["meshlayout/torch/torchtitan"]
