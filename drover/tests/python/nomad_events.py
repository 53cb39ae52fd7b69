"""python-nomad 2.1.0's event stream (`n.event.stream.get_stream`) against
a real `drover server` with a real `drover agent` (one node).

Run by drover/tests/python_nomad.rs, which starts both and sets NOMAD_ADDR.
A subscriber that names its topics as a list (repeated `topic=` values)
sees a job registered, its allocation placed and then running, in index
order; one that names them as a dict (python-nomad sends its keys: a bare
topic) reads the node's registration from the start of the buffer. Each
wait is a bounded `queue.get`, never a sleep.
"""

import queue
import sys

from blocking import n

JOB = "pyevents"


def subscribe(**kwargs):
    stream, stop, events = n.event.stream.get_stream(timeout=60, **kwargs)
    # The reader thread waits for the next line; it must not keep the script alive.
    stream.daemon = True
    stream.start()
    return stop, events


def frames_until(events, done, what):
    frames = []
    while not done(frames):
        try:
            frames.append(events.get(timeout=60))
        except queue.Empty:
            sys.exit(f"never {what}: {frames}")
    return frames


def running(frames):
    return any(
        e["Topic"] == "Allocation" and e["Payload"]["Allocation"]["ClientStatus"] == "running"
        for f in frames
        for e in f["Events"]
    )


stop, events = subscribe(index=0, topic=[f"Job:{JOB}", f"Allocation:{JOB}"])
n.jobs.register_job(
    {
        "Job": {
            "ID": JOB,
            "Type": "service",
            "Datacenters": ["dc1"],
            "TaskGroups": [
                {
                    "Name": "web",
                    "Count": 1,
                    "Tasks": [
                        {
                            "Name": "web",
                            "Driver": "mock",
                            "Config": {"run_for": "1h"},
                            "Resources": {"CPU": 10, "MemoryMB": 10},
                        }
                    ],
                }
            ],
        }
    }
)
frames = frames_until(events, running, "the allocation running")
stop.set()
indexes = [f["Index"] for f in frames]
assert indexes == sorted(set(indexes)), indexes
seen = [(e["Topic"], e["Type"]) for f in frames for e in f["Events"]]
assert seen[0] == ("Job", "JobRegistered"), seen
assert ("Allocation", "PlanResult") in seen, seen
assert seen.index(("Allocation", "PlanResult")) < seen.index(("Allocation", "AllocationUpdated")), seen
for f in frames:
    for e in f["Events"]:
        assert e["Index"] == f["Index"] and e["Namespace"] == "default", e
        assert e["Key"] == JOB or JOB in (e["FilterKeys"] or []), e

node_id = n.nodes.get_nodes()[0]["ID"]
stop, events = subscribe(index=0, topic={"Node": node_id})
frames = frames_until(events, lambda frames: len(frames) > 0, "a node event")
stop.set()
first = frames[0]["Events"][0]
assert (first["Topic"], first["Type"], first["Key"]) == ("Node", "NodeRegistration", node_id), first
assert first["Payload"]["Node"]["SecretID"] == "", first

print("checks passed")
