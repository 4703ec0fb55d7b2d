"""Package-level checks: import cost and the no-torch rule of the pure layers."""

import subprocess
import sys

IMPORT_CODE = (
    "import sys, time; t = time.perf_counter(); import meshlayout; "
    "dt = time.perf_counter() - t; print('torch' in sys.modules, dt)"
)


def _import_once() -> tuple[bool, float]:
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_CODE], capture_output=True, text=True, check=True
    )
    has_torch, seconds = out.stdout.split()
    return has_torch == "True", float(seconds)


def test_import_does_not_import_torch() -> None:
    has_torch, _ = _import_once()
    assert not has_torch, "import meshlayout imported torch; the pure layers must not"


def test_import_is_fast() -> None:
    # Best of five fresh interpreters, so a loaded CI machine does not make it flaky.
    best = min(_import_once()[1] for _ in range(5))
    assert best < 0.3, f"import meshlayout took {best:.3f} s (best of 5); the budget is 0.3 s"
