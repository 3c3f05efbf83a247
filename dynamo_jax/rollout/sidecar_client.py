"""`VLLMSidecarEngine`: the trainer's side of the vLLM sidecar (a `RolloutEngine`).

It starts `sidecar_server.py` with the vLLM venv's python in its own process group, hands it a
per-run secret on a pipe that stays open (the sidecar's parent-death watchdog), waits for health,
and then speaks wire.py's protocol over a Unix socket in a private temporary directory, one
connection per call, each with a timeout.

Faults: a call that loses its connection or gets no reply within its timeout kills the sidecar's
process group, starts a new one, re-pushes (and re-verifies) the current weights and retries the
call, up to `max_restarts` times within any `restart_window_s` (a long run may ride out a few
faults a day; a sidecar that keeps dying stops the run). An error the sidecar reports (bad
request, vLLM exception) is raised as `SidecarError` without a restart: retrying would fail the
same way.

Weights: `load_push` reloads a pushed directory (weight_push.py) and then verifies it: the
sidecar reads a few named tensors back from its engine and their digests must equal those of the
pushed file, or the push is a `SidecarError` naming this sidecar and the tensor. A fleet of
sidecars shares one pushed directory per host (rollout/process_split.py); `update_weights` and
`push_hf_tensors` push to this sidecar alone.

No orphans: `close()` (also run by a `weakref.finalize` at interpreter exit and on garbage
collection) asks for a shutdown and then kills the process group; if the trainer dies without
running any Python (SIGKILL, a native crash) the pipe closes and the sidecar kills itself. No
signal handlers are installed: a library must not replace the trainer's, and the pipe already
covers every way the trainer can end.
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dynamo_jax.errors import ConfigError, SidecarError
from dynamo_jax.rollout import tempdirs, weight_push, wire
from dynamo_jax.rollout.protocol import Completion, Request, SamplingParams

log = logging.getLogger(__name__)
_monotonic = time.monotonic  # the restart window's clock (a test replaces it)
SERVER_SCRIPT = Path(__file__).with_name("sidecar_server.py")
LOG_FILE_NAME = "vllm_sidecar.log"


@dataclasses.dataclass(frozen=True)
class SidecarConfig:
    """How to run the vLLM sidecar. `python` is the vLLM venv's interpreter."""

    python: str
    model_path: str  # HF checkpoint dir (config.json + safetensors) vLLM starts from
    dtype: str = "bfloat16"  # vLLM's dtype, and the dtype weights are pushed in
    max_model_len: int = 4096
    seed: int = 0
    enforce_eager: bool = False  # True skips CUDA graphs / compilation: faster start, slower decode
    gpu_memory_utilization: float = 0.5  # share of the GPU vLLM may take (colocated default)
    cpu_kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE on CPU builds
    max_num_seqs: int = 256
    startup_timeout_s: float = 600.0
    call_timeout_s: float = 600.0  # per call: the bound before a call of its kind has been timed
    # Once a kind of call (generate, update_weights, ...) has answered, a hung sidecar is noticed
    # within max(call_timeout_floor_s, call_timeout_factor x the last answer of that kind),
    # capped at call_timeout_s: a generate that takes seconds is not waited on for 10 minutes.
    call_timeout_factor: float = 10.0
    call_timeout_floor_s: float = 30.0
    max_restarts: int = 3  # restarts allowed within any restart_window_s
    restart_window_s: float = 3600.0
    tensor_parallel: int = 1  # vLLM's tensor_parallel_size: the devices of extra_env's group
    sleep_level: int = 0  # vLLM sleep mode between generates (0 off, 1, 2; GPU only)
    shm_dir: str = "/dev/shm"  # where pushed weights are written (RAM-backed)
    extra_env: tuple[tuple[str, str], ...] = ()  # e.g. (("CUDA_VISIBLE_DEVICES", "1"),)

    def __post_init__(self):
        for name in ("max_model_len", "max_num_seqs", "cpu_kv_cache_gib", "tensor_parallel"):
            if getattr(self, name) < 1:
                raise ValueError(f"SidecarConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.sleep_level not in (0, 1, 2):
            raise ValueError(f"SidecarConfig.sleep_level must be 0, 1 or 2, got {self.sleep_level}")
        names = ("startup_timeout_s", "call_timeout_s", "restart_window_s")
        for name in (*names, "call_timeout_factor", "call_timeout_floor_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SidecarConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.max_restarts < 0:
            raise ValueError(f"SidecarConfig.max_restarts must be >= 0, got {self.max_restarts}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"SidecarConfig.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(
                f"SidecarConfig.dtype must be float32|bfloat16|float16, got {self.dtype!r}"
            )
        if not Path(self.python).is_file():
            raise ConfigError(
                f"rollout.sidecar_python: no interpreter at {self.python!r} (create the vLLM "
                "venv: bash scripts/make_vllm_venv.sh .venv-vllm)"
            )
        if not (Path(self.model_path) / "config.json").is_file():
            raise ConfigError(f"init.checkpoint: no config.json in {self.model_path!r}")
        if not Path(self.shm_dir).is_dir():
            raise ValueError(f"SidecarConfig.shm_dir: {self.shm_dir!r} is not a directory")
        object.__setattr__(self, "extra_env", tuple((str(k), str(v)) for k, v in self.extra_env))

    def llm_kwargs(self) -> dict:
        kwargs = {
            "model": str(Path(self.model_path).resolve()),
            "dtype": self.dtype,
            "max_model_len": self.max_model_len,
            "seed": self.seed,
            "enforce_eager": self.enforce_eager,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "max_num_seqs": self.max_num_seqs,
            "tensor_parallel_size": self.tensor_parallel,
        }
        if self.sleep_level:
            kwargs["enable_sleep_mode"] = True  # refused by vLLM on CPU
        return kwargs

    @property
    def devices(self) -> str | None:
        """The device group this sidecar runs on (its CUDA_VISIBLE_DEVICES), if set."""
        return dict(self.extra_env).get("CUDA_VISIBLE_DEVICES")


class SidecarStartError(SidecarError):
    """The sidecar did not become healthy; the message names its log file."""


class SidecarUnavailable(ConnectionError):
    """No answer: connection lost or timed out. Triggers a restart."""


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(cannot read {path}: {e})"


@dataclasses.dataclass
class _Process:
    """One running sidecar: its Popen, socket and secret. Mutable; owned by the engine."""

    popen: subprocess.Popen
    socket_path: str
    secret: str
    log_path: Path

    def call(self, message: dict, timeout_s: float) -> dict:
        """One request on a fresh authenticated connection; raises SidecarUnavailable on transport faults."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(timeout_s)
                sock.connect(self.socket_path)
                wire.send_frame(sock, {"op": "hello", "secret": self.secret})
                hello = wire.recv_frame(sock)
                if not hello.get("ok"):
                    raise SidecarError(f"sidecar refused the connection: {hello.get('error')}")
                wire.send_frame(sock, message)
                reply = wire.recv_frame(sock)
        except TimeoutError as e:
            raise SidecarUnavailable(
                f"no reply to {message['op']!r} within {timeout_s} s (hung?)"
            ) from e
        except (OSError, wire.WireError) as e:
            status = self.popen.poll()
            state = "running" if status is None else f"exited with code {status}"
            raise SidecarUnavailable(f"{message['op']!r} failed: {e} (sidecar {state})") from e
        if not reply.get("ok"):
            raise SidecarError(
                f"sidecar {message['op']} failed: {reply.get('error')} (log: {self.log_path})"
            )
        return reply

    def kill(self) -> None:
        _kill_group(self.popen)


def _kill_group(popen: subprocess.Popen | None) -> None:
    if popen is None:
        return
    try:
        os.killpg(popen.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        popen.wait(timeout=30)
    except subprocess.TimeoutExpired:
        log.error("sidecar pid %d survived SIGKILL for 30 s", popen.pid)
    if popen.stdin is not None:
        try:
            popen.stdin.close()
        except OSError:
            pass


def _private_tmp_env(env: dict, private_dir: str) -> dict:
    """TMPDIR inside the engine's private dir, which `close` removes: vLLM leaves a rendezvous
    file (`vllm_dist_<uuid>`) in the temp dir of every engine it starts and never deletes it.
    Torch's compile cache keeps its usual place, so restarts still find compiled kernels."""
    tmp_dir = os.path.join(private_dir, "tmp")
    os.makedirs(tmp_dir, mode=0o700, exist_ok=True)
    inductor_cache = env.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}"
    )
    return {"TMPDIR": tmp_dir, "TORCHINDUCTOR_CACHE_DIR": inductor_cache}


def spawn(config: SidecarConfig, log_path: Path, socket_path: str) -> _Process:
    """Start a sidecar without waiting for it (the engine waits for health)."""
    secret = secrets.token_hex(32)
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": str(config.cpu_kv_cache_gib),
        **dict(config.extra_env),
    }
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    env.update(_private_tmp_env(env, os.path.dirname(socket_path)))
    env.pop("PYTHONPATH", None)  # the trainer's paths must not leak into the vLLM venv
    command = [
        config.python, str(SERVER_SCRIPT), "--socket", socket_path,
        "--llm-json", json.dumps(config.llm_kwargs()), "--parent-pid", str(os.getpid()),
        "--sleep-level", str(config.sleep_level),
    ]  # fmt: skip
    with open(log_path, "ab") as log_file:
        popen = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=log_file, stderr=subprocess.STDOUT,
            env=env, start_new_session=True,  # its own group: one killpg takes vLLM's children too
        )  # fmt: skip
    try:
        popen.stdin.write(secret.encode() + b"\n")  # a pipe, not argv/env: invisible to `ps`
        popen.stdin.flush()
    except BrokenPipeError:
        pass  # it died at once; wait_healthy reports its exit code and log
    return _Process(popen, socket_path, secret, log_path)


