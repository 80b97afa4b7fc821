"""W&B with slime's flags (`--use-wandb`, `--wandb-project`, `--wandb-group`, `--wandb-run-id`, ...),
tested offline (`WANDB_MODE=offline`: no network): the offline run files W&B writes are read back
record by record. A resumed vime run continues the same W&B run and W&B gets each line once."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

from vime.config.args import parse_args
from vime.metrics.wandb_sink import STATE_FILE, WandbConfig
from vime.metrics_log import METRICS_FILE, MetricsLog, read_metrics, run_sinks

import wandb  # noqa: E402  (vime[wandb]; the test extra has it)
from wandb.proto import wandb_internal_pb2  # noqa: E402

LEVELDB_BLOCK = 32768
WANDB_HOMES = ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR")
"""Where W&B keeps caches and settings: the test's folder, never the user's."""


def records(path: Path):
    """The records of an offline `.wandb` file (W&B's LevelDB-log framing: a 7-byte file header,
    then chunks of [crc 4][length 2][type 1] within 32 KiB blocks; type 1 whole, 2-4 pieces)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    pos, pieces = 7, b""
    while pos + 7 <= len(data):
        if LEVELDB_BLOCK - pos % LEVELDB_BLOCK < 7:  # a block's tail too short for a header is padding
            pos += LEVELDB_BLOCK - pos % LEVELDB_BLOCK
            continue
        length, kind = struct.unpack_from("<HB", data, pos + 4)
        if pos + 7 + length > len(data):  # the service is still writing this chunk
            return
        pieces += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            pieces = b""
            yield record


def offline_runs(wandb_dir: Path, timeout: float = 30.0) -> list[dict]:
    """Each offline run directory's run record, config and history rows, oldest first, once every
    run's file ends with its exit record (W&B's service writes the file after `finish()` returns)."""
    deadline = time.monotonic() + timeout
    while True:
        runs = _read_offline_runs(wandb_dir)
        if all(run.get("exited") for run in runs):
            return runs
        assert time.monotonic() < deadline, f"an offline run never wrote its exit record: {runs}"
        time.sleep(0.2)


