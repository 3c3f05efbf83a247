"""The real sidecar server with one test hook: a deliberately stale push.

    <vllm-venv>/bin/python tests/stale_sidecar_server.py <sidecar_server.py's arguments>

While the file named by $DYNAMO_TEST_STALE_FILE lists this sidecar's CUDA_VISIBLE_DEVICES, a
reload is skipped: the sidecar confirms the pushed version but keeps serving its old weights,
what vLLM issue 32718 reports `reload_weights` doing. Everything else is the real server.
Runs in the vLLM venv, like the server itself.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dynamo_jax" / "rollout"))
import sidecar_server  # noqa: E402

_reload = sidecar_server.Sidecar.reload


def reload(self, path: str) -> None:
    flag = os.environ.get("DYNAMO_TEST_STALE_FILE", "")
    stale = Path(flag).read_text().split() if flag and os.path.exists(flag) else []
    if os.environ.get("CUDA_VISIBLE_DEVICES") in stale:
        sidecar_server.log(f"test hook: reload of {path} skipped")
        return
    _reload(self, path)


sidecar_server.Sidecar.reload = reload

if __name__ == "__main__":
    sidecar_server.main()