def _log_lines(path) -> str:
    tail = log_tail(path).strip()
    return f"its log is {path}. Last lines:\n{tail}" if tail else f"its log {path} is empty"


def wait_healthy(process: _Process, timeout_s: float) -> dict:
    """Poll health until it answers; SidecarStartError naming the log file otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = process.popen.poll()
        if status is not None:
            raise SidecarStartError(
                f"the vLLM sidecar exited with code {status} before becoming healthy; "
                + _log_lines(process.log_path)
            )
        if time.monotonic() > deadline:
            process.kill()
            raise SidecarStartError(
                f"the vLLM sidecar was not healthy after {timeout_s} s and was killed; "
                + _log_lines(process.log_path)
            )
        if os.path.exists(process.socket_path):
            try:
                return process.call(
                    {"op": "health"}, timeout_s=max(1.0, deadline - time.monotonic())
                )
            except SidecarUnavailable:
                pass
        time.sleep(0.2)


@dataclasses.dataclass
class _Resources:
    """Everything `close` must release; shared with the finalizer, which must not hold the engine."""

    process: _Process | None = None
    socket_dir: str = ""
    workdir: str = ""  # where socket_dir is recorded (rollout/tempdirs.py)
    # Pushes this engine made itself (a fleet's shared push is the fleet's to delete).
    push_dirs: list[Path] = dataclasses.field(default_factory=list)


def _release(res: _Resources, graceful: bool) -> None:
    if res.process is not None:
        if graceful and res.process.popen.poll() is None:
            try:
                res.process.call({"op": "shutdown"}, timeout_s=10.0)
                res.process.popen.wait(timeout=10.0)
            except (SidecarError, SidecarUnavailable, subprocess.TimeoutExpired):
                pass
        res.process.kill()
        res.process = None
    for path in (*res.push_dirs, res.socket_dir):
        if path:
            shutil.rmtree(path, ignore_errors=True)
    if res.socket_dir and res.workdir:
        tempdirs.forget(res.workdir, res.socket_dir)
    res.push_dirs, res.socket_dir = [], ""


class VLLMSidecarEngine:
    """A `RolloutEngine` whose rollouts come from vLLM in a separate process.

    `model_cfg` is the models package's config of the trainer's parameter tree; it is what
    `hf_io.to_hf_tensors` needs to name the pushed tensors. Weight version 0 is the checkpoint
    at `config.model_path` the sidecar starts from. `label` names this sidecar in errors (a
    fleet has several); its output goes to `workdir/log_name`.
    """

    def __init__(
        self,
        config: SidecarConfig,
        model_cfg: Any,
        workdir: str | os.PathLike,
        *,
        log_name: str = LOG_FILE_NAME,
        label: str = "the vLLM sidecar",
        push_tag: str | None = None,
    ):
        self.config = config
        self.model_cfg = model_cfg
        self.log_path = Path(workdir) / log_name
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.label = label
        self.push_tag = push_tag or weight_push.push_tag(workdir, 0)
        self.restarts = 0  # in the engine's life
        self._last_s: dict[str, float] = {}  # op → how long its last answer took: the timeouts
        self._restart_times: deque[float] = deque()  # monotonic times, within the window
        self.last_push: weight_push.PushTimings | None = None
        self._version = 0
        self._push: weight_push.PushDir | None = None  # what a restarted sidecar is re-given
        # Unix socket paths are limited to ~100 bytes, so the socket lives in a short private
        # (0700) temp dir rather than in the workdir; it is recorded there, so the next run of
        # this workdir removes it if this process dies without cleaning up (SIGKILL), and this
        # run removes what an earlier, dead one left.
        tempdirs.remove_stale(self.log_path.parent)
        self._res = _Resources(
            socket_dir=tempdirs.make(self.log_path.parent), workdir=str(self.log_path.parent)
        )
        self._finalizer = weakref.finalize(self, _release, self._res, False)
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"VLLMSidecarEngine({self.label}, log={self.log_path})"

    # -- RolloutEngine ---------------------------------------------------------------------
    @property
    def weight_version(self) -> int:
        return self._version

    def generate(self, requests: Sequence[Request], sampling: SamplingParams) -> list[Completion]:
        message = {
            "op": "generate",
            "requests": [
                {
                    "prompt_id": int(r.prompt_id),
                    "prompt_token_ids": list(r.prompt_token_ids),
                    "n": int(r.n),
                }
                for r in requests
            ],
            "sampling": dataclasses.asdict(sampling),
        }
        reply = self._call(message)
        if reply["weight_version"] != self._version:
            raise SidecarError(
                f"{self.label} generated with weight version {reply['weight_version']}, "
                f"expected {self._version} (log: {self.log_path})"
            )
        completions = []
        for request, samples in zip(requests, reply["results"], strict=True):
            for index, sample in enumerate(samples):
                completions.append(
                    Completion(
                        prompt_id=request.prompt_id,
                        sample_index=index,
                        token_ids=np.asarray(sample["token_ids"], np.int32),
                        logprobs=np.asarray(sample["logprobs"], np.float32),
                        finish_reason=sample["finish_reason"],
                        weight_version=reply["weight_version"],
                    )
                )
        return completions

    def update_weights(self, params: Any, version: int) -> None:
        """Export `params` (HF names, `config.dtype`) to shared memory, load and verify them.

        Multi-host: every process runs its own sidecars and must call this at the same time (the
        gather of sharded parameters is a collective); see rollout/process_split.py.
        """
        self.load_weights(self.export_weights(params, version))

    # -- the two halves of a call, for rollout/background.py (generation beside training) ------
    def generate_local(self, requests: Sequence[Request], sampling: SamplingParams) -> list:
        return self.generate(requests, sampling)

    def finish_generate(self, requests: Sequence[Request], local: list) -> list[Completion]:
        return local

    def export_weights(self, params: Any, version: int) -> weight_push.PushDir:
        """`update_weights`' export (reads `params`; collective on several processes): the
        pushed directory. Touches no sidecar state, so it
        may run while another thread waits on a generate."""
        if self.model_cfg is None:
            raise ValueError(
                "VLLMSidecarEngine was built with model_cfg=None: it can push HF tensors "
                "(push_hf_tensors) but not a parameter tree"
            )
        self._check_version(version)
        push = weight_push.export_push_dir(
            params, self.model_cfg, self.config.shm_dir, version, self.config.dtype, self.push_tag
        )
        return push

    def load_weights(self, push: weight_push.PushDir) -> None:
        """`update_weights`' reload of an `export_weights` directory, which this engine then
        owns (deleted once superseded)."""
        self._load_owned(push)

    def close(self) -> None:
        """Shut the sidecar down (kill its group if it does not exit) and free the pushed files."""
        if self._finalizer.detach() is not None:
            _release(self._res, graceful=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- pushes --------------------------------------------------------------------------------
    def push_hf_tensors(self, tensors: Mapping[str, np.ndarray], version: int) -> None:
        """Write HF-named host tensors to shared memory, load and verify them as `version`."""
        self._check_version(version)
        push = weight_push.write_push_dir(tensors, self.config.shm_dir, version, self.push_tag)
        self._load_owned(push)

    def _load_owned(self, push: weight_push.PushDir) -> None:
        self._res.push_dirs.append(push.directory)  # close() deletes it whatever happens next
        try:
            reload_s, verify_s = self.load_push(push)
        except BaseException:
            if self._push is not push:  # refused: the sidecar keeps (and restarts with) the last
                self._res.push_dirs.remove(push.directory)
                push.remove()
            raise
        self.last_push = weight_push.PushTimings(push.export_s, reload_s, push.nbytes, verify_s)
        for old in self._res.push_dirs[:-1]:
            shutil.rmtree(old, ignore_errors=True)
        self._res.push_dirs[:-1] = []

    def _check_version(self, version: int) -> None:
        if version < self._version:
            raise ValueError(f"weight version must not go back: {version} after {self._version}")

    def load_push(self, push: weight_push.PushDir) -> tuple[float, float]:
        """Reload `push` in the sidecar and verify it; returns (reload_s, verify_s).

        The caller owns `push` (deletes it once superseded); until then a restarted sidecar is
        re-given it. Raises SidecarError if the sidecar refuses it or does not serve it.
        """
        self._check_version(push.version)
        start = time.perf_counter()
        self._reload(push)
        self._push, self._version = push, push.version
        reload_s = time.perf_counter() - start
        start = time.perf_counter()
        self.verify()
        return reload_s, time.perf_counter() - start

    def _reload(self, push: weight_push.PushDir) -> None:
        message = {"op": "update_weights", "path": str(push.directory), "version": push.version}
        reply = self._call(message)
        if reply["weight_version"] != push.version:
            raise SidecarError(
                f"{self.label} confirmed weight version {reply['weight_version']}, pushed "
                f"{push.version} (log: {self.log_path})"
            )

    def verify(self) -> None:
        """Check that the engine serves the current push: the digests of the named tensors it
        reads back equal those of the pushed file. Raises SidecarError naming the tensor."""
        push = self._push
        if push is None:
            return  # weight version 0: the checkpoint vLLM itself started from
        reply = self._call({"op": "fingerprint", "names": push.check_names()})
        self._compare(push, reply)

    def _compare(self, push: weight_push.PushDir, reply: dict) -> None:
        weight_push.compare_fingerprints(push, reply, f"{self.label} (log: {self.log_path})")

    # -- process supervision ----------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        process = self._res.process
        return None if process is None else process.popen.pid

    def _start(self) -> None:
        """Start a sidecar, wait for health, and give it the current weights (verified)."""
        socket_path = os.path.join(self._res.socket_dir, "sock")
        if os.path.exists(socket_path):
            os.unlink(socket_path)
        self._res.process = spawn(self.config, self.log_path, socket_path)
        wait_healthy(self._res.process, self.config.startup_timeout_s)
        push = self._push
        if push is not None:
            message = {"op": "update_weights", "path": str(push.directory), "version": push.version}
            self._res.process.call(message, self.config.call_timeout_s)
            message = {"op": "fingerprint", "names": push.check_names()}
            self._compare(push, self._res.process.call(message, self.config.call_timeout_s))

    def _restart(self, reason: str) -> None:
        window, limit = self.config.restart_window_s, self.config.max_restarts
        while True:
            now = _monotonic()
            while self._restart_times and now - self._restart_times[0] >= window:
                self._restart_times.popleft()
            if len(self._restart_times) >= limit:
                raise SidecarError(
                    f"{self.label} failed ({reason}) after {limit} restarts within "
                    f"{window:g} s (max_restarts per restart_window_s); its log is {self.log_path}"
                )
            self._restart_times.append(now)
            self.restarts += 1
            log.warning("restarting %s (%d in the last %g s): %s", self.label,
                        len(self._restart_times), window, reason)  # fmt: skip
            self._res.process.kill()
            try:
                self._start()
                return
            except SidecarUnavailable as e:
                reason = str(e)

    def call_timeout_s(self, op: str) -> float:
        """How long a call of kind `op` may go unanswered before the sidecar counts as hung:
        `call_timeout_s` until one has answered, then scaled from the last answer (not the
        slowest: the first call of a kind carries vLLM's one-time warm-up)."""
        config = self.config
        if op not in self._last_s:
            return config.call_timeout_s
        scaled = max(config.call_timeout_floor_s, config.call_timeout_factor * self._last_s[op])
        return min(config.call_timeout_s, scaled)

    def _call(self, message: dict) -> dict:
        if self._res.process is None:
            raise SidecarError(f"{self.label}: the sidecar engine is closed")
        op = message["op"]
        while True:
            timeout_s = self.call_timeout_s(op)
            began = time.monotonic()
            try:
                reply = self._res.process.call(message, timeout_s)
            except SidecarUnavailable as e:
                if op in self._last_s and "within" in str(e):
                    # Unanswered within its scaled bound: the retry on the fresh sidecar gets
                    # twice as long, in case the call was slow rather than the sidecar hung.
                    self._last_s[op] *= 2
                self._restart(str(e))
                continue
            self._last_s[op] = time.monotonic() - began
            return reply
