"""Suite-wide settings: no per-example time limit in hypothesis tests.

Tests assert behaviour and counts, never seconds (timings live in ``benchmarks/``);
hypothesis's default 200 ms deadline per example would make property tests fail on a
loaded machine, so every profile here has ``deadline=None``.
"""

from hypothesis import settings

settings.register_profile("meshlayout", deadline=None)
settings.load_profile("meshlayout")
