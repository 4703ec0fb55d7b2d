"""Package-level checks: what ``import meshlayout`` loads (the import-time budget is measured
in ``benchmarks/bench_import.py``, not asserted here: tests hold no absolute time limits)."""

import json
import subprocess
import sys

IMPORT_CODE = (
    "import sys, json; before = set(sys.modules); import meshlayout; "
    "print(json.dumps(sorted(set(sys.modules) - before)))"
)


def _modules_loaded_by_import() -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_CODE], capture_output=True, text=True, check=True
    )
    return set(json.loads(out.stdout))


def _third_party(modules: set[str]) -> set[str]:
    tops = {m.split(".")[0] for m in modules}
    return {t for t in tops if t not in sys.stdlib_module_names and not t.startswith("_")}


def test_the_third_party_filter_sees_torch() -> None:
    assert _third_party({"torch.nn", "os.path", "numpy", "_io"}) == {"torch", "numpy"}


def test_import_loads_only_numpy_and_meshlayout() -> None:
    # No torch (the pure layers must not import it) and nothing else heavy: the import stays
    # cheap by construction, whatever the machine's load.
    loaded = _modules_loaded_by_import()
    assert _third_party(loaded) <= {"numpy", "meshlayout"}, sorted(_third_party(loaded))
    assert "meshlayout.torch" not in loaded and "meshlayout.cli" not in loaded
