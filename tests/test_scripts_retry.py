"""scripts/retry.sh, which .ci/run and scripts/make_vllm_venv.sh wrap their downloads in."""

import subprocess

from helpers.scripts import ROOT

RETRY = ROOT / "scripts" / "retry.sh"


def _run(body, tmp_path):
    script = f'set -euo pipefail; . "{RETRY}"; {body}'
    env = {"RETRY_DELAY_S": "0", "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )


def test_a_command_that_fails_twice_then_succeeds_is_run_three_times(tmp_path):
    # Each try appends a line; the third finds two lines and succeeds.
    body = "retry bash -c 'echo x >> tries; [ $(wc -l < tries) -ge 3 ]'; echo after"
    proc = _run(body, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "tries").read_text().count("x") == 3
    assert proc.stdout.strip() == "after"
    assert proc.stderr.count("retry:") == 2 and "attempt 2 of 3" in proc.stderr


def test_a_command_that_always_fails_stops_the_script_with_its_own_status(tmp_path):
    proc = _run("retry bash -c 'echo x >> tries; exit 7'; echo never", tmp_path)
    assert proc.returncode == 7
    assert (tmp_path / "tries").read_text().count("x") == 3
    assert "never" not in proc.stdout


def test_a_command_that_succeeds_runs_once(tmp_path):
    proc = _run("retry bash -c 'echo x >> tries'", tmp_path)
    assert proc.returncode == 0 and proc.stderr == ""
    assert (tmp_path / "tries").read_text().count("x") == 1
