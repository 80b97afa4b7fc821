"""Rollout environments are plugins (`--rollout-env`): a module outside vime declares its group
workflow, activities and flags, and a run trains on its groups through the training workflow,
which knows environments only by the registered name of their group workflow."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from tests.conftest import engine_flags
from tests.runs import TrainRun
from vime.config.args import parse_args
from vime.envs import BUILTIN, ENTRY_POINTS, load_environment, registered, workflow_classes
from vime.errors import ConfigError
from vime.store import SampleStore
from workflows import training


def test_the_training_workflow_names_no_environment():
    source = inspect.getsource(training)
    for name in ("CodingAgent", "coding_agent", "ShoutGroup", *BUILTIN):
        if name != "groups":
            assert name not in source, name


def test_an_environment_module_brings_its_flags_into_the_parser():
    args = parse_args(["--rollout-env", "tests.envs.shout", "--shout-bonus", "2.5"])
    assert args.rollout_env == "tests.envs.shout" and args.env_args.shout_bonus == 2.5
    assert parse_args(["--rollout-env", "tests.envs.shout"]).env_args.shout_bonus == 1.0
    with pytest.raises(ConfigError, match="unknown flag --shout-bonus"):  # not a built-in's: no hint
        parse_args(["--shout-bonus", "2"])  # another environment's flag


def test_a_builtin_environments_flag_without_the_environment_says_which_to_add():
    with pytest.raises(ConfigError, match="--agent-max-turns is a flag of the coding_agent environment: "
                                          "add --rollout-env coding_agent"):
        parse_args(["--agent-max-turns", "3"])


def test_the_older_rollout_workflow_flag_still_names_the_coding_agent():
    args = parse_args(["--rollout-workflow", "CodingAgentRolloutWorkflow", "--agent-max-turns", "3"])
    assert args.rollout_env == "coding_agent" and args.env_args.agent_max_turns == 3
    with pytest.raises(ConfigError, match="disagree"):
        parse_args(["--rollout-workflow", "CodingAgentRolloutWorkflow", "--rollout-env", "groups"])


def test_the_coding_agents_generate_hook_takes_the_coding_agents_flags():
    args = parse_args(["--custom-generate-function-path", "vime.envs.coding_agent.generate.generate",
                       "--agent-max-turns", "2"])
    assert args.rollout_env == "groups" and args.env_args.agent_max_turns == 2


@pytest.mark.parametrize("spec,message", [
    ("nope", "no such environment; built-ins: groups, coding_agent"),
    ("tests.envs.missing", "cannot import module 'tests.envs.missing'"),
    ("tests.runs", "module 'tests.runs' has no ENVIRONMENT"),
    ("", "expected a built-in"),
])
def test_a_bad_environment_is_one_line_naming_the_flag(spec, message):
    with pytest.raises(ConfigError, match=message) as err:
        parse_args(["--rollout-env", spec])
    assert str(err.value).startswith("--rollout-env")


@pytest.mark.parametrize("spec,path,source,line,message", [
    ("broken_env", "broken_env.py", "import os\n\nimport missing_dep\n", 3,
     "ModuleNotFoundError: No module named 'missing_dep'"),
    ("brokenpkg.mod", "brokenpkg/mod.py", "import os\n\nimport missing_dep\n", 3,
     "ModuleNotFoundError: No module named 'missing_dep'"),
    ("typo_env", "typo_env.py", "ENVIRONMENT = (\n", 1, "SyntaxError: '(' was never closed"),
    ("raising_env", "raising_env.py", "import os\nraise RuntimeError('no GPU here')\n", 2, "RuntimeError: no GPU here"),
], ids=["missing-dependency", "missing-dependency-in-a-package", "syntax-error", "raises"])
def test_an_environment_that_exists_but_fails_to_import_says_why_in_one_line(spec, path, source, line, message,
                                                                              tmp_path, monkeypatch):
    """The module is there; one of its own imports (or its code) is not right. Saying "no such
    environment" would send the user looking for a typo in the flag, and a traceback at parse
    time buries the cause: one line names the flag, the error and the file:line it came from."""
    module = tmp_path / path
    if module.parent != tmp_path:
        module.parent.mkdir()
        (module.parent / "__init__.py").write_text("")
    module.write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as err:
        parse_args(["--rollout-env", spec])
    text = str(err.value)
    assert text.startswith(f"--rollout-env {spec!r}: importing it failed: {message}"), text
    assert f"({module}:{line})" in text and "\n" not in text and "no such environment" not in text, text
    if "missing_dep" in message:
        assert text.endswith("install 'missing_dep' or fix that import"), text


def test_every_builtin_environment_loads_and_declares_registered_workflows():
    for name in BUILTIN:
        env = load_environment(name)
        assert env.name == name
        workflow_classes(env)  # raises when the group workflow is not among them


def test_vimes_own_entry_points_are_its_builtins():
    """pyproject.toml registers vime's environments for other tools to list; BUILTIN is what a
    checkout run without installing resolves. They must not drift apart."""
    pyproject = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    assert pyproject["project"]["entry-points"][ENTRY_POINTS] == BUILTIN
    assert all(len(registered()[name]) == 1 for name in BUILTIN)  # the installed metadata agrees


def test_the_examples_environments_resolve_from_a_directory_outside_the_repository(tmp_path):
    """`--rollout-env tool_use` / `multi_agent` from anywhere, with only the installed vime: the
    child's cwd is not the checkout and no PYTHONPATH names it. (setup.sh installs vime editable,
    but its finder maps only the packages the wheel ships, so `examples` is not importable there:
    before the environments moved into vime this failed with "No module named 'examples'".)"""
    code = textwrap.dedent("""
        import importlib.util
        from vime.config.args import parse_args
        from vime.envs import load_environment, resolve, workflow_classes
        assert importlib.util.find_spec("examples") is None, "the checkout is on the path: this proves nothing"
        for name in ("tool_use", "multi_agent"):
            env = load_environment(parse_args(["--rollout-env", name]).rollout_env)
            workflow_classes(env), resolve(env.activities, "activities", env)  # what a rollout worker imports
            print(name, env.group_workflow)
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["tool_use", "ToolUseGroupWorkflow", "multi_agent", "MultiAgentGroupWorkflow"]


