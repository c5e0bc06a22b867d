"""Kill -9 during heavy writing (design §2.3, 9): every acknowledged message is there after restart.

A child process runs a real session store and appends as fast as it can, printing the id of each
message once its append is acknowledged. The parent kills it with SIGKILL at random moments, then
reopens the log: it must open (a torn last line is cut off), replay into a consistent tree, and hold
every acknowledged id. The rounds continue the same session, so each child also resumes after a kill.

Under ``always`` an acknowledgement means fsynced; under ``turn`` and ``never`` it means written to
the OS, which survives the death of the process (not of the machine).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from runtime.messages import TextPart
from runtime.store.log import read_log, replay
from runtime.store.sessions import SessionDirectory

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 24
ROUNDS_PER_SESSION = 6  # each session is resumed after a kill 5 times; bounded logs keep the test short

# A fork server: it imports everything once, then forks one writer per round (a fresh interpreter per
# round would spend most of the test starting up). The writer shares its stdout, so the parent reads
# "ready <pid>", then one acknowledged id per line, then the server's "exit <status>" once it is dead.
SERVER = """
import os, sys, threading
sys.path.insert(0, sys.argv[1])
from actors.session_store import Append, GetContext, SessionStore
from runtime.messages import user
from runtime.store.entries import new_header
from runtime.store.sessions import SessionDirectory
from runtime.store.writer import LogWriter

assert threading.active_count() == 1, "forking needs a process without threads"
root = sys.argv[2]

def write(session_id, policy, prefix):
    writer = LogWriter(policy)
    header = new_header(session_id, model="m")
    store = SessionStore.start(session_id, SessionDirectory(root), writer, header, lambda event: None)
    store.ask(GetContext())  # replayed and locked
    os.write(1, f"ready {os.getpid()}\\n".encode())
    in_flight = threading.Semaphore(64)

    def acknowledged(reply):
        if reply.ok:
            os.write(1, (reply.entries[0].id + "\\n").encode())
        in_flight.release()

    n = 0
    while True:
        in_flight.acquire()
        n += 1
        text = f"{prefix}-{n} " + "x" * (n * 37 % 300)
        store.tell(Append(user(text, id=f"{prefix}-{n}"), reply_to=acknowledged))

while line := sys.stdin.readline():
    session_id, policy, prefix = line.split()
    pid = os.fork()
    if pid == 0:
        try:
            write(session_id, policy, prefix)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    os.write(1, f"exit {status}\\n".encode())
"""


def test_every_acknowledged_append_survives_sigkill(tmp_path: Path) -> None:
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    directory = SessionDirectory(tmp_path)
    acknowledged: dict[str, list[str]] = {}
    torn_rounds = 0
    started = time.monotonic()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(ROOT), str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert server.stdin is not None and server.stdout is not None
    try:
        for round_ in range(ROUNDS):
            policy = ("always", "turn", "never")[round_ % 3]
            session_id = f"victim{round_ // ROUNDS_PER_SESSION}"
            acks = acknowledged.setdefault(session_id, [])
            server.stdin.write(f"{session_id} {policy} r{round_}\n".encode())
            server.stdin.flush()
            ready = server.stdout.readline().split()
            assert ready[:1] == [b"ready"], ready or (server.stderr.read() if server.stderr else b"")
            time.sleep(rng.uniform(0.0, 0.05))
            os.kill(int(ready[1]), signal.SIGKILL)
            while not (line := server.stdout.readline()).startswith(b"exit "):
                acks.append(line.decode().strip())
            assert os.WIFSIGNALED(int(line.split()[1])), line

            path = directory.log_path(session_id)
            if not path.exists():  # killed before the writer made the file: nothing acknowledged
                assert not acks
                continue
            entries, info = read_log(path)  # opens, cuts a torn tail
            torn_rounds += info.torn
            if not entries:  # killed before the new session's header was written: nothing acknowledged
                assert not acks
                continue
            tree = replay(path, entries)  # a consistent tree
            on_path = {m.id for m in tree.context()}
            missing = [i for i in acks if i not in on_path]
            assert not missing, f"round {round_} ({policy}): {len(missing)} acknowledged messages lost"
            for m in tree.context():  # each message is whole
                part = m.parts[0]
                assert isinstance(part, TextPart) and part.text.startswith(m.id + " ")
    finally:
        server.kill()
        server.communicate()

    total = sum(len(acks) for acks in acknowledged.values())
    assert total > ROUNDS  # the writers really were writing when they died
    assert time.monotonic() - started < 120
    assert directory.lock_path(session_id).exists()  # the last writer's lock, stale now...
    with directory.lock(session_id):  # ...and taken over
        pass
    print(f"{total} acknowledged appends over {ROUNDS} kills; {torn_rounds} torn tails cut")
