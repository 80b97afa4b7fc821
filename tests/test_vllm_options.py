"""`--vllm-*` flags are checked by vLLM's own parser, and a launch pays for building it only the
first time an installed vLLM meets a value: the option table and each value's verdict are
recorded per vLLM version (vime.config.vllm_options)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from vime.config.vllm_options import OptionTable


def _server_parser() -> argparse.ArgumentParser:
    """A stand-in for `vllm serve`'s parser: a typed option, a choice, a switch."""
    parser = argparse.ArgumentParser()

    def length(raw: str) -> int:
        return int(raw.removesuffix("k")) * (1024 if raw.endswith("k") else 1)

    parser.add_argument("--max-model-len", type=length)
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction)
    return parser


class CountedBuild:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> tuple[argparse.Action, ...]:
        self.calls += 1
        return tuple(_server_parser()._actions)


def _option(table: OptionTable, flag: str):
    return next(o for o in table.options() if flag in o.option_strings)


def test_the_table_is_built_once_and_read_back_by_the_next_process(tmp_path):
    first_build, second_build = CountedBuild(), CountedBuild()
    first = OptionTable(tmp_path / "table.json", first_build)
    options = first.options()
    assert first_build.calls == 1
    second = OptionTable(tmp_path / "table.json", second_build)
    assert second.options() == options and second_build.calls == 0
    assert _option(second, "--no-enforce-eager").nargs == 0
    assert _option(second, "--dtype").choices == ("auto", "float32", "bfloat16")


def test_a_typed_value_is_judged_by_the_servers_own_type_once_and_its_verdict_kept(tmp_path):
    build = CountedBuild()
    table = OptionTable(tmp_path / "table.json", build)
    check = table.checker(_option(table, "--max-model-len"))
    assert check("2k") == "2k"  # the user's string goes on, as typed
    with pytest.raises(argparse.ArgumentTypeError) as first:
        check("2x")
    first_error = str(first.value)
    assert "invalid value '2x'" in first_error
    calls = build.calls

    later_build = CountedBuild()
    later = OptionTable(tmp_path / "table.json", later_build)
    later_check = later.checker(_option(later, "--max-model-len"))
    assert later_check("2k") == "2k"
    with pytest.raises(argparse.ArgumentTypeError) as later_error:
        later_check("2x")
    assert str(later_error.value) == first_error
    assert later_build.calls == 0, "recorded verdicts need no parser"
    assert later_check("4k") == "4k" and later_build.calls == 1, "a value never seen is checked by the parser"
    assert calls >= 1


def test_an_untyped_choice_is_checked_without_the_parser(tmp_path):
    OptionTable(tmp_path / "table.json", CountedBuild()).options()
    build = CountedBuild()
    table = OptionTable(tmp_path / "table.json", build)
    check = table.checker(_option(table, "--dtype"))
    assert check("float32") == "float32"
    with pytest.raises(argparse.ArgumentTypeError, match="choose from auto, float32, bfloat16"):
        check("float8")
    assert build.calls == 0


def test_an_unreadable_or_older_record_is_rebuilt_not_trusted(tmp_path):
    path = tmp_path / "table.json"
    path.write_text("{not json")
    build = CountedBuild()
    assert OptionTable(path, build).options() and build.calls == 1
    path.write_text(json.dumps({"format": 0, "options": []}))
    build = CountedBuild()
    assert OptionTable(path, build).options() and build.calls == 1
    assert json.loads(path.read_text())["format"] != 0


def test_a_server_package_without_a_version_is_checked_without_a_record(tmp_path):
    """No distribution metadata, no version to key a record by: the table lives in memory."""
    build = CountedBuild()
    table = OptionTable(None, build)
    check = table.checker(_option(table, "--max-model-len"))
    assert check("1k") == "1k" and check("1k") == "1k"
    with pytest.raises(argparse.ArgumentTypeError):
        check("1x")
    assert not list(tmp_path.iterdir())


PROBE = """
import json, sys
from vime.config.args import parse_args
args = parse_args(sys.argv[1:])
print(json.dumps({"server_args": args.vllm_server_args, "vllm_imported": "vllm" in sys.modules}))
"""


def _parse_in_fresh_process(argv: list[str], cache) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], env={**os.environ, "VIME_CACHE": str(cache)},
                         capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_launch_with_the_same_vllm_flags_does_not_import_vllm(tmp_path):
    argv = ["--vllm-max-model-len", "1024", "--vllm-enforce-eager", "--vllm-dtype", "float32",
            "--vllm-gpu-memory-utilization=0.3"]
    first = _parse_in_fresh_process(argv, tmp_path)
    second = _parse_in_fresh_process(argv, tmp_path)
    assert first["vllm_imported"] and not second["vllm_imported"]
    assert second["server_args"] == first["server_args"] == [
        "--max-model-len", "1024", "--enforce-eager", "--dtype", "float32", "--gpu-memory-utilization", "0.3"]
    assert list((tmp_path / "vllm-options").glob("*.json")), "the table is kept under $VIME_CACHE"
