"""Run by test_train_faults.py (`python -m tests.bert_flax.train.hold_commit_worker FLAGS`):
`python -m bert_flax.train FLAGS` with orbax's commit of step 20 (the rename of its complete
temporary directory) held: it creates `commit_held` in the workdir and sleeps."""

import runpy
import time

from orbax.checkpoint._src.path import atomicity

finalize = atomicity.AtomicRenameTemporaryPath.finalize


async def held(self, *args, **kwargs):
    if self.get_final().name == "20":
        (self.get_final().parent.parent / "commit_held").touch()
        time.sleep(600)
    return await finalize(self, *args, **kwargs)


if __name__ == "__main__":
    atomicity.AtomicRenameTemporaryPath.finalize = held
    runpy.run_module("bert_flax.train", run_name="__main__")
