"""Float64 NumPy reference of docs/algorithm.md#log-probabilities-and-entropy through
docs/algorithm.md#advantage-modulation and docs/algorithm.md#baselines, written from the text, token by token.

Deliberately simple (explicit loops, full softmax, python grouping) and independent of the JAX
code's structure: it sees the whole mini-batch at once and knows nothing of micro-batches,
devices, blocks or thresholds. Inputs are per-token arrays [B, L] with a boolean mask.
"""

from __future__ import annotations

import math

import numpy as np

LOG_RATIO_CLAMP = 20.0  # the project's stated choice (verl's), see dynamo_jax/losses/batch.py


def logprobs_entropy_k(hidden, w, targets, temperature):
    """docs/algorithm.md#log-probabilities-and-entropy with a full float64 softmax: log π(a), H, K = Σ π²(log π + H)."""
    z = (hidden.astype(np.float64) @ w.astype(np.float64)) / temperature
    m = z.max(axis=-1, keepdims=True)
    logpi = z - (m + np.log(np.exp(z - m).sum(axis=-1, keepdims=True)))
    pi = np.exp(logpi)
    ent = -(pi * logpi).sum(-1)
    k = (pi**2 * (logpi + ent[:, None])).sum(-1)
    return logpi[np.arange(len(targets)), targets], ent, k


def grpo_advantages(rewards, group_ids, norm_adv_by_std=True, eps=1e-6):
    """docs/algorithm.md#grpo-advantages: per prompt id, (R − mean)/(unbiased std + ε) or R − mean; lone responses get 0."""
    rewards = np.asarray(rewards, np.float64)
    adv = np.zeros_like(rewards)
    for gid in set(np.asarray(group_ids).tolist()):
        idx = [i for i, g in enumerate(group_ids) if g == gid]
        if len(idx) < 2:
            continue
        r = rewards[idx]
        mean = r.mean()
        std = r.std(ddof=1)
        adv[idx] = (r - mean) / (std + eps) if norm_adv_by_std else r - mean
    return adv


