"""No `getattr(args, "flag", default)` for a field `VimeArgs` declares.

Every flag (and every derived field) is an attribute of the `VimeArgs` that vime hands around,
so a default at the read is at best a second copy of the flag's default and at worst a different
one (`rollout_seed` read with None while the flag defaults to 42), and it hides a renamed flag:
the read silently falls back instead of failing. Read `args.<name>`.

Where an object truly may lack the attribute (a namespace a user's own code built), keep the
getattr and say so at that line with a comment containing `user namespace:` and why.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from vime.config.args import VimeArgs

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("vime", "workflows", "activities", "workers")
FIELDS = {f.name for f in dataclasses.fields(VimeArgs)}
ALLOW = "user namespace:"


def _args_like(node: ast.expr) -> bool:
    """`args`, `self.args`, `rm_args`, `worker_args`...: a name or attribute ending in "args"."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name.endswith("args")


def defaulted_reads(source: str) -> list[tuple[int, str]]:
    """(line, expression) of each `getattr(<args>, "<field>", default)` / `hasattr(<args>, "<field>")`."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2):
            continue
        if not ((node.func.id == "getattr" and len(node.args) == 3) or node.func.id == "hasattr"):
            continue
        target, name = node.args[0], node.args[1]
        if not (isinstance(name, ast.Constant) and name.value in FIELDS and _args_like(target)):
            continue
        if ALLOW in lines[node.lineno - 1]:
            continue
        found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_scan_finds_a_defaulted_read_of_a_declared_flag():
    source = 'x = getattr(args, "rollout_seed", None)\ny = getattr(self.args, "rm_url", None)\n' \
             'z = hasattr(rm_args, "group_rm")\nok = getattr(args, "not_a_flag", None)\n' \
             'also_ok = getattr(args, "rm_url", None)  # user namespace: slime scripts build their own\n'
    assert [line for line, _ in defaulted_reads(source)] == [1, 2, 3]


def test_no_getattr_default_for_a_declared_flag():
    bad = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            for line, expr in defaulted_reads(path.read_text()):
                bad.append(f"{path.relative_to(ROOT)}:{line}: {expr}")
    assert not bad, ("read these as args.<name> (the flag is a VimeArgs field, always set; a default here "
                     "hides a renamed flag), or mark the line `# user namespace: <why>`:\n" + "\n".join(bad))
