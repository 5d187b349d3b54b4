"""The templates print no operator of their own next to an expression: every expression a kernel
contains comes whole from the emitter, printed by `ir.c_source`, which parenthesizes by C++
precedence (a template that wrote `{{ var }} < {{ hi }}` printed `s_ < X & 3`, which C++ reads as
`(s_ < X) & 3`). Checked on the template text: the characters beside each `{{ ... }}`
substitution, outside comments, are no operator, except after an assignment (`= {{ e }};`, whose
right side is a complete expression) and beside the few substitutions that are names or types."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ["kernel.cpp.j2", "launch.cpp.j2"]
OPERATOR = set("+-*/%&|^<>=!~?:.[")

# substitutions that are not expressions: names declared or incremented, types, template
# arguments, kernel names (declared, and in header names), the indentation, launch.cpp's case
# labels (integers jinja computes); an array's declarator (`t_[64]`) and the element a loop fills
# (`t_[j]`, printed whole by ir.c_source: a subscript binds tighter than `=`)
NOT_EXPRESSIONS = {"pad", "n.var", "st.var", "t.c", "z.c", "x.c", "m.c", "v.name", "st.name", "n.name",
                   "st.array", "st.elem",
                   '"" if st.mutable else "const "', "t.ctype",
                   "k.ctype", "k.red", "n.op", "kernel_class", "n.via", "k.name",
                   "k.code * 3 + k.op_code if has_op else k.code"}


def _code(text: str) -> list[str]:
    """The template's lines without jinja statements and comments, nor C++ comments."""
    text = re.sub(r"\{#.*?#\}", "", text, flags=re.S)
    text = re.sub(r"\{%.*?%\}", "", text, flags=re.S)
    return [line.split("//")[0] for line in text.splitlines()]


def operators_beside_substitutions(text: str) -> list[str]:
    found = []
    for number, line in enumerate(_code(text), 1):
        for m in re.finditer(r"\{\{\s*(.*?)\s*\}\}", line):
            if m.group(1) in NOT_EXPRESSIONS:
                continue
            before = re.sub(r"\{\{.*?\}\}", "", line[:m.start()]).rstrip()
            after = line[m.end():].lstrip()
            assigned = re.search(r"(?<![=!<>+\-*/%&|^])\+?=$", before) and after[:1] in (";", "")
            if assigned:
                continue
            if (before[-1:] in OPERATOR and not before.endswith("::")) or after[:1] in OPERATOR or \
                    after.startswith("->") or after.startswith("("):
                found.append(f"line {number}: {line.strip()}")
                break
    return found


def test_the_check_sees_operators_beside_substitutions():
    assert operators_beside_substitutions(
        "for (int64_t {{ n.var }} = {{ n.lo }}; {{ n.var }} < {{ n.hi }}; ++{{ n.var }}) {\n"
        "f({{ a }} + off, epoch_ + {{ s }}, {{ p }}[0], {{ q }}.x, -{{ r }});\n") == [
        "line 1: for (int64_t {{ n.var }} = {{ n.lo }}; {{ n.var }} < {{ n.hi }}; ++{{ n.var }}) {",
        "line 2: f({{ a }} + off, epoch_ + {{ s }}, {{ p }}[0], {{ q }}.x, -{{ r }});"]
    assert operators_beside_substitutions(
        "int64_t {{ n.var }} = {{ n.lo }};\ntotal += {{ n.len }};\nf({{ a }}, {{ b }});  // {{ c }} + 1\n"
        "if ({{ cond }}) {\n") == []


@pytest.mark.parametrize("name", TEMPLATES)
def test_templates_print_no_operator_beside_an_expression(name):
    text = (ROOT / "templates" / name).read_text()
    assert operators_beside_substitutions(text) == [], f"templates/{name}"


def test_the_mask_bitmap_is_laid_out_alike_by_the_host_and_the_kernel():
    """The mask of active ranks (docs/robustness.md, "Masked ranks"): the kernels' UB buffer holds
    ir.MASK_MAX_WORLD bits, the plan reserves passes.MASK_BYTES for it, and the bitmap sits right
    after the agreement verdict line, one bit per rank, in whole 64-byte lines."""
    from stratac import ir
    from stratac.codegen import abi
    from stratac.ir import passes
    header = (ROOT / "runtime" / "device" / "strata_device.h").read_text()
    assert int(re.search(r"kMaskMaxWorld = (\d+);", header).group(1)) == ir.MASK_MAX_WORLD
    assert "kMaskBytes = kMaskMaxWorld / 8;" in header and passes.MASK_BYTES == ir.MASK_MAX_WORLD // 8
    assert "return AgreeVerdict(sync, world) + kSyncSlotInts;" in header
    for world in (1, 64, 512, 513, 16384):
        assert abi.mask_offset(world) == abi.verdict_offset(world) + abi.SYNC_SLOT_BYTES
        assert abi.sync_area_bytes(world) - abi.mask_offset(world) == -(-world // 512) * 64
    words = abi.mask_words((1 << 70) - 1 - (1 << 3) - (1 << 66), 72)   # ranks 3 and 66 masked of 72
    assert len(words) == 16 and words[0] == -1 - 8 and words[1] == -1 and words[2] == 0b111011
    assert words[3:] == [0] * 13    # ranks 70, 71 masked too: bits past 70 are clear
    assert abi.mask_words(-1, 40) == [-1, 0xFF] + [0] * 14
