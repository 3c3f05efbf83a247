"""What a run compiles: every XLA program, its compile time, its reuse; the first step; the wall.

    python -m benchmarks.compile_time                                   # configs/tiny.py, 20 steps
    python -m benchmarks.compile_time --config configs/smollm2_arith.py --steps 3
    python -m benchmarks.compile_time --clones                          # the cache across clones
    python -m benchmarks.compile_time --steps 100 --versus_trl .venv-trl/bin/python  # against TRL

Each measured run is `python launch.py --config C --workdir <fresh> --config.train.steps=N` in a
worker process of its own (the README's command, nothing else changed), under a persistent
compilation cache directory of this benchmark's own:
  cold   the cache directory empty: every program is compiled;
  warm   the same directory again, filled by the cold run: every program is loaded from it;
  calls  warm again with each program's executions counted (below); its wall is not reported.
Per program (one row per XLA compilation, in the order the cold run compiled them): JAX's name
of it, the project's line that called it (the innermost frame under dynamo_jax/), the seconds
of `backend_compile` cold and warm (warm: the load from the cache), the cache's verdict, and how
many times it ran in the `calls` run. Per run: the seconds from the worker's start to the end of
the first step, the wall of the whole command, and the load average beside it.

Compile events come from `jax.monitoring` (jax's '/jax/core/compile/backend_compile_duration'
event, one per program handed to XLA, with the cache's hit or miss event just before it):
`CompileLog`, which tests/test_benchmarks_compile_time.py also uses to count a short run's
compilations. Counting executions needs jax internals: the `calls` run turns off jit's C++
fast path (pjit._get_fastpath_data) so every call passes through Python's
pxla.ExecuteReplicated, which is counted per executable; that adds Python dispatch to every
call, which is why the `calls` run's wall is left out.

`--clones`: the cache across checkouts. The repository's HEAD is cloned twice into directories
of different names and lengths; the short tiny run in the first clone fills an empty cache, the
same run in the second clone reads it. Printed: misses and hits of each, and the entries the
second one added (0: a cache built in one clone serves another).

`--versus_trl PYTHON`: the README's tiny run end to end against TRL, back to back in one
session: the project's command cold and warm (as above, `--steps` steps), then TRL 1.16's
GRPOTrainer (benchmarks/peer_trl_worker.py under PYTHON, the venv of scripts/make_trl_venv.sh)
on the tiny task of `benchmarks/peer_trl.py --shape tiny` (the same initial weights, prompts and
GRPO settings), timed from its process's start to the end of its `--steps`-th RL step. The
project's side is the whole README command (DynaMO, with its two evaluations, checkpoints and
plots); TRL's is training only. Per side: the wall, the first step's end, the load average.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIR = "dynamo_jax"
BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
CACHE_HIT = "/jax/compilation_cache/cache_hits"
CACHE_MISS = "/jax/compilation_cache/cache_misses"


# ----------------------------------------------------------------------------- the compile log


@dataclasses.dataclass(frozen=True)
class Compiled:
    """One program handed to XLA: JAX's name for it, the project line that called it, the
    seconds `backend_compile` took (a cache load when `cache` is 'hit'), and when it ended."""

    name: str
    site: str
    seconds: float
    cache: str  # "hit", "miss" (compiled and written), or "off" (no cache, or not written)
    ended_at: float  # time.time()


def _call_site(root: Path) -> str:
    """'dynamo_jax/<module>.py:<line>' of the innermost frame of the project's package on the
    stack (the line that called the jitted function), else the innermost frame outside jax."""
    package = str(root / PACKAGE_DIR) + os.sep
    frames = traceback.extract_stack()
    for frame in reversed(frames):
        if frame.filename.startswith(package):
            return f"{Path(frame.filename).relative_to(root)}:{frame.lineno}"
    installed = tuple({sys.prefix, sys.base_prefix})  # jax, the standard library
    for frame in reversed(frames):
        if not frame.filename.startswith(installed) and frame.filename != __file__:
            return f"{Path(frame.filename).name}:{frame.lineno}"
    return "?"


class CompileLog:
    """The programs JAX compiles while it is open, from `jax.monitoring`'s events.

        with CompileLog() as log:
            ...
        log.compiled   # [Compiled, ...] in order

    `root` is the checkout whose package the call sites are named in (this one by default)."""

    def __init__(self, root: Path = ROOT):
        self.root = Path(root)
        self.compiled: list[Compiled] = []
        self._verdict = "off"

    def _on_event(self, event: str, **_: object) -> None:
        if event == CACHE_HIT:
            self._verdict = "hit"
        elif event == CACHE_MISS:
            self._verdict = "miss"

    def _on_duration(self, event: str, seconds: float, **kwargs: object) -> None:
        if event != BACKEND_COMPILE:
            return
        name = str(kwargs.get("fun_name", "?"))
        site = _call_site(self.root)
        self.compiled.append(Compiled(name, site, seconds, self._verdict, time.time()))
        self._verdict = "off"

    def __enter__(self) -> CompileLog:
        from jax import monitoring

        monitoring.register_event_listener(self._on_event)
        monitoring.register_event_duration_secs_listener(self._on_duration)
        return self

    def __exit__(self, *exc) -> None:
        from jax._src import monitoring  # the public module has no unregister

        monitoring.unregister_event_listener(self._on_event)
        monitoring.unregister_event_duration_listener(self._on_duration)

    def programs(self) -> Counter:
        """How many times each (name, site) was compiled."""
        return Counter((c.name, c.site) for c in self.compiled)


class CallCounter:
    """Executions per compiled program (jax internals; see the module docstring). Keyed like
    `CompileLog.compiled`: the i-th compilation's executable is counted under index i."""

    def __init__(self, log: CompileLog):
        from jax._src import compiler, pjit
        from jax._src.interpreters import pxla

        self.calls: Counter = Counter()
        index_of: dict[int, int] = {}
        self._keep: list = []  # executables stay alive, so their ids stay unique
        compile_or_get_cached = compiler.compile_or_get_cached
        execute = pxla.ExecuteReplicated.__call__

        def counted_compile(*args, **kwargs):
            executable = compile_or_get_cached(*args, **kwargs)
            index_of[id(executable)] = len(log.compiled)  # logged right after this returns
            self._keep.append(executable)
            return executable

        def counted_execute(runner, *args):
            self.calls[index_of.get(id(runner.xla_executable), -1)] += 1
            return execute(runner, *args)

        compiler.compile_or_get_cached = counted_compile
        pxla.ExecuteReplicated.__call__ = counted_execute
        pjit._get_fastpath_data = lambda *args, **kwargs: None


