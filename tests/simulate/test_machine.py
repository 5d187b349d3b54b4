"""The machine file: the shipped one loads and cites its sources, and every problem with a file is
one SimulateError naming the file and key."""

import pytest
from simkit import ROOT, TINY

from stratac.tools.simulate.machine import SimulateError, load_machine


def test_the_shipped_machine_file_loads(cm384):
    assert cm384.max_world == 768
    assert cm384.vector_cores == 48
    text = (ROOT / "machines" / "cloudmatrix384.toml").read_text()
    for line in text.splitlines():   # every value says where it comes from
        if "=" in line and not line.lstrip().startswith("#"):
            assert "#" in line, line


def test_the_atlas950_draft_loads_with_a_rank_per_npu_and_cites_or_marks_every_value():
    """machines/atlas950.toml (issue 26): 8,192 ranks of one 950DT each; every value cites a source
    or says it is an ESTIMATE or an assumption (the file's header explains both)."""
    m = load_machine(ROOT / "machines" / "atlas950.toml")
    assert (m.max_world, m.dies_per_npu, m.vector_cores) == (8192, 1, 64)
    text = (ROOT / "machines" / "atlas950.toml").read_text()
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            assert "#" in line, line


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("fabric_gbps = 0.5\n", ""), "missing key 'fabric_gbps' in [rank]"),
    (lambda t: t.replace("queues = 1", "queues = 0"), "[sdma] queues must be an integer >= 1, got 0"),
    (lambda t: t.replace("hbm_gbps = 1000.0", 'hbm_gbps = "fast"'),
     "[rank] hbm_gbps must be a number > 0, got 'fast'"),
    (lambda t: t.replace("post_us = 5.0", "post_us = 5.0\npost_ns = 5"), "unknown key 'post_ns' in [sdma]"),
    (lambda t: t + "[gpu]\nx = 1\n", "unknown section [gpu]"),
    (lambda t: t.replace("[sync]\nlaunch_us = 10.0\nsync_all_us = 1.0\nflag_issue_us = 0.5\n", ""),
     "missing section [sync]"),
    (lambda t: t.replace("npus = 4", "npus = "), "not valid TOML"),
    (lambda t: t.replace("ub_bytes_per_core = 196608", "ub_bytes_per_core = 1024"),
     "the kernels lay out 196608 bytes of UB per core"),
])
def test_bad_machine_files_name_the_file_and_key(tmp_path, edit, message):
    path = tmp_path / "bad.toml"
    path.write_text(edit(TINY))
    with pytest.raises(SimulateError) as exc:
        load_machine(path)
    assert str(exc.value).startswith(f"{path}: ")
    assert message in str(exc.value)


def test_missing_machine_file(tmp_path):
    with pytest.raises(SimulateError, match="no such machine file"):
        load_machine(tmp_path / "nope.toml")
