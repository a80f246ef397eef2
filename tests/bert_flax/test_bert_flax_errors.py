"""User errors through the command lines end as one line with exit status 2, no traceback;
an unexpected failure keeps its traceback."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from bert_flax import errors
from tests.paths import ROOT


def run(module: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *flags],
        cwd=ROOT,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=300,
    )


def finetune_on(tmp_path, text: str) -> subprocess.CompletedProcess:
    path = tmp_path / "train.csv"
    path.write_text(text)
    return run(
        "bert_flax.train",
        "--config=configs/finetune_sentiment.py",
        f"--workdir={tmp_path / 'run'}",
        f"--config.data.train_file={path}",
    )


def assert_user_error(done: subprocess.CompletedProcess, *phrases: str) -> None:
    assert done.returncode == errors.USER_ERROR_EXIT_STATUS, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: "), last
    for phrase in phrases:
        assert phrase in last, last


@pytest.mark.parametrize(
    "text, phrases",
    [
        ("text\nwhat a film\nawful\n", ("label",)),
        ("", ("holds no records",)),
        ("text,label\ngood,1\nbad,0\n", ("empty",)),
    ],
    ids=["no label column", "empty file", "a split left empty"],
)
def test_finetuning_user_errors(tmp_path, text, phrases):
    assert_user_error(finetune_on(tmp_path, text), *phrases)


def test_pretraining_warmup_longer_than_the_run(tmp_path):
    done = run(
        "bert_flax.train",
        "--config=configs/tiny.py",
        f"--workdir={tmp_path}",
        "--config.data.synthetic=True",
        "--config.train.steps=10",
        "--config.schedule.warmup_steps=20",
    )
    assert_user_error(done, "warmup_steps=20", "total_steps=10")


def test_only_the_projects_own_checks_are_user_errors():
    from bert_flax.train.setup import learning_rate_schedule
    from configs import default

    schedule = default.get_config().schedule
    schedule.warmup_steps = 20
    with pytest.raises(ValueError) as ours:
        learning_rate_schedule(schedule, 10, schedule.warmup_steps)
    assert errors.is_user_error(ours.value)
    with pytest.raises(ValueError) as python:
        int("not a number")
    assert not errors.is_user_error(python.value)  # raised by Python: keeps its traceback
    assert not errors.is_user_error(RuntimeError("a bug"))


def test_a_traceback_on_request(monkeypatch, capsys):
    """`BERT_FLAX_TRACEBACK=1`: the traceback, then the same one line and exit status."""

    def exit_(status: int) -> None:
        raise SystemExit(status)

    def main() -> None:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/no/such/file")

    monkeypatch.setattr(os, "_exit", exit_)
    monkeypatch.setenv("BERT_FLAX_TRACEBACK", "1")
    with pytest.raises(SystemExit) as ended:
        errors.guard(main)()
    assert ended.value.code == errors.USER_ERROR_EXIT_STATUS
    stderr = capsys.readouterr().err
    assert "Traceback" in stderr
    assert stderr.strip().splitlines()[-1] == (
        "error: [Errno 2] No such file or directory: '/no/such/file'"
    )