# ----------------------------------------------------------------------------- the worker


def worker(out: Path, count_calls: bool, launch_args: list[str]) -> None:
    """Runs launch.py in this process under a CompileLog; writes what it saw to `out`."""
    started = time.time()
    # No cache set here: launch.py's own entry sets it (after this process imported jax, as a
    # config file's imports do), so what is measured is what a user's run does.
    step_starts: list[float] = []
    step_ends: list[float] = []
    with CompileLog() as log:
        counter = CallCounter(log) if count_calls else None
        from dynamo_jax.loop import train

        rl_step = train.rl_step

        def timed_step(*args, **kwargs):
            step_starts.append(time.time())
            metrics = rl_step(*args, **kwargs)
            step_ends.append(time.time())
            return metrics

        train.rl_step = timed_step
        sys.argv = [str(ROOT / "launch.py"), *launch_args]
        code = 0
        try:
            runpy.run_path(str(ROOT / "launch.py"), run_name="__main__")
        except SystemExit as done:
            code = done.code or 0
    record = {
        "started": started,
        "exit_code": code,
        "step_starts": step_starts,
        "step_ends": step_ends,
        "compiled": [dataclasses.asdict(c) for c in log.compiled],
        "calls": {str(k): v for k, v in (counter.calls if counter else {}).items()},
    }
    out.write_text(json.dumps(record))


