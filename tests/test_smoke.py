"""Package-level checks: import cost and the no-torch rule of the pure layers."""

import subprocess
import sys


def test_import_does_not_import_torch_and_is_fast() -> None:
    code = (
        "import sys, time; t = time.perf_counter(); import meshlayout; "
        "dt = time.perf_counter() - t; print('torch' in sys.modules, dt)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    has_torch, seconds = out.stdout.split()
    assert has_torch == "False"
    assert float(seconds) < 0.3, f"import meshlayout took {seconds}s"
