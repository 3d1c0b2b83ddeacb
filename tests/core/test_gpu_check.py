"""benchmarks/gpu_check.sh, the prepared device check, in its CPU mode (what CI runs of it)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the CUDA mode runs the full check")
def test_gpu_check_script_passes_on_cpu_and_writes_one_results_file(tmp_path, tiny_model_dir):
    results = tmp_path / "results.txt"
    env = os.environ | {"PYTHON": sys.executable, "CACHEBLEND_CHECK_MODEL": str(tiny_model_dir)}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks/gpu_check.sh"), str(results)], env=env, timeout=300)
    text = results.read_text()
    assert proc.returncode == 0, text
    assert text.startswith("gpu_check: mode cpu") and text.rstrip().endswith("gpu_check: PASSED")
    assert "1 passed" in text  # the equivalence test ran
    assert "| floor |" in text and "warming" in text and "tokens/s computed" in text  # the benchmark's table
