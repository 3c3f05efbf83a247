"""The statistics of benchmarks/gradient_variance.py: variances of gradient draws from their Gram
matrices, bootstrap intervals, and the models of an allocation's variance (Appendix C's
prompt-mean model and the token-mean one).

Pure float64 NumPy on what the measurement hands over (Gram matrices and per-prompt sigma_i^2),
so the tables can be recomputed and tested without a model.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import numpy as np


def total_variance(gram: np.ndarray) -> float:
    """Unbiased E||g - E g||^2 of D draws from their Gram matrix K[d, e] = g_d . g_e."""
    d = gram.shape[0]
    return float((np.trace(gram) - gram.sum() / d) / (d - 1))


def bootstrap_variances(gram: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """`total_variance` of `resamples` bootstrap resamples of the draws (rows of counts w:
    sum_d w_d K_dd - w^T K w / D, over D - 1)."""
    d = gram.shape[0]
    w = rng.multinomial(d, np.full(d, 1.0 / d), size=resamples).astype(np.float64)
    quad = np.einsum("rd,de,re->r", w, gram, w)
    return (w @ np.diag(gram) - quad / d) / (d - 1)


def appendix_c_optimum(sigma: np.ndarray) -> float:
    """(sum sigma)^2 / (N sum sigma^2): the n ∝ sigma allocation's variance over uniform's
    when prompts are averaged with equal weights (paper Appendix C)."""
    return float(sigma.sum() ** 2 / (sigma.size * np.sum(sigma**2)))


def prompt_mean_ratio(sigma2: np.ndarray, n: np.ndarray, n_avg: float) -> float:
    """sum sigma_i^2 / n_i over sum sigma_i^2 / n_avg (Appendix C's model of the estimator)."""
    keep = sigma2 > 0
    return float(np.sum(sigma2[keep] / n[keep]) / (np.sum(sigma2) / n_avg))


def token_mean_ratio(sigma2: np.ndarray, n: np.ndarray, n_avg: float) -> float:
    """sum n_i sigma_i^2 over n_avg sum sigma_i^2: the variance ratio when the loss averages
    over all rollouts (prompt i weighs n_i / B; its mean's variance is sigma_i^2 / n_i)."""
    return float(np.sum(n * sigma2) / (n_avg * np.sum(sigma2)))


def mixed_group_probability(p: np.ndarray, n: int) -> np.ndarray:
    """Chance that n rollouts of success rate p are neither all right nor all wrong."""
    return 1.0 - p**n - (1.0 - p) ** n


@dataclasses.dataclass(frozen=True)
class DrawStats:
    """What the tables need of D gradient draws: their Gram matrix and mean, and their dot
    products with the reference gradient (None when no reference was measured)."""

    gram: np.ndarray  # float64 [D, D]
    mean: np.ndarray  # float64 [P]
    ref_dot: np.ndarray | None  # float64 [D]

    @classmethod
    def of(cls, grads: np.ndarray, g_ref: np.ndarray | None) -> DrawStats:
        g = grads.astype(np.float64)
        return cls(g @ g.T, g.mean(0), None if g_ref is None else g @ g_ref)

    @property
    def variance(self) -> float:
        return total_variance(self.gram)

    def mean_cos2(self, g_ref: np.ndarray) -> float:
        """E cos^2(g_d, g_ref) over the draws."""
        norms = np.diag(self.gram) * float(g_ref @ g_ref)
        return float(np.mean(np.where(norms > 0, self.ref_dot**2 / np.maximum(norms, 1e-300), 0)))

    def relative_bias2(self, g_ref: np.ndarray, ref_noise: float) -> float:
        """(||mean - g_ref||^2 - Var/D - Var(g_ref)) / ||g_ref||^2: squared bias, noise removed."""
        d = self.gram.shape[0]
        diff = self.mean - g_ref
        return float((diff @ diff - self.variance / d - ref_noise) / (g_ref @ g_ref))


class DrawStore:
    """Up to D gradient draws in a float32 file, one row each, and their `DrawStats` computed
    from it a block of columns at a time: the memory is D x block, not D x P. A real model's
    draws do not fit in memory (SmolLM2-135M: 0.54 GB a draw, 32 draws per allocation; held and
    then converted to float64, they took the process past 24 GB). float32 keeps every bit of
    the train step's float32 gradient. The file is made at the first draw (its length P) and
    removed when the `with` block ends."""

    def __init__(self, draws: int, directory: str | None = None):
        self.draws, self.count, self.rows = draws, 0, None
        self._dir = tempfile.TemporaryDirectory(prefix="gradient_draws_", dir=directory)

    def __enter__(self) -> DrawStore:
        return self

    def __exit__(self, *exc) -> None:
        self.rows = None  # the memmap holds its file open until it is dropped
        self._dir.cleanup()

    def add(self, grad: np.ndarray) -> None:
        if self.rows is None:
            path = Path(self._dir.name) / "draws.npy"
            self.rows = np.lib.format.open_memmap(path, "w+", np.float32, (self.draws, grad.size))
        self.rows[self.count] = grad
        self.count += 1

    def stats(self, g_ref: np.ndarray | None, block: int = 1 << 22) -> DrawStats:
        d, size = self.count, self.rows.shape[1]
        gram, mean = np.zeros((d, d)), np.zeros(size)
        ref_dot = None if g_ref is None else np.zeros(d)
        for start in range(0, size, block):
            x = np.asarray(self.rows[:d, start : start + block], np.float64)
            gram += x @ x.T
            mean[start : start + block] = x.mean(0)
            if g_ref is not None:
                ref_dot += x @ g_ref[start : start + block]
        return DrawStats(gram, mean, ref_dot)


def predicted_ratio_interval(m: dict, n: np.ndarray, resamples: int, rng) -> tuple[float, float]:
    """95% bootstrap interval of Appendix C's predicted ratio for allocation n (sigma_i's draws
    resampled within each prompt). A resample where every prompt repeats one draw has no spread
    (0 / 0; a few --sigma_draws only) and is left out."""
    boot = np.stack([m["n_avg"] * bootstrap_variances(g, resamples, rng) for g in m["sigma_grams"]])
    with np.errstate(invalid="ignore", divide="ignore"):
        ratios = np.sum(boot / n[:, None], 0) / (np.sum(boot, 0) / m["n_avg"])
    lo, hi = np.nanpercentile(ratios, [2.5, 97.5])
    return float(lo), float(hi)


def spearman(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    from scipy.stats import spearmanr

    res = spearmanr(x, y)
    return float(res.statistic), float(res.pvalue)
