"""docs/npu.md's call table names every Ascend C, SHMEM and ACL identifier the NPU build touches:
what runtime/device/strata_device.h, every generated kernel.cpp and the NPU side of every generated
launch.cpp call, include or name (functions, member functions, macros, types, enum values,
template arguments, language extensions), and the SHMEM host calls stratac/host/npu_comm.py makes
through cffi. Each row gives the documented signature and where it comes from.

The scan is independent of the table: it reads the sources (comments, strings and the
STRATA_CPU_MODEL branches removed) and reports every identifier that stratac does not define
itself. A use that the table lacks fails, naming the file; a row whose identifier nothing uses
fails too, so the table stays true. Rows marked `pending` describe calls other work is adding; they
may be used or not."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stratac.host import npu_comm

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "npu.md"
TABLE_HEADING = "## Every Ascend C, SHMEM and ACL call"

CPP_WORDS = frozenset("""
    alignas alignof auto bool break case catch char class const constexpr const_cast continue
    decltype default delete do double else enum explicit extern false float for friend goto if
    inline int long mutable namespace new noexcept nullptr operator private protected public
    reinterpret_cast return short signed sizeof static static_assert static_cast struct switch
    template this throw true try typedef typename union unsigned using virtual void volatile while
    int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t size_t uintptr_t""".split())
# the C/C++ preprocessor's own words
PP_WORDS = frozenset("define undef include ifdef ifndef endif defined pragma once __VA_ARGS__".split())
OWN_HEADERS = frozenset({"strata_device.h", "strata_cpu.h"})


def strip_cpu_branches(text: str) -> str:
    """The NPU side of `#ifdef STRATA_CPU_MODEL / #else / #endif` (and `#ifndef`): what CANN sees."""
    out, stack = [], []      # stack of (is_model_conditional, keep_this_branch)
    for line in text.splitlines():
        s = line.strip()
        m = re.match(r"#\s*(ifdef|ifndef)\s+(\w+)", s)
        if m:
            model = m.group(2) == "STRATA_CPU_MODEL"
            stack.append((model, not model or m.group(1) == "ifndef"))
            continue
        if re.match(r"#\s*if\b", s):
            stack.append((False, True))
            continue
        if re.match(r"#\s*else\b", s):
            model, keep = stack[-1]
            stack[-1] = (model, not keep if model else keep)
            continue
        if re.match(r"#\s*endif\b", s):
            stack.pop()
            continue
        if all(keep for _, keep in stack):
            out.append(line)
    assert not stack, "unbalanced #if in a scanned source"
    return "\n".join(out)


def strip_comments_and_strings(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)


def own_names(text: str) -> set[str]:
    """What the scanned sources define themselves: macros, classes, enums and their values,
    functions and methods, template parameters, variables and members."""
    names = set(re.findall(r"#\s*define\s+(\w+)", text))
    names |= set(re.findall(r"\b(?:class|struct|enum class|enum|namespace|typename)\s+(\w+)", text))
    for body in re.findall(r"\benum(?:\s+class)?\s+\w+\s*\{([^}]*)\}", text):
        names |= set(re.findall(r"\b(\w+)\b", body))
    # a function or method definition or declaration: a type, the name, its parameter list
    names |= set(re.findall(r"\b[\w:<>*&,\s]+?[\s*&](\w+)\s*\([^;{}]*\)\s*(?:const\s*)?\{", text))
    # declarations: `Type name =|;|,|[|)` and parameters
    names |= set(re.findall(r"[\w>*&]\s+[*&]*\s*(\w+)\s*(?:=|;|,|\)|\[|\{)", text))
    return names


def scan(text: str) -> set[str]:
    """The API identifiers one source uses (its NPU side)."""
    npu = strip_cpu_branches(text)
    found = set()
    for inc in re.findall(r'#\s*include\s*[<"]([^>"]+)[>"]', npu):
        if inc in OWN_HEADERS or "." not in inc:     # stratac's own, or the C++ library's
            continue
        header = re.sub(r"^aclrtlaunch_\w+", "aclrtlaunch_<kernel>", inc)
        found.add(f'#include "{header}"')
    code = strip_comments_and_strings(npu)
    code = re.sub(r"#\s*include[^\n]*", " ", code)
    own = own_names(code) - {"T"} | {"T", "D", "OP"}
    qualified = set(re.findall(r"\bAscendC(?:::\w+)+", code))
    found |= qualified
    rest = re.sub(r"\bAscendC(?:::\w+)+", " ", code)
    rest = re.sub(r"\b(?:strata|strata_cpu)(?:::\w+)+", " ", rest)     # stratac's own namespace
    for m in re.finditer(r"(\.|->)\s*(?:template\s+)?([A-Za-z_]\w*)", rest):
        name = m.group(2)
        if name not in own:
            found.add("." + name)
    rest = re.sub(r"(\.|->)\s*(?:template\s+)?[A-Za-z_]\w*", " ", rest)
    for name in re.findall(r"\b[A-Za-z_]\w*\b", rest):
        if name in CPP_WORDS or name in PP_WORDS or name in own:
            continue
        if name.startswith("aclrtlaunch_"):
            found.add("aclrtlaunch_<kernel>")
        elif re.match(r"(?i)acl", name) or re.fullmatch(r"__\w+__", name) or \
                re.fullmatch(r"[A-Z][A-Z0-9_]+", name) or name in ("half", "bfloat16_t"):
            found.add(name)
        elif re.search(r"[A-Z]", name) and not re.fullmatch(r"k[A-Z]\w*", name):
            found.add(name)      # an unqualified CamelCase call or type that stratac does not define
    return found


def sources() -> dict[str, str]:
    files = {"runtime/device/strata_device.h": (ROOT / "runtime/device/strata_device.h").read_text()}
    for p in sorted((ROOT / "generated").glob("*/kernel.cpp")) + sorted((ROOT / "generated").glob("*/launch.cpp")):
        files[str(p.relative_to(ROOT))] = p.read_text()
    return files


def used() -> dict[str, set[str]]:
    """identifier -> the files that use it."""
    where: dict[str, set[str]] = {}
    # kernel.cpp includes strata_device.h: its own names are defined there
    device = strip_comments_and_strings(strip_cpu_branches(sources()["runtime/device/strata_device.h"]))
    shared = own_names(device)
    for name, text in sources().items():
        for ident in scan(text):
            if ident in shared and not ident.startswith(("#", ".")):
                continue
            if ident.startswith(".") and ident[1:] in shared:
                continue
            where.setdefault(ident, set()).add(name)
    # the SHMEM host calls the NPU communicator makes through cffi (its library is self._lib)
    host = Path(npu_comm.__file__).read_text()
    for fn in re.findall(r"\b_lib\.(\w+)\s*\(", host):
        where.setdefault(fn, set()).add("stratac/host/npu_comm.py")
    return where


def table() -> dict[str, bool]:
    """identifier -> whether its row is marked pending."""
    text = DOC.read_text()
    assert TABLE_HEADING in text, f"docs/npu.md has no section {TABLE_HEADING!r}"
    section = text.split(TABLE_HEADING, 1)[1].split("\n## ", 1)[0]
    rows: dict[str, bool] = {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        pending = "pending" in cells[-1].lower()
        for key in re.findall(r"`([^`]+)`", cells[0]):
            assert key not in rows, f"docs/npu.md: {key!r} has two rows"
            rows[key] = pending
    return rows


def test_the_scan_finds_what_it_should():
    """The scanner against a small hand-written source: qualified and unqualified API names,
    members, macros, extensions and includes are found; stratac's own names and the CPU-model
    branch are not."""
    text = """#include "kernel_operator.h"