def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def dynamo_modulation(logp, old_logp, ent, adv, mask, k, cfg):
    """docs/algorithm.md#advantage-modulation: returns (Â, β_comp, β_stab) as [B, L] float64 arrays (0 on padding)."""
    B, L = mask.shape
    valid = [(b, t) for b in range(B) for t in range(L) if mask[b, t]]
    hs = [ent[b, t] for b, t in valid]
    h_min, h_max = (min(hs), max(hs)) if hs else (0.0, 0.0)
    u = np.exp(logp) * (logp + ent)
    if cfg.settings.entropy_change == "sequence_mean":
        kk = np.zeros((B, L))
        for b in range(B):
            ts = [t for t in range(L) if mask[b, t]]
            kk[b, :] = np.mean([u[b, t] for t in ts]) if ts else 0.0
    else:
        kk = k
    xi_abs = np.zeros((B, L))
    for b, t in valid:
        r = math.exp(np.clip(logp[b, t] - old_logp[b, t], -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        a = adv[b, t]
        low, high = _band(cfg)
        i_clip = (a > 0 and r <= high) or (a < 0 and r >= low)
        xi = (r * a) if i_clip else 0.0
        xi_abs[b, t] = abs(-xi * (u[b, t] - kk[b, t]))
    xi_max = max((xi_abs[b, t] for b, t in valid), default=0.0)
    s = cfg.settings  # the dynamo variant's own keys; alpha_comp / alpha_stab None: tied to alpha
    a_c = s.alpha if s.alpha_comp is None else s.alpha_comp
    a_s = s.alpha if s.alpha_stab is None else s.alpha_stab
    lam_min = 1 - a_s
    bc, bs, ahat = np.zeros((B, L)), np.zeros((B, L)), np.zeros((B, L))
    for b, t in valid:
        a = adv[b, t]
        bc[b, t] = 1 + a_c * (h_max - ent[b, t]) / (h_max - h_min + 1e-8) if a > 0 else 1.0
        x = xi_abs[b, t] / (xi_max + 1e-8)
        bs[b, t] = lam_min + (1 - lam_min) * _sigmoid(
            -cfg.settings.gamma * (x - cfg.settings.ums_tau)
        )
        if not cfg.settings.enable_gc:
            bc[b, t] = 1.0
        if not cfg.settings.enable_ums:
            bs[b, t] = 1.0
        ahat[b, t] = a * bc[b, t] * bs[b, t]
    return ahat, bc, bs


def _band(cfg):
    """The PPO clip band, written here independently of the code under test."""
    return 1 - cfg.clip_low, 1 + cfg.clip_high


def _clip_ratio(r, cfg):
    low, high = _band(cfg)
    return min(max(r, low), high)


def _clipped(a, r, cfg):
    loss = -min(r * a, _clip_ratio(r, cfg) * a)
    if cfg.dual_clip is not None and a < 0:
        loss = min(loss, -cfg.dual_clip * a)
    return loss


def _aggregate(per_token, mask, cfg, groups=None):
    B, L = mask.shape
    n_tok = int(mask.sum())
    seqs = [b for b in range(B) if mask[b].any()]
    if cfg.loss_agg_mode == "token-mean":
        return sum(per_token[b, t] for b in range(B) for t in range(L) if mask[b, t]) / max(
            n_tok, 1
        )
    if cfg.loss_agg_mode == "seq-mean-token-mean":
        means = [np.mean([per_token[b, t] for t in range(L) if mask[b, t]]) for b in seqs]
        return sum(means) / max(len(seqs), 1)
    if cfg.loss_agg_mode == "prompt-mean":
        return _prompt_mean(per_token, mask, seqs, groups)
    sums = [sum(per_token[b, t] for t in range(L) if mask[b, t]) for b in seqs]
    return sum(sums) / (max(len(seqs), 1) * cfg.max_len_norm)


def _prompt_mean(per_token, mask, seqs, groups):
    """(1/N) Σ_i (1/n_i) Σ_j mean_t ℓ_ijt over the prompt groups of the batch's sequences.

    `groups` = (prompt id per row, or None, step-level group size per row, or None). With
    group sizes given (a mini-batch holding part of the step's groups), each sequence weighs
    1/n_i of its step group, renormalised over the mini-batch's sequences."""
    ids, sizes = groups
    L = mask.shape[1]
    seq_mean = {b: np.mean([per_token[b, t] for t in range(L) if mask[b, t]]) for b in seqs}
    if sizes is None:
        members = {}
        for b in seqs:
            members.setdefault(int(ids[b]), []).append(b)
        means = [np.mean([seq_mean[b] for b in bs]) for bs in members.values()]
        return sum(means) / max(len(means), 1)
    w = {b: 1.0 / sizes[b] for b in seqs}
    total = sum(w.values())
    return sum(w[b] * seq_mean[b] for b in seqs) / total if total > 0 else 0.0


def _covariance(logp, adv, mask):
    vl, va = logp[mask], adv[mask]
    return (adv - va.mean()) * (logp - vl.mean()) if mask.any() else np.zeros_like(adv)


def policy_loss(inp: dict, cfg):
    """The mini-batch loss (docs/algorithm.md#policy-loss with modulation and baselines) and the per-token Â; `inp` holds [B, L] arrays."""
    logp, old, ent, adv = (
        np.asarray(inp[k], np.float64) for k in ("logp", "old_logp", "ent", "adv")
    )
    mask = np.asarray(inp["mask"], bool)
    B, L = mask.shape
    n_tok = int(mask.sum())
    log_r = np.clip(np.where(mask, logp - old, 0.0), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    r = np.exp(log_r)
    ahat = adv.copy()
    if cfg.variant == "dynamo":
        k = None if inp.get("k") is None else np.asarray(inp["k"], np.float64)
        ahat, _, _ = dynamo_modulation(logp, old, ent, adv, mask, k, cfg)
    elif cfg.variant == "entropy_adv":
        ahat = adv + np.minimum(
            cfg.settings.ent_adv_kappa1 * ent, np.abs(adv) / cfg.settings.ent_adv_kappa2
        )
    per_tok = np.zeros((B, L))
    for b in range(B):
        for t in range(L):
            if mask[b, t]:
                per_tok[b, t] = _clipped(ahat[b, t], r[b, t], cfg)
    if cfg.variant == "fork_tokens":
        thr = np.quantile(ent[mask], 1 - cfg.settings.fork_top_ratio) if n_tok else np.inf
        per_tok = np.where(ent >= thr, per_tok, 0.0)
    elif cfg.variant == "clip_cov":
        cov = _covariance(logp, adv, mask)
        clipped = np.array(
            [[-adv[b, t] * _clip_ratio(r[b, t], cfg) > -adv[b, t] * r[b, t]
              for t in range(L)] for b in range(B)]
        )  # fmt: skip
        cand = [(b, t) for b in range(B) for t in range(L)
                if mask[b, t] and not clipped[b, t] and cfg.settings.clip_cov_lb < cov[b, t] < cfg.settings.clip_cov_ub]  # fmt: skip
        clip_num = max(int(cfg.settings.clip_cov_ratio * n_tok), 1)
        noise = np.asarray(inp["noise"], np.float64)
        for b, t in sorted(cand, key=lambda bt: noise[bt])[:clip_num]:
            per_tok[b, t] = 0.0
    elif cfg.variant == "kl_cov":
        cov = _covariance(logp, adv, mask)
        per_tok = np.where(mask, -adv * r, 0.0)
        valid = [(b, t) for b in range(B) for t in range(L) if mask[b, t]]
        k_num = max(int(cfg.settings.kl_cov_ratio * n_tok), 1)
        noise = np.asarray(inp["noise"], np.float64)  # ties at the cut: smallest noise first
        for b, t in sorted(valid, key=lambda bt: (-cov[bt], noise[bt]))[:k_num]:
            per_tok[b, t] += cfg.settings.kl_cov_coef * abs(log_r[b, t])
    if inp.get("is_weight") is not None:  # rollout correction: each token's loss reweighted
        per_tok = per_tok * np.asarray(inp["is_weight"], np.float64)
    groups = (inp.get("group"), inp.get("group_size"))
    loss = _aggregate(per_tok, mask, cfg, groups)
    if cfg.variant == "entropy_loss":
        loss -= cfg.settings.entropy_coef * _aggregate(ent, mask, cfg, groups)
    if cfg.kl != "none":
        k1 = logp - np.asarray(inp["ref_logp"], np.float64)
        kl = k1 if cfg.kl == "k1" else np.exp(-k1) + k1 - 1
        loss += cfg.kl_coef * _aggregate(kl, mask, cfg, groups)
    return loss, ahat


def random_token_inputs(rng, B=6, L=9, *, ratio_noise=0.3, with_k=True):
    """Random [B, L] loss inputs with ragged masks, one fully masked row, A = 0 rows."""
    lengths = rng.integers(1, L + 1, size=B)
    lengths[1] = 0  # an empty (fully masked) response
    mask = np.arange(L)[None, :] < lengths[:, None]
    rewards = rng.integers(0, 2, size=B).astype(np.float64)
    groups = rng.integers(0, 3, size=B)
    adv_seq = grpo_advantages(rewards, groups)
    adv_seq[0] = 0.0  # an A = 0 response
    logp = -rng.uniform(0.01, 4.0, size=(B, L))
    inp = {
        "logp": logp,
        "old_logp": logp + rng.normal(0.0, ratio_noise, size=(B, L)),
        "ent": rng.uniform(0.0, 3.0, size=(B, L)),
        "adv": np.repeat(adv_seq[:, None], L, axis=1),
        "mask": mask,
        "k": rng.normal(0.0, 0.2, size=(B, L)) if with_k else None,
        "ref_logp": logp + rng.normal(0.0, 0.2, size=(B, L)),
        "noise": rng.uniform(0.0, 1.0, size=(B, L)),
        "group": groups,  # prompt id per row (prompt-mean); no draw, so the stream is unchanged
    }
    inp["seq_weight"] = seq_weights(groups, mask, L)
    return inp


def seq_weights(groups, mask, width):
    """[B, width]: 1/n_i on every slot of row b, n_i the rows of b's prompt id that have a
    valid token (0 for rows without one): the JAX loss's `seq_weight` input for prompt-mean."""
    has = np.asarray(mask, bool).any(axis=1)
    n = {g: sum(1 for b in range(len(groups)) if has[b] and groups[b] == g) for g in set(groups)}
    w = np.array([1.0 / n[g] if has[b] else 0.0 for b, g in enumerate(groups)])
    return np.repeat(w[:, None], width, axis=1)


def rollout_correction(old_logp, engine_logp, mask, cfg):
    """docs/algorithm.md#rollout-correction, sequence by sequence (a row is one): the truncated
    IS weight per token, the mask less the rejected tokens, and the metrics, from the text."""
    old, eng = np.asarray(old_logp, np.float64), np.asarray(engine_logp, np.float64)
    mask = np.asarray(mask, bool)
    B, L = mask.shape
    clamp = lambda x: min(max(x, -LOG_RATIO_CLAMP), LOG_RATIO_CLAMP)
    lower = 1.0 / cfg.rs_upper if cfg.rs_lower is None else cfg.rs_lower
    weight, keep = np.zeros((B, L)), mask.copy()
    raw, trunc, rejected, seq_rejected, kl, k3 = [], [], [], 0, [], []
    for b in range(B):
        ts = [t for t in range(L) if mask[b, t]]
        log_rho = {t: clamp(old[b, t] - eng[b, t]) for t in ts}
        seq = clamp(sum(log_rho.values()))
        for t in ts:
            w = math.exp(seq if cfg.is_level == "sequence" else log_rho[t])
            raw.append(w)
            trunc.append(w > cfg.is_threshold)
            weight[b, t] = min(w, cfg.is_threshold) if cfg.is_level != "none" else 1.0
            kl.append(eng[b, t] - old[b, t])
            k3.append(math.exp(log_rho[t]) - log_rho[t] - 1.0)
            stat = {"token": log_rho[t], "sequence": seq,
                    "geometric": sum(log_rho.values()) / len(ts)}.get(cfg.rs_level)  # fmt: skip
            if stat is not None and not lower <= math.exp(stat) <= cfg.rs_upper:
                keep[b, t] = False
            rejected.append(not keep[b, t])
        seq_rejected += any(not keep[b, t] for t in ts)
    if cfg.is_level == "none":
        weight = np.ones((B, L))
    n_seqs = max(sum(1 for b in range(B) if mask[b].any()), 1)
    metrics = {"is_weight_mean": np.mean(raw), "is_weight_max": max(raw),
               "kl": np.mean(kl), "k3_kl": np.mean(k3)}  # fmt: skip
    if cfg.is_level != "none":
        metrics["is_truncated_frac"] = np.mean(trunc)
    if cfg.rs_level != "none":
        metrics["rs_masked_frac"] = np.mean(rejected)
        metrics["rs_seq_masked_frac"] = seq_rejected / n_seqs
    return weight, keep, metrics
