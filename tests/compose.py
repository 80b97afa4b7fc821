"""docker-compose.yml as the tests read it: the file with deploy/vime.env's values filled in, as
Compose fills them, and each service's command as its container's shell runs it.

`load()` does Compose's own interpolation (`${VAR}`, `${VAR:-default}`, `${VAR:?error}`, `$$`),
YAML anchors and merge keys, and normalizes the forms Compose accepts two ways (`environment` as a
list or a mapping, `depends_on` as a list or with conditions), so the tests read one shape whether
or not `docker-compose` is installed. `validate()` is the check of the file itself: `docker-compose
config` when the binary is there (scripts/setup.sh installs it, the CI machines have it), else the
Compose specification's JSON schema (tests/data/compose_spec.json, the one docker-compose 1.29 ships)
over the interpolated file (jsonschema comes with vLLM).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
COMPOSE_FILE = REPO / "docker-compose.yml"
ENV_FILE = REPO / "deploy" / "vime.env"
SCHEMA = Path(__file__).resolve().parent / "data" / "compose_spec.json"

_VARIABLE = re.compile(r"\$(?:(?P<dollar>\$)|\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}|(?P<bare>\w+))")


def env_file(path: Path = ENV_FILE) -> dict[str, str]:
    """`KEY=VALUE` lines, as Compose's `--env-file` reads them (no quoting in vime.env)."""
    lines = [line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def interpolate(text: str, env: dict[str, str]) -> str:
    """`text` with Compose's variables filled from `env`; `$$` becomes the `$` the container sees."""
    def fill(m: re.Match) -> str:
        if m["dollar"]:
            return "$"
        name = m["name"] or m["bare"]
        value, op = env.get(name), m["op"] or ""
        if op.endswith("?") and (value is None or (op == ":?" and value == "")):
            raise ValueError(f"docker-compose.yml needs {name}: {m['arg']}")
        if op.endswith("-") and (value is None or (op == ":-" and value == "")):
            return m["arg"]
        return value or ""
    return _VARIABLE.sub(fill, text)


def _walk(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [_walk(item, env) for item in node]
    if isinstance(node, dict):
        return {key: _walk(value, env) for key, value in node.items()}
    return node


def normalized(service: dict) -> dict:
    """`service` with `environment` as a mapping and `depends_on` with its conditions."""
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment)
    depends_on = service.get("depends_on") or {}
    if isinstance(depends_on, list):
        depends_on = {name: {"condition": "service_started"} for name in depends_on}
    return {**service, "environment": {k: "" if v is None else str(v) for k, v in environment.items()},
            "depends_on": depends_on}


def interpolated(env: dict[str, str] | None = None) -> dict:
    """docker-compose.yml with `env` (default: deploy/vime.env) filled in, as Compose validates it."""
    return _walk(yaml.safe_load(COMPOSE_FILE.read_text()), env_file() if env is None else env)


def load(env: dict[str, str] | None = None) -> dict:
    """`interpolated(env)` without its `x-` fields, each service `normalized`."""
    config = {key: value for key, value in interpolated(env).items() if not key.startswith("x-")}
    config["services"] = {name: normalized(service) for name, service in config["services"].items()}
    return config


def validate() -> str:
    """Fail unless Compose accepts the file with deploy/vime.env; returns which check ran."""
    binary = shutil.which("docker-compose")
    if binary:
        done = subprocess.run([binary, "--env-file", str(ENV_FILE), "--profile", "tools", "config", "--quiet"],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"docker-compose config rejects docker-compose.yml:\n{done.stderr}"
        return "docker-compose config"
    errors = schema_errors(interpolated())
    assert not errors, "docker-compose.yml breaks the Compose schema:\n" + "\n".join(errors)
    return "the Compose schema"


def schema_errors(config: dict) -> list[str]:
    """What the Compose specification's JSON schema finds wrong with an interpolated file."""
    import jsonschema

    validator = jsonschema.Draft201909Validator(json.loads(SCHEMA.read_text()))
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(config)]


def docker_compose_config() -> dict | None:
    """What `docker-compose config` makes of the file (None without the binary), `$$` unescaped."""
    binary = shutil.which("docker-compose")
    if not binary:
        return None
    done = subprocess.run([binary, "--env-file", str(ENV_FILE), "--profile", "tools", "config"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=True)
    return _walk(yaml.safe_load(done.stdout), {})  # only `$$` occurs in its output: back to `$`


@dataclass(frozen=True)
class Command:
    """A service's command: `argv` as the container starts it, `words` as its shell would run it."""

    argv: list[str]
    words: list[str]

    def flags_of(self, program: str) -> list[str]:
        """The words after `program` (e.g. `workers.trainer`), up to a shell `&&`, `>` or `|`."""
        rest = self.words[self.words.index(program) + 1:]
        stop = next((i for i, word in enumerate(rest) if word in ("&&", ">", "|", "||", ";")), len(rest))
        return rest[:stop]


def command(service: dict) -> Command:
    """`service`'s command; an `sh -c` script's variables come from the service's environment,
    split into words as the shell splits an unquoted `$VAR`."""
    given = service["command"]
    argv = list(given) if isinstance(given, list) else shlex.split(given)
    if argv[:2] != ["sh", "-c"]:
        return Command(argv, argv)
    env = service["environment"]
    script = re.sub(r"\$(\w+)", lambda m: env[m.group(1)], argv[2].replace(";", " ; "))
    return Command(argv, shlex.split(script))