def run_worker(
    config: str,
    steps: int,
    cache_dir: Path,
    *,
    count_calls: bool = False,
    cwd: Path = ROOT,
    extra_args: tuple[str, ...] = (),
    workdir: Path | None = None,
) -> dict:
    """One measured run (a worker process) in `workdir` (default: a fresh one); its record plus
    the wall and the 1-minute load average at its start and end."""
    with tempfile.TemporaryDirectory(prefix="compile_time_") as tmp:
        out = Path(tmp) / "record.json"
        env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(cache_dir))
        env["PYTHONPATH"] = os.pathsep.join([str(cwd), env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
        cmd = [sys.executable, str(cwd / "benchmarks" / "compile_time.py"), "--worker", str(out)]
        cmd += ["--count_calls"] if count_calls else []
        args = ["--config", config, "--workdir", str(workdir or Path(tmp) / "workdir")]
        args += [f"--config.train.steps={steps}", *extra_args]
        load = os.getloadavg()[0]
        start = time.time()
        proc = subprocess.run([*cmd, "--", *args], cwd=cwd, env=env, capture_output=True, text=True)
        wall = time.time() - start
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"the run failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        record = json.loads(out.read_text())
    record.update(wall=wall, load=(load, os.getloadavg()[0]), launched=start)
    return record


# ----------------------------------------------------------------------------- the tables


def first_step_s(record: dict) -> float:
    """Seconds from the command's start to the end of its first step."""
    return record["step_ends"][0] - record["launched"] if record["step_ends"] else float("nan")


def _load(record: dict) -> str:
    return f"{record['load'][0]:.1f}-{record['load'][1]:.1f}"


def program_table(cold: dict, warm: dict, calls: dict | None) -> str:
    """One row per compilation of the cold run, matched in the warm and calls runs by order
    among the compilations of the same (name, call site)."""

    def keyed(record):
        seen: Counter = Counter()
        out = {}
        for i, c in enumerate(record["compiled"]):
            key = (c["name"], c["site"], seen[(c["name"], c["site"])])
            seen[(c["name"], c["site"])] += 1
            out[key] = (i, c)
        return out

    warm_by, calls_by = keyed(warm), keyed(calls) if calls else {}
    lines = [
        "| # | program | called at | cold s | warm s | warm cache | runs |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, (i, c) in keyed(cold).items():
        w = warm_by.get(key, (None, None))[1]
        runs = "-"
        if key in calls_by:
            runs = str(calls["calls"].get(str(calls_by[key][0]), 0))
        warm_s = f"{w['seconds']:.2f}" if w else "-"
        lines.append(
            f"| {i + 1} | {c['name']} | {c['site']} | {c['seconds']:.2f} | {warm_s} | "
            f"{w['cache'] if w else 'not compiled'} | {runs} |"
        )
    new = [k for k in warm_by if k not in keyed(cold)]
    for name, site, _ in new:
        lines.append(f"| + | {name} | {site} | - | (warm only) | | |")
    return "\n".join(lines)


def summary_table(rows: list[tuple[str, dict]]) -> str:
    lines = [
        "| run | programs | compile s (sum) | cache hits | first step s | wall s | load (1 min) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in rows:
        compiled = r["compiled"]
        hits = sum(c["cache"] == "hit" for c in compiled)
        total = sum(c["seconds"] for c in compiled)
        lines.append(
            f"| {name} | {len(compiled)} | {total:.1f} | {hits} | {first_step_s(r):.1f} | "
            f"{r['wall']:.1f} | {_load(r)} |"
        )
    return "\n".join(lines)


def measure(config: str, steps: int, count_calls: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="compile_cache_") as cache:
        cold = run_worker(config, steps, Path(cache))
        # printed at once: a long cold run is not lost if a later one fails
        print(f"\n## {config}, {steps} steps: cold\n\n{summary_table([('cold', cold)])}")
        for c in cold["compiled"]:
            print(f"  {c['name']} at {c['site']}: {c['seconds']:.2f} s", flush=True)
        warm = run_worker(config, steps, Path(cache))
        calls = run_worker(config, steps, Path(cache), count_calls=True) if count_calls else None
    print(f"\n## {config}, {steps} steps\n")
    print(summary_table([("cold", cold), ("warm", warm)]))
    print()
    print(program_table(cold, warm, calls))
    sys.stdout.flush()


def clones(config: str, steps: int) -> dict:
    """The cache filled in one clone of HEAD, read in another (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="compile_clones_") as tmp:
        first, second = Path(tmp) / "a", Path(tmp) / "second-clone-elsewhere"
        cache = Path(tmp) / "cache"
        for clone in (first, second):
            subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        a = run_worker(config, steps, cache, cwd=first)
        entries = set(os.listdir(cache))
        b = run_worker(config, steps, cache, cwd=second)
        added = sorted(set(os.listdir(cache)) - entries)
        shutil.rmtree(cache)
    out = {}
    for name, r in (("first clone", a), ("second clone", b)):
        verdicts = Counter(c["cache"] for c in r["compiled"])
        out[name] = {"misses": verdicts["miss"], "hits": verdicts["hit"], "wall": r["wall"]}
        print(
            f"{name}: {verdicts['miss']} compiled and written, {verdicts['hit']} loaded, "
            f"{verdicts['off']} not cached; wall {r['wall']:.1f} s (load {_load(r)})"
        )
    print(f"entries the second clone added: {len(added)}")
    out["added"] = added
    return out


def versus_trl(trl_python: Path, steps: int, trl_threads: int = 0) -> None:
    """The README's tiny run end to end against TRL's GRPOTrainer on the same tiny task, back to
    back: the project's command cold (empty cache) and warm, then a fresh TRL worker process
    (benchmarks/peer_trl_worker.py, in the TRL venv) from its start to the end of `steps` RL
    steps, on the spec (initial weights, prompts, GRPOConfig) benchmarks/peer_trl.py writes for
    `--shape tiny` (configs/tiny.py's GRPO recipe, one step = one batch of 16 prompts), with
    torch's threads at `trl_threads` (0: torch's default, one per core)."""
    from types import SimpleNamespace

    from benchmarks import peer_trl

    rows = []
    with tempfile.TemporaryDirectory(prefix="compile_cache_") as cache:
        for name in ("project, cold", "project, warm"):
            r = run_worker("configs/tiny.py", steps, Path(cache))
            rows.append((name, r["wall"], first_step_s(r), _load(r)))
    args = SimpleNamespace(
        shape="tiny", reward="auto", task="max", old_logprobs="engine", trl_python=trl_python
    )
    with tempfile.TemporaryDirectory(prefix="versus_trl_") as tmp:
        env, prefix = peer_trl.worker_env("all")
        me = [sys.executable, "-m", "benchmarks.peer_trl", "--_project_worker"]
        me += ["tiny", "--seed", "0", "--_steps", str(steps), "--_tmp", tmp, "--reward", "auto"]
        me += ["--_engine_devices", str(peer_trl.engine_devices("all"))]
        project = peer_trl.Worker("project", prefix + me, env, Path(tmp) / "project.log")
        project.answer()  # the spec is written; the project worker idles from here on
        spec = json.loads((Path(tmp) / "spec.json").read_text())
        spec.update(threads=trl_threads, out_dir=str(Path(tmp) / "trl_out"))
        (Path(tmp) / "spec_trl.json").write_text(json.dumps(spec))
        worker = [str(args.trl_python), "-m", "benchmarks.peer_trl_worker"]
        load = os.getloadavg()[0]
        start = time.time()
        trl = peer_trl.Worker(
            "TRL", prefix + worker + [str(Path(tmp) / "spec_trl.json")], env, Path(tmp) / "trl.log"
        )
        trl.answer()  # built: imports, model, GRPOTrainer
        first = trl.go(1)["steps"]
        first_s = time.time() - start
        rest = trl.go(steps - 1)["steps"] if steps > 1 else []
        wall = time.time() - start
        trl.stop()
        project.stop()
    assert len(first) + len(rest) == steps
    threads = f"{trl_threads} thread(s)" if trl_threads else "all threads"
    rows.append((f"TRL 1.16, {threads}", wall, first_s, f"{load:.1f}-{os.getloadavg()[0]:.1f}"))
    print(f"\n## the tiny run end to end, {steps} steps\n")
    print("| run | wall s | first step s | load (1 min) |\n|---|---|---|---|")
    for name, wall_s, first_step, load_s in rows:
        print(f"| {name} | {wall_s:.1f} | {first_step:.1f} | {load_s} |")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--worker" in argv:  # python compile_time.py --worker OUT [--count_calls] -- ARGS
        split = argv.index("--")
        own, launch_args = argv[:split], argv[split + 1 :]
        worker(Path(own[own.index("--worker") + 1]), "--count_calls" in own, launch_args)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", action="append", help="configs/*.py[:arg] (repeatable)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--no_calls", action="store_true", help="skip the `calls` run")
    parser.add_argument("--clones", action="store_true", help="the cache across two clones")
    parser.add_argument(
        "--versus_trl", type=Path, metavar="PYTHON",
        help="the README's tiny run end to end against TRL (the TRL venv's python)",
    )  # fmt: skip
    parser.add_argument("--trl_threads", type=int, default=0, help="torch threads (0: all)")
    args = parser.parse_args(argv)
    configs = args.config or ["configs/tiny.py"]
    print(f"jax {__import__('jax').__version__}, {os.cpu_count()} cores")
    if args.clones:
        clones(configs[0], args.steps)
        return
    if args.versus_trl:
        versus_trl(args.versus_trl, args.steps, args.trl_threads)
        return
    for config in configs:
        measure(config, args.steps, count_calls=not args.no_calls)


if __name__ == "__main__":
    main()
