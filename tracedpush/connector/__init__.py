"""Drop-in traced NIXL connectors for vLLM.

Load them by adding one key to an existing NIXL `--kv-transfer-config`:
    "kv_connector_module_path": "tracedpush.connector"
and keep `"kv_connector"` as it was (`NixlPushConnector`, `NixlPullConnector` or
`NixlConnector`): the classes here carry the same names, so vLLM's own checks on the
connector name still apply. Settings: `kv_connector_extra_config["tracedpush"]`
(see `config.py`) and the standard `OTEL_*` variables.

Importing this module needs vLLM but neither NIXL nor a GPU (vLLM's API server imports
the class for its metrics without instantiating it). The vLLM version is checked here.
"""

from __future__ import annotations

import vllm

from tracedpush.connector.version import check_vllm_version

check_vllm_version(vllm.__version__)

from tracedpush.connector.pull import NixlConnector, NixlPullConnector  # noqa: E402
from tracedpush.connector.push import NixlPushConnector  # noqa: E402

__all__ = ["NixlConnector", "NixlPullConnector", "NixlPushConnector"]
