"""python-nomad 2.1.0 against a real `drover server` with a real `drover agent`.

Run by drover/tests/python_nomad.rs, which starts both and sets NOMAD_ADDR.
Waits use the API's blocking queries (a request that returns when the
state changes), never sleeps.
"""

import os
import sys
import time

import nomad
import requests

ADDR = os.environ["NOMAD_ADDR"]
n = nomad.Nomad(address=ADDR, timeout=10)

JOB = {
    "Job": {
        "ID": "pyweb",
        "Name": "pyweb",
        "Type": "service",
        "Datacenters": ["dc1"],
        "TaskGroups": [
            {
                "Name": "web",
                "Count": 2,
                "Tasks": [
                    {
                        "Name": "server",
                        "Driver": "mock",
                        "Config": {"run_for": "1h"},
                        "Resources": {"CPU": 100, "MemoryMB": 64},
                    }
                ],
            }
        ],
    }
}


def wait_allocs(job_id, done, what):
    """Blocking queries on the job's allocations until `done` holds."""
    index = 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        answer = requests.get(
            f"{ADDR}/v1/job/{job_id}/allocations",
            params={"index": index, "wait": "5s"},
            timeout=15,
        )
        answer.raise_for_status()
        index = int(answer.headers["X-Nomad-Index"])
        allocs = n.job.get_allocations(job_id)
        if done(allocs):
            return allocs
    sys.exit(f"never {what}")


registered = n.jobs.register_job(JOB)
assert registered["EvalID"], registered
job = n.job.get_job("pyweb")
assert job["ID"] == "pyweb" and job["Priority"] == 50 and job["TaskGroups"][0]["Count"] == 2, job
assert "pyweb" in n.jobs, "the jobs helper finds it by id"
assert "missing" not in n.jobs

running = wait_allocs(
    "pyweb",
    lambda allocs: len(allocs) == 2 and all(a["ClientStatus"] == "running" for a in allocs),
    "ran both allocations",
)
evals = n.job.get_evaluations("pyweb")
assert any(e["ID"] == registered["EvalID"] for e in evals), evals
assert n.evaluation.get_evaluation(registered["EvalID"])["JobID"] == "pyweb"

nodes = n.nodes.get_nodes()
assert len(nodes) == 1 and nodes[0]["Status"] == "ready", nodes
node = n.node.get_node(nodes[0]["ID"])
assert node["ID"] == running[0]["NodeID"], node
assert node["Resources"]["CPU"] > 0

agent = n.agent.get_agent()
assert agent["stats"]["nomad"]["server"] == "true", agent
leader = n.status.leader.get_leader()
assert isinstance(leader, str) and ":" in leader, leader

metrics = n.metrics.get_metrics()
gauges = {g["Name"]: g["Value"] for g in metrics["Gauges"]}
assert gauges["drover.heartbeat.active"] == 1, gauges

try:
    n.job.get_job("missing")
    sys.exit("a missing job must raise")
except nomad.api.exceptions.URLNotFoundNomadException:
    pass

stopped = n.job.deregister_job("pyweb")
assert stopped["EvalID"], stopped
wait_allocs(
    "pyweb",
    lambda allocs: all(a["DesiredStatus"] == "stop" and a["ClientStatus"] == "complete" for a in allocs),
    "stopped the allocations",
)
print("python-nomad 2.1.0: 11 checks passed")
