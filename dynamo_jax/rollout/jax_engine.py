"""The embedded rollout engine: batched prefill + jitted KV-cache decode + on-device sampling.

One `generate` call:
1. expands the requests into rows (one per sample) in a canonical order and splits them into
   batches of at most `max_batch` rows (`buckets.py`);
2. per batch, left-pads the batch's distinct prompts to a power-of-two length bucket and runs
   one jitted *prefill program*: empty cache, one forward per distinct prompt (the n samples of
   a prompt share it: the prompt's cache and last logits are copied to its n rows), token 0
   sampled per row;
3. runs a jitted *decode program* — a `lax.while_loop` of decode steps that exits as soon as
   every row has finished or a chunk of `decode_chunk` steps is done — from a host loop; between
   chunks, when at most half the rows are still running, a jitted *compact program* gathers the
   live rows (cache included) into the next smaller batch bucket, so finished sequences stop
   costing compute;
4. returns completions grouped by request in request order, then by sample index.

Programs are keyed only by bucketed shapes (batch, prompt length, generation length, number of
stop ids: powers of two with floors) and three sampling switches (greedy, top-k on, top-p on);
temperature, top-k, top-p, max new tokens, seed and the stop ids themselves are traced values. The number of
compilations is therefore bounded and exposed as `num_compilations` (counted when a program is
traced, which for `jax.jit` happens exactly when it compiles a new variant).

Parameters are passed to every program as arguments, never captured, so the engine shares the
trainer's arrays: `update_weights` swaps a reference. On a mesh the batch inputs are placed with
the `act_batch` rule's sharding and XLA propagates the parameters' own shardings through the
programs.

Multi-process meshes (devices of several `jax.distributed` processes): every process calls
`generate` with the same requests (the training loop's host work is identical everywhere), so
each builds the same host arrays and turns them into global arrays filling only its own shards
(`multihost.global_from_host`); scalars and index vectors become replicated global arrays.
Outputs are batch-sharded, so the host checks between chunks and the final harvest all-gather
them (`multihost.host_copy`): every process returns the same completions.

Shape letters (docs/design.md#shape-letters): B batch rows, U distinct prompts of a batch, P
padded prompt length, T generation-length bucket, V vocabulary, Y stop-id slots.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from dynamo_jax.models.config import ModelConfig
from dynamo_jax.models.decode import KVCache, decode_step, init_cache, prefill
from dynamo_jax.models.qwen import unrolled_layers
from dynamo_jax.rollout import buckets, sampling
from dynamo_jax.rollout.config import JaxEngineConfig
from dynamo_jax.rollout.protocol import Completion, Request, SamplingParams
from dynamo_jax.sharding import multihost

_DEFAULT_CONFIG = JaxEngineConfig()


class _Knobs(NamedTuple):
    """Traced sampling values: changing them never recompiles."""

    temperature: jax.Array  # float32 scalar (ignored when greedy)
    top_k: jax.Array  # int32 scalar
    top_p: jax.Array  # float32 scalar
    max_new: jax.Array  # int32 scalar
    stop_ids_Y: jax.Array  # int32 [Y], padded with -1


class _State(NamedTuple):
    """Everything a batch carries between programs; batch is axis 0."""

    cache: KVCache
    keys_B: jax.Array  # per-row PRNG keys
    last_B: jax.Array  # int32, the token to feed next
    tokens_BxT: jax.Array  # int32 generated tokens
    logprobs_BxT: jax.Array  # float32
    length_B: jax.Array  # int32 tokens generated so far
    done_B: jax.Array  # bool
    stopped_B: jax.Array  # bool, finished by a stop token
    step: jax.Array  # int32 scalar, index of the next token to generate


@dataclasses.dataclass(frozen=True)
class _Mode:
    """The static part of a program (hashable)."""

    cfg: ModelConfig
    greedy: bool
    use_top_k: bool
    use_top_p: bool


def _emit(state: _State, logits_BxV: jax.Array, knobs: _Knobs, mode: _Mode) -> _State:
    """Sample token `state.step` for every running row and record it."""
    keys = sampling.step_keys(state.keys_B, state.step)
    tok_B, logp_B = sampling.sample_tokens(
        logits_BxV,
        keys,
        knobs.temperature,
        knobs.top_k,
        knobs.top_p,
        greedy=mode.greedy,
        use_top_k=mode.use_top_k,
        use_top_p=mode.use_top_p,
    )
    running_B = ~state.done_B
    col = state.step
    tokens = state.tokens_BxT.at[:, col].set(jnp.where(running_B, tok_B, 0))
    logprobs = state.logprobs_BxT.at[:, col].set(jnp.where(running_B, logp_B, 0.0))
    hit_stop_B = running_B & jnp.any(tok_B[:, None] == knobs.stop_ids_Y[None, :], axis=-1)
    length_B = state.length_B + running_B.astype(jnp.int32)
    done_B = state.done_B | hit_stop_B | (col + 1 >= knobs.max_new)
    return state._replace(
        last_B=jnp.where(running_B, tok_B, state.last_B),
        tokens_BxT=tokens,
        logprobs_BxT=logprobs,
        length_B=length_B,
        done_B=done_B,
        stopped_B=state.stopped_B | hit_stop_B,
        step=state.step + 1,
    )


def _prefill_program(
    params,
    tokens_UxP,
    mask_UxP,
    prompt_of_row_B,
    real_B,
    keys_B,
    knobs,
    *,
    mode,
    gen_len,
    cache_dtype,
):
    """Empty cache → forward of each distinct prompt once → its cache and last logits copied to
    every row that samples from it (`prompt_of_row_B`) → token 0 per row, each with its own key.
    Filler rows (real_B false) start finished."""
    n_prompts, prompt_len = tokens_UxP.shape
    batch = prompt_of_row_B.shape[0]
    cache = init_cache(mode.cfg, n_prompts, prompt_len + gen_len, cache_dtype)
    logits_UxV, cache = prefill(params, mode.cfg, tokens_UxP, mask_UxP, cache)
    logits_BxV = jnp.take(logits_UxV, prompt_of_row_B, axis=0)
    state = _State(
        cache=_take_cache_rows(cache, prompt_of_row_B),
        keys_B=keys_B,
        last_B=jnp.zeros((batch,), jnp.int32),
        tokens_BxT=jnp.zeros((batch, gen_len), jnp.int32),
        logprobs_BxT=jnp.zeros((batch, gen_len), jnp.float32),
        length_B=jnp.zeros((batch,), jnp.int32),
        done_B=~real_B,
        stopped_B=jnp.zeros((batch,), bool),
        step=jnp.zeros((), jnp.int32),
    )
    return _emit(state, logits_BxV, knobs, mode)


def _laid_out(params: Any, shardings: Any) -> bool:
    """Whether every array of `params` already has its sharding in `shardings` (the trainer's
    arrays pushed to an engine on the trainer's mesh). `device_put` would return them unchanged,
    but at ~30 microseconds a leaf it cost 8 ms a push for SmolLM2's 272 leaves."""
    leaves, shardings = jax.tree.leaves(params), jax.tree.leaves(shardings)
    return len(leaves) == len(shardings) and all(
        isinstance(x, jax.Array) and x.sharding == s for x, s in zip(leaves, shardings)
    )


def _take_cache_rows(cache: KVCache, rows_b: jax.Array) -> KVCache:
    """The cache of rows `rows_b` (repeats allowed); batch is axis 0 of every array."""
    take0 = lambda x: jnp.take(x, rows_b, axis=0)
    return cache._replace(
        k=tuple(take0(k) for k in cache.k),
        v=tuple(take0(v) for v in cache.v),
        valid_BxS=jnp.take(cache.valid_BxS, rows_b, axis=0),
        next_pos_B=jnp.take(cache.next_pos_B, rows_b, axis=0),
    )


def _decode_program(params, state, knobs, until, *, mode):
    """Decode steps until step == until or every row is done (early exit)."""
    # Scanned layers' weights are sliced out of the stack once per call, not once per token.
    params, cfg = unrolled_layers(params, mode.cfg)

    def cond(s: _State):
        return (s.step < until) & ~jnp.all(s.done_B)

    def body(s: _State):
        logits_BxV, cache = decode_step(params, cfg, s.last_B, s.cache)
        return _emit(s._replace(cache=cache), logits_BxV, knobs, mode)

    return jax.lax.while_loop(cond, body, state)


def _compact_program(state: _State, rows_b: jax.Array) -> _State:
    """Keep rows `rows_b` (a smaller batch)."""
    take0 = lambda x: jnp.take(x, rows_b, axis=0)
    fields = {f: take0(getattr(state, f)) for f in _State._fields if f not in ("cache", "step")}
    return state._replace(cache=_take_cache_rows(state.cache, rows_b), **fields)


# Traces per program kind, process-wide. The jitted programs below are module-level so that
# every engine on the same model shares compiled code; under `jax.jit` a trace happens exactly
# when a new variant is compiled, and each engine attributes the traces that happen inside its
# own calls to itself.
_TRACES: collections.Counter = collections.Counter()


def _counted(name: str, fn):
    """Wrap `fn` so that each trace of it is counted in `_TRACES[name]`."""

    def wrapper(*args, **kwargs):
        _TRACES[name] += 1
        return fn(*args, **kwargs)

    wrapper.__wrapped__ = fn  # lets jit read the real signature for static_argnames
    wrapper.__name__ = fn.__name__
    return wrapper


_PREFILL = jax.jit(
    _counted("prefill", _prefill_program), static_argnames=("mode", "gen_len", "cache_dtype")
)
_DECODE = jax.jit(
    _counted("decode", _decode_program), static_argnames=("mode",), donate_argnames=("state",)
)
# No donation: the output batch is smaller, so no input buffer could be reused.
_COMPACT = jax.jit(_counted("compact", _compact_program))


class JaxEngine:
    """`RolloutEngine` running the in-process JAX model (see module docstring).

    Args:
      model_cfg: the model's `ModelConfig`.
      params: the parameter tree (the trainer's own arrays; not copied).
      config: bucketing / loop settings.
      mesh, rules: when given, batches are sharded over the `act_batch` rule's mesh axes and the
        batch buckets are rounded to a multiple of that axis size. `rules` defaults to the
        sharding package's DEFAULT_RULES.
      param_shardings: when given, `update_weights` places parameters there (`device_put` is a
        no-op for arrays already laid out that way, so the trainer's params are still shared).
      weight_version: version tag of `params`.
      share_prefill: run each distinct prompt of a batch through the prefill once and copy its
        cache to the rows that sample from it (n samples of a prompt cost one prompt forward,
        not n). False runs one prompt forward per row, as before; kept to prove the two give the
        same completions (tests/test_engine_speed.py) and to time the difference.
    """

    def __init__(
        self,
        model_cfg: ModelConfig,
        params: Any,
        config: JaxEngineConfig = _DEFAULT_CONFIG,
        *,
        mesh: Mesh | None = None,
        rules: Any = None,
        param_shardings: Any = None,
        weight_version: int = 0,
        share_prefill: bool = True,
    ):
        self._model_cfg = model_cfg
        self._config = config
        self._share_prefill = share_prefill
        self._mesh = mesh
        self._param_shardings = param_shardings
        self._batch_sharding = None
        self._batch_multiple = 1
        self._multiprocess = False
        if mesh is not None:
            from dynamo_jax.sharding import rules as sharding_rules
            from dynamo_jax.sharding.mesh import axis_size

            self._rules = sharding_rules.DEFAULT_RULES if rules is None else rules
            self._batch_multiple = axis_size(
                mesh, sharding_rules.rule_axes(self._rules, "act_batch")
            )
            self._batch_sharding = lambda b, ndim: sharding_rules.batch_sharding(
                mesh, self._rules, b, ndim
            )
            self._multiprocess = multihost.is_multiprocess(mesh)
            self._replicated = sharding_rules.replicated(mesh)
        cache_dtype = config.cache_dtype or model_cfg.dtype
        self._cache_dtype = jnp.dtype(cache_dtype)
        self._compilations: collections.Counter = collections.Counter()
        self._params = None
        self._version = 0
        self._closed = False
        self.update_weights(params, weight_version)

    # -- protocol ---------------------------------------------------------------------------
    def update_weights(self, params: Any, version: int) -> None:
        self._check_open()
        if self._param_shardings is not None and not _laid_out(params, self._param_shardings):
            params = jax.device_put(params, self._param_shardings)
        self._params = params
        self._version = int(version)

    @property
    def weight_version(self) -> int:
        return self._version

    def close(self) -> None:
        self._params = None
        self._closed = True

    def generate(self, requests: Sequence[Request], sampling: SamplingParams) -> list[Completion]:
        """Completions grouped by request in request order, then by sample index."""
        return self._generate(requests, sampling)

    def _generate(self, requests: Sequence[Request], sp: SamplingParams) -> list[Completion]:
        self._check_open()
        rows = buckets.expand_requests(requests, self._model_cfg.vocab_size)
        if not rows:
            return []
        longest = max(len(r.prompt) for r in rows)
        if longest + sp.max_new_tokens > self._model_cfg.max_position_embeddings:
            raise ValueError(
                f"longest prompt ({longest} tokens) + SamplingParams.max_new_tokens "
                f"({sp.max_new_tokens}) exceeds the model's max_position_embeddings "
                f"({self._model_cfg.max_position_embeddings})"
            )
        mode = _Mode(self._model_cfg, sp.greedy, sp.top_k != -1, sp.top_p < 1.0)
        knobs = self._shared(_make_knobs(sp))
        gen_len = buckets.pow2_bucket(sp.max_new_tokens, self._config.min_new_tokens)
        version, results = self._version, {}
        for group in buckets.split_rows(rows, self._config.max_batch):
            results.update(self._run_batch(group, mode, knobs, gen_len, sp))
        out = []
        for req in requests:
            for j in range(req.n):
                tokens, logprobs, stopped = results[(req.prompt_id, j)]
                out.append(
                    Completion(
                        prompt_id=req.prompt_id,
                        sample_index=j,
                        token_ids=tokens,
                        logprobs=logprobs,
                        finish_reason="stop" if stopped else "length",
                        weight_version=version,
                    )
                )
        return out

    # -- introspection ----------------------------------------------------------------------
    def _call(self, name: str, program, *args, **kwargs):
        """Run a shared jitted program, attributing any compilation it triggers to this engine."""
        before = _TRACES[name]
        out = program(*args, **kwargs)
        self._compilations[name] += _TRACES[name] - before
        return out

    @property
    def num_compilations(self) -> int:
        """Programs this engine's calls compiled (all kinds); bounded by the buckets, not by the
        number of calls. Programs already compiled by another engine on the same model are
        reused and not counted again."""
        return sum(self._compilations.values())

    @property
    def compilations(self) -> dict[str, int]:
        """Compiled programs by kind: prefill, decode, compact."""
        return dict(self._compilations)

    # -- internals --------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("JaxEngine is closed")

    def _place(self, x: Any) -> Any:
        if self._batch_sharding is None:
            return jnp.asarray(x) if isinstance(x, np.ndarray) else x
        sharding = self._batch_sharding(x.shape[0], x.ndim)
        if self._multiprocess:
            return multihost.global_from_host(x, sharding)
        return jax.device_put(x, sharding)

    def _shared(self, tree: Any) -> Any:
        """Scalars and index vectors every program input needs whole: replicated global arrays
        on a multi-process mesh (a process-local array cannot meet global ones in one program)."""
        if not self._multiprocess:
            return tree
        return jax.tree.map(lambda x: multihost.global_from_host(x, self._replicated), tree)

    def _run_batch(self, group, mode: _Mode, knobs: _Knobs, gen_len: int, sp: SamplingParams):
        """Prefill + chunked decode (+ compaction) of one batch; {(pid, j): result}."""
        cfg = self._config
        batch = buckets.pow2_bucket(len(group), cfg.min_batch, self._batch_multiple)
        prompt_len = buckets.pow2_bucket(max(len(r.prompt) for r in group), cfg.min_prompt_len)
        if self._share_prefill:
            prompts, prompt_of_row = buckets.distinct_prompts(group)
        else:
            prompts, prompt_of_row = [r.prompt for r in group], list(range(len(group)))
        n_prompts = buckets.pow2_bucket(len(prompts), cfg.min_batch, self._batch_multiple)
        tokens_UxP, mask_UxP = buckets.left_pad(prompts, n_prompts, prompt_len)
        pad = batch - len(group)
        # Filler rows read prompt 0's cache; they start finished, so it is never decoded.
        prompt_of_row_B = np.array(prompt_of_row + [0] * pad, np.int32)
        pids = np.array([r.prompt_id for r in group] + [0] * pad, np.int64)
        sidx = np.array([r.sample_index for r in group] + [0] * pad, np.int64)
        keys_B = self._place(sampling.row_keys(sp.seed, pids, sidx))
        real_B = np.arange(batch) < len(group)
        state = self._call(
            "prefill",
            _PREFILL,
            self._params,
            self._place(tokens_UxP),
            self._place(mask_UxP),
            self._place(prompt_of_row_B),
            self._place(real_B),
            keys_B,
            knobs,
            mode=mode,
            gen_len=gen_len,
            cache_dtype=self._cache_dtype,
        )
        slots = list(group) + [None] * pad  # batch position -> row (None = filler)
        results = {}
        while True:
            done_B = multihost.host_copy(state.done_B)
            if done_B.all():
                break
            if cfg.compact:
                state, slots = self._maybe_compact(state, slots, done_B, results)
            step = int(multihost.host_copy(state.step))
            until = self._shared(jnp.int32(min(step + cfg.decode_chunk, sp.max_new_tokens)))
            state = self._call("decode", _DECODE, self._params, state, knobs, until, mode=mode)
        _harvest(state, slots, range(len(slots)), results)
        return results

    def _maybe_compact(self, state: _State, slots, done_B: np.ndarray, results):
        """Gather the running rows into a smaller batch bucket if that halves the batch or more."""
        live = np.flatnonzero(~done_B)
        new_batch = buckets.pow2_bucket(len(live), self._config.min_batch, self._batch_multiple)
        if new_batch >= len(slots):
            return state, slots
        finished = np.flatnonzero(done_B)
        _harvest(state, slots, finished, results)
        # Fillers copy a finished row, so they stay finished and cost nothing but their slot.
        rows_b = np.concatenate([live, np.full(new_batch - len(live), finished[0])]).astype(
            np.int32
        )
        state = self._call("compact", _COMPACT, state, self._shared(jnp.asarray(rows_b)))
        slots = [slots[i] for i in live] + [None] * (new_batch - len(live))
        return state, slots


def _make_knobs(sp: SamplingParams) -> _Knobs:
    n_stop = buckets.pow2_bucket(max(len(sp.stop_token_ids), 1), 4)
    stop = np.full((n_stop,), -1, np.int32)
    stop[: len(sp.stop_token_ids)] = sp.stop_token_ids
    return _Knobs(
        temperature=jnp.float32(sp.temperature if sp.temperature > 0 else 1.0),
        top_k=jnp.int32(sp.top_k),
        top_p=jnp.float32(sp.top_p),
        max_new=jnp.int32(sp.max_new_tokens),
        stop_ids_Y=jnp.asarray(stop),
    )


def _harvest(state: _State, slots, positions, results) -> None:
    """Copy finished rows' outputs to host numpy, keyed by (prompt_id, sample_index); on a
    multi-process mesh each output is all-gathered, so every process gets every row."""
    positions = [p for p in positions if slots[p] is not None]
    if not positions:
        return
    outputs = (state.tokens_BxT, state.logprobs_BxT, state.length_B, state.stopped_B)
    tokens, logprobs, length, stopped = (multihost.host_copy(x) for x in outputs)
    for p in positions:
        row, n = slots[p], int(length[p])
        results[(row.prompt_id, row.sample_index)] = (
            np.array(tokens[p, :n], np.int32),
            np.array(logprobs[p, :n], np.float32),
            bool(stopped[p]),
        )
