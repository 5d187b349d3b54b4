"""The coverage table of tests/README.md ("Coverage") is complete and names real tests: every option
of every subcommand of the real parser (stratac.cli.build_parser) has a row, every diagnostic code
of stratac.diagnostics.Codes has a row, every named test function exists, and its source (or its
module's: options given by a fixture or a helper) names the option or the code it is listed for."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

from stratac import cli
from stratac.diagnostics import Codes

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "tests" / "README.md"


def section() -> str:
    text = README.read_text()
    start = text.index("## Coverage")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else len(text)]


def table(header: str) -> list[list[str]]:
    """The rows of the table whose header line starts with `header`, cells without backticks."""
    lines = section().splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[i + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip().strip("`") for c in line.strip().strip("|").split("|")])
    return rows


def parser_options() -> set[tuple[str, str]]:
    """(command, option string) for every option of every subcommand, -h/--help aside."""
    out = set()
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in sub.choices.items():
        strings = [s for a in p._actions for s in a.option_strings if s not in ("-h", "--help")]
        out |= {(name, s) for s in strings}
        if not strings:
            out.add((name, "(the command)"))
    return out


def defined_codes() -> dict[str, str]:
    return {v: k for k, v in vars(Codes).items() if k.isupper() and isinstance(v, str)}


def source_of(node_id: str) -> tuple[str, str]:
    """(the function's source, the module's source) of tests/...py::test_name; fails if missing."""
    path, _, name = node_id.partition("::")
    f = ROOT / path
    assert f.is_file() and path.startswith("tests/"), f"{node_id}: no such test file"
    src = f.read_text()
    fn = next((n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    assert fn is not None and name.startswith("test_"), f"{node_id}: no such test function"
    return ast.get_source_segment(src, fn), src


def test_every_option_of_the_real_parsers_has_a_row_and_nothing_else_does():
    listed = {(c, o) for c, o, _ in table("| command | option | test |")}
    real = parser_options()
    assert real - listed == set(), f"options without a row in tests/README.md: {sorted(real - listed)}"
    assert listed - real == set(), f"rows for options the parsers do not have: {sorted(listed - real)}"


def test_every_option_row_names_a_test_that_gives_the_option():
    for command, option, node_id in table("| command | option | test |"):
        fn, module = source_of(node_id)
        if option == "(the command)":
            assert f'"{command}"' in fn, (command, node_id)
            continue
        assert re.search(rf'["\']{re.escape(option)}["\']', fn) or f'"{option}"' in module, (command, option, node_id)
        assert f'"{command}"' in fn or f'"{command}"' in module, (command, option, node_id)


def test_every_code_has_a_row_naming_a_test_that_provokes_it():
    rows = table("| code | test | how |")
    codes = defined_codes()
    assert sorted(c for c, _, _ in rows) == sorted(codes), "codes and the table differ"
    for code, node_id, _ in rows:
        fn, module = source_of(node_id)
        names = (code, f"Codes.{codes[code]}")
        assert any(n in fn for n in names) or any(n in module for n in names), (code, node_id)


def test_every_construct_row_names_an_existing_test():
    rows = table("| construct | test |")
    assert len(rows) >= 10
    for _, node_id in rows:
        source_of(node_id)


def test_the_table_check_can_fail():
    """Fed a table without a row, the checks above see it: an option and a code drop out."""
    listed = {(c, o) for c, o, _ in table("| command | option | test |")} - {("run", "--seed")}
    assert ("run", "--seed") in parser_options() - listed
    assert "E0401" in set(defined_codes()) - {c for c, _, _ in table("| code | test | how |") if c != "E0401"}