def _read_offline_runs(wandb_dir: Path) -> list[dict]:
    runs = []
    for run_dir in sorted((wandb_dir / "wandb").glob("offline-run-*")):
        run = {"rows": [], "config": {}}
        for record in records(next(run_dir.glob("run-*.wandb"))):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                r = record.run
                run.update(id=r.run_id, project=r.project, group=r.run_group, entity=r.entity, name=r.display_name)
                run["config"].update({item.key: json.loads(item.value_json) for item in r.config.update})
            elif kind == "config":
                run["config"].update({item.key: json.loads(item.value_json) for item in record.config.update})
            elif kind == "exit":
                run["exited"] = True
            elif kind == "history":
                row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
                run["rows"].append({k: v for k, v in row.items() if not k.startswith("_")} | {"_step": row["_step"]})
        runs.append(run)
    return runs


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """W&B offline, its caches and settings in the test's folder, silent."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in WANDB_HOMES:
        monkeypatch.setenv(name, str(tmp_path / "wandb-home"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    yield
    wandb.teardown()


def run_args(tmp_path, *flags):
    return parse_args(["--run-id", "exp-w", "--run-dir", str(tmp_path / "run"), *flags])


def test_a_run_logs_each_line_to_one_wandb_run_offline_and_a_relaunch_continues_it_once(tmp_path, offline):
    """Launch 1 writes steps 0-1, then dies after step 2 reached metrics.jsonl but not W&B. Launch 2
    (a new log, as a relaunched worker opens it) is asked for steps 2-3: W&B's run of the same id
    gets step 2 from the file, then 3. Across the two offline directories: every step once."""
    args = run_args(tmp_path, "--use-wandb", "--wandb-project", "vime-tests", "--wandb-group", "sweep-1",
                    "--wandb-team", "lab", "--wandb-dir", str(tmp_path / "wandb-files"), "--wandb-key", "k" * 40)
    first = MetricsLog(args.run_dir, run_sinks(args))
    for step in (0, 1):
        first.write(step, {"loss": step / 10, "reward_mean": step / 4, "sync_seconds": 0.5, "finished_at": 1.8e9})
    first.close()
    with open(Path(args.run_dir) / METRICS_FILE, "a") as f:
        f.write(json.dumps({"loss": 0.2, "reward_mean": 0.5, "step": 2}) + "\n")

    second = MetricsLog(args.run_dir, run_sinks(args))
    assert [second.write(step, {"loss": step / 10, "reward_mean": step / 4}) for step in (2, 3)] == [False, True]
    second.close()

    launches = offline_runs(tmp_path / "wandb-files")
    assert len(launches) == 2
    run_id = json.loads((Path(args.run_dir) / STATE_FILE).read_text())["id"]
    for launch in launches:
        assert (launch["id"], launch["project"], launch["group"], launch["entity"], launch["name"]) == (
            run_id, args.wandb_project, args.wandb_group, args.wandb_team, args.run_id)
    assert [[row["_step"] for row in launch["rows"]] for launch in launches] == [[0, 1], [2, 3]]
    rows = [row for launch in launches for row in launch["rows"]]
    assert rows[0] == {"train/loss": 0.0, "rollout/reward_mean": 0.0, "sync/seconds": 0.5, "_step": 0}
    assert [row["train/loss"] for row in rows] == [0.0, 0.1, 0.2, 0.3]
    assert [m["step"] for m in read_metrics(args.run_dir)] == [0, 1, 2, 3]
    config = launches[0]["config"]
    assert config["run_id"] == "exp-w" and config["use_wandb"] is True
    assert "wandb_key" not in config and "k" * 40 not in json.dumps(config), "the key is no config value"


def test_wandb_run_id_names_the_run_and_the_run_s_settings_are_its_own(tmp_path, offline):
    """`--wandb-run-id` is the W&B run's id; `--wandb-mode`, `--wandb-key` and `--wandb-host` go to
    that run's settings, never the process's (a worker serving several runs)."""
    args = run_args(tmp_path, "--use-wandb", "--wandb-dir", str(tmp_path / "wandb-files"),
                    "--wandb-run-id", "given01", "--wandb-mode", "offline")
    log = MetricsLog(args.run_dir, run_sinks(args))
    log.write(0, {"loss": 1.0})
    log.close()
    assert [launch["id"] for launch in offline_runs(tmp_path / "wandb-files")] == ["given01"]

    online = WandbConfig.from_args(run_args(tmp_path, "--use-wandb", "--wandb-mode", "online", "--wandb-key", "k" * 40,
                                            "--wandb-host", "https://wandb.example.test"))
    assert online.settings() == {"console": "off", "save_code": False, "disable_git": True, "mode": "online",
                                 "api_key": "k" * 40, "base_url": "https://wandb.example.test"}


def test_use_wandb_without_the_package_is_one_line_before_anything_starts(tmp_path, monkeypatch):
    import importlib.util

    from vime.config.preflight import check_metrics
    from vime.errors import ConfigError

    check_metrics(run_args(tmp_path, "--use-wandb"))  # installed here (the test extra)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"--use-wandb: the wandb package is not installed: pip install 'vime\[wandb\]'"):
        check_metrics(run_args(tmp_path, "--use-wandb"))
    check_metrics(run_args(tmp_path))  # no W&B asked for, nothing needed


@pytest.mark.parametrize("given", [["--wandb-key", "k" * 40], ["--wandb-key=" + "k" * 40]], ids=["spaced", "equals"])
def test_the_wandb_key_stays_out_of_the_runs_recorded_flags_and_reaches_the_workers_as_its_variable(tmp_path, given):
    """The run's flags go to the store and into the workflow's input, which the Web UI, `temporal
    workflow show` and `vime config` print: the key is in none of them. `vime train`'s workers get
    it as WANDB_API_KEY, which W&B reads when no key is given."""
    from vime.config.run_input import secret_env, to_json, training_config, workflow_input

    args = run_args(tmp_path, "--use-wandb", *given)
    assert args.wandb_key == "k" * 40
    assert "k" * 40 not in json.dumps(training_config(args).run_argv)
    assert "k" * 40 not in to_json(workflow_input(args))
    assert secret_env(args) == {"WANDB_API_KEY": "k" * 40}
    assert secret_env(run_args(tmp_path, "--use-wandb")) == {}