#ifdef STRATA_CPU_MODEL
#include "strata_cpu.h"
#define MINE(x) ::strata_cpu::Model(x)
#else
#define MINE(x) ((void)0)
#endif
namespace strata {
template <typename T> class Mine {
  __aicore__ inline void Go(__gm__ T* p) {  // AscendC::NotThis in a comment
    AscendC::GlobalTensor<T> g; g.SetGlobalBuffer(p, 4); Helper(); MINE(1);
    AscendC::PipeBarrier<PIPE_ALL>(); q_.template AllocTensor<T>(); const char* s = "aclshmem_x";
    aclshmem_quiet(); Unqualified(3); half h; bfloat16_t b;
  }
  __aicore__ inline void Helper() {}
};
}"""
    got = scan(text)
    assert got == {'#include "kernel_operator.h"', "AscendC::GlobalTensor", "AscendC::PipeBarrier",
                   ".SetGlobalBuffer", ".AllocTensor", "PIPE_ALL", "__aicore__", "__gm__",
                   "aclshmem_quiet", "Unqualified", "half", "bfloat16_t"}, got


def test_every_call_is_in_the_table_and_every_row_is_used():
    where, rows = used(), table()
    missing = {k: sorted(v) for k, v in where.items() if k not in rows}
    assert not missing, ("calls not in docs/npu.md's call table (add a row with the documented "
                         "signature and its source): " +
                         "; ".join(f"{k} (in {', '.join(v[:3])})" for k, v in sorted(missing.items())))
    stale = sorted(k for k, pending in rows.items() if k not in where and not pending)
    assert not stale, f"rows of docs/npu.md's call table that nothing uses any more: {stale}"


@pytest.mark.parametrize("key", ["AscendC::DataCopy", "AscendC::SyncAll", "aclshmemx_signal_op",
                                 "ACLRT_LAUNCH_KERNEL", "KERNEL_TASK_TYPE_DEFAULT",
                                 "AscendC::RoundMode::CAST_RINT",
                                 ".GetWithOffset", ".AllocTensor",
                                 "aclshmemx_init_attr", '#include "aclrtlaunch_<kernel>.h"'])
def test_known_calls_are_found(key):
    """The scan is not vacuous: calls the sources plainly make are among its findings."""
    assert key in used()
