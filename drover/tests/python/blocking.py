"""Waits on a Drover server's state, shared by the python-nomad scripts.

Each wait is the API's blocking query (a request that returns when the
state it reads changes, `?index=N&wait=5s`), never a sleep, bounded by a
deadline that only turns a hang into a failure. NOMAD_ADDR names the
server, as for the scripts.
"""

import os
import sys
import time

import nomad
import requests

ADDR = os.environ["NOMAD_ADDR"]
n = nomad.Nomad(address=ADDR, timeout=10)


def until(path, done, what, read=None):
    """Blocking queries on `path` until `done` holds for what it reads.

    `read` reads the value through python-nomad, as a user would; without
    it the blocking query's own answer is the value.
    """
    index = 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        answer = requests.get(f"{ADDR}{path}", params={"index": index, "wait": "5s"}, timeout=15)
        answer.raise_for_status()
        index = int(answer.headers["X-Nomad-Index"])
        value = read() if read else answer.json()
        if done(value):
            return value
    sys.exit(f"never {what}")


def wait_allocs(job_id, done, what):
    """The job's allocations (python-nomad's list) once `done` holds."""
    return until(f"/v1/job/{job_id}/allocations", done, what, lambda: n.job.get_allocations(job_id))


def wait_alloc(alloc_id, done, what):
    """One allocation, in full, once `done` holds."""
    return until(f"/v1/allocation/{alloc_id}", done, what)