def test_the_examples_old_paths_are_the_moved_modules():
    """`examples.tool_use.env` & co. were what docs and READMEs named: from a checkout they still
    import, as the very modules under vime/envs (a copy would make a second MultiAgentFlags class,
    and the hook's isinstance check on args.env_args would quietly fall back to defaults)."""
    import examples.multi_agent.generate
    import examples.tool_use.activities
    import vime.envs.multi_agent.generate
    import vime.envs.tool_use.activities

    assert examples.tool_use.activities is vime.envs.tool_use.activities
    assert examples.multi_agent.generate is vime.envs.multi_agent.generate
    assert load_environment("examples.tool_use.env") is load_environment("tool_use")
    args = parse_args(["--custom-generate-function-path", "examples.multi_agent.generate.generate",
                       "--num-solvers", "2"])
    assert args.env_args.num_solvers == 2 and load_environment("examples.multi_agent.env").name == "multi_agent"


def _distribution(root: Path, name: str, entry_points: str) -> None:
    """A throwaway installed distribution: its metadata on sys.path, as pip would leave it."""
    info = root / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINTS}]\n{entry_points}")


@pytest.fixture
def acme(tmp_path, monkeypatch):
    """A distribution `acme-envs` registering `loud` (with a flag) and `broken_acme` (whose
    module fails on a missing dependency), importable from tmp_path."""
    (tmp_path / "acme_envs").mkdir()
    (tmp_path / "acme_envs" / "__init__.py").write_text("")
    (tmp_path / "acme_envs" / "loud.py").write_text(textwrap.dedent('''
        from dataclasses import dataclass
        from vime.envs import Environment, env_flag

        @dataclass
        class LoudFlags:
            loud_bonus: float = env_flag(1.0, "Reward of a loud response.")

        LOUD = Environment(name="loud", group_workflow="RolloutWorkflow", flags=LoudFlags,
                           workflows=("workflows.rollout:RolloutWorkflow",))
    '''))
    (tmp_path / "acme_envs" / "broken.py").write_text("import os\n\nimport missing_dep\n")
    _distribution(tmp_path, "acme_envs", "loud = acme_envs.loud:LOUD\nbroken_acme = acme_envs.broken\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.split(".")[0] == "acme_envs"]:
        del sys.modules[name]


def test_a_distribution_registers_environments_by_entry_point_and_listing_them_imports_none(acme):
    with pytest.raises(ConfigError, match="no such environment; built-ins: groups, coding_agent, tool_use, "
                                          "multi_agent; installed: broken_acme, loud, or a module's dotted path"):
        parse_args(["--rollout-env", "nope"])
    with pytest.raises(ConfigError, match="unknown flag --loud-bonus"):  # not a built-in's flag: no hint
        parse_args(["--loud-bonus", "2"])
    assert registered()["loud"] == [("acme_envs.loud:LOUD", "acme_envs")]
    assert not [m for m in sys.modules if m.startswith("acme_envs")], "listing imported a registered module"
    args = parse_args(["--rollout-env", "loud", "--loud-bonus", "3"])  # the chosen one: imported for its flags
    assert args.rollout_env == "loud" and args.env_args.loud_bonus == 3.0
    assert "acme_envs.broken" not in sys.modules


def test_a_registered_environment_that_fails_to_import_says_why_in_one_line(acme):
    with pytest.raises(ConfigError) as err:
        parse_args(["--rollout-env", "broken_acme"])
    text = str(err.value)
    assert text.startswith("--rollout-env 'broken_acme': importing 'acme_envs.broken' failed: ModuleNotFoundError: "
                           f"No module named 'missing_dep' ({acme / 'acme_envs' / 'broken.py'}:3)"), text


def test_a_name_two_distributions_register_differently_is_refused_naming_both(acme, tmp_path):
    _distribution(tmp_path, "other_envs", "loud = other_envs.loud\n")
    with pytest.raises(ConfigError, match=r"--rollout-env 'loud': declared by several installed distributions "
                                          r"\(acme_envs: acme_envs.loud:LOUD, other_envs: other_envs.loud\)"):
        parse_args(["--rollout-env", "loud"])
    assert parse_args(["--rollout-env", "acme_envs.loud:LOUD"]).rollout_env == "acme_envs.loud:LOUD"


def test_a_group_workflow_that_is_not_registered_is_refused(tmp_path, monkeypatch):
    (tmp_path / "half_env.py").write_text(textwrap.dedent('''
        from vime.envs.base import Environment
        ENVIRONMENT = Environment(name="half", group_workflow="Missing", workflows=("workflows.rollout:RolloutWorkflow",))
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="group_workflow 'Missing' is none of its workflows"):
        workflow_classes(load_environment("half_env"))


@pytest.mark.vllm
def test_a_run_trains_on_an_environment_from_outside_vime(training_server, tiny_model_dir, tmp_path):
    run = TrainRun(tmp_path, tiny_model_dir, *engine_flags(training_server), "--rollout-env", "tests.envs.shout",
                   "--shout-bonus", "2", steps=2, groups=2, n=4)
    assert run.run_to_end() == 0, run.tail()
    run.assert_trained_exactly_once()
    with SampleStore.open(run.run_dir) as store:
        samples = [s for _, s in store.iter_samples(run.run_id)]
    assert samples and all(s.metadata["env"] == "shout" and 0 <= s.reward <= 2 for s in samples)
