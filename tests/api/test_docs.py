"""The API documentation's example and the torchrun example run as written, under torchrun."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def torchrun(script: Path, nproc: int, cwd: Path):
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                           str(nproc), str(script)], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_api_doc_example(tmp_path):
    text = (ROOT / "docs" / "api.md").read_text()
    block = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    script = tmp_path / "doc_example.py"
    script.write_text(block)
    p = torchrun(script, 2, ROOT)
    assert p.returncode == 0, p.stderr[-3000:]


def test_torchrun_example():
    p = torchrun(ROOT / "examples" / "python" / "torchrun_allreduce_moe.py", 4, ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "torchrun_allreduce_moe: OK" in p.stdout
