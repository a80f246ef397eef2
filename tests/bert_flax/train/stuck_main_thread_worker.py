"""Run by test_train_resume.py (`python -m tests.bert_flax.train.stuck_main_thread_worker`): a
SIGTERM half a second into a wait that reaches no step boundary, under a 1 s PreemptionGuard;
the guard's watchdog must end the process before "not reached" is printed."""

import os
import signal
import subprocess
import threading

from bert_flax.train import resume

if __name__ == "__main__":
    child = subprocess.Popen(["sleep", "20"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with resume.PreemptionGuard(grace_seconds=1.0):
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
        os.waitpid(child.pid, 0)  # stands for a long compilation: no step boundary comes
    print("not reached")
