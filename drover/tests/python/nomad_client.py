"""python-nomad 2.1.0 against a real `drover server` with a real `drover agent`.

Run by drover/tests/python_nomad.rs, which starts both and sets NOMAD_ADDR.
Waits use the API's blocking queries (`blocking.py`) or read a followed
log, never sleeps. The client endpoints (logs, files, stats, signal,
restart, stop, gc) are the server's, which reaches the agent over the
agent's own connection.
"""

import sys

import nomad
import requests

from blocking import ADDR, n, wait_alloc, wait_allocs

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
                # No deployments (nomad_deployments.py has them): a version
                # turns stable here only when the script says so.
                "Update": {"MaxParallel": 0},
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

# Job versions: python-nomad's get_versions, stable_job and revert_job,
# after a plan of the change (plan_job) and a validation (validate_job).
resized = {"Job": dict(JOB["Job"], TaskGroups=[dict(JOB["Job"]["TaskGroups"][0], Count=1)])}
planned = n.job.plan_job("pyweb", resized, diff=True)
assert planned["Diff"]["Type"] == "Edited", planned["Diff"]
assert planned["Annotations"]["DesiredTGUpdates"]["web"]["Stop"] == 1, planned["Annotations"]
assert planned["JobModifyIndex"] > 0, planned
assert n.validate.validate_job(resized).ok
n.jobs.register_job(resized)
versions = n.job.get_versions("pyweb")
assert [v["Version"] for v in versions["Versions"]] == [1, 0], versions
assert versions["Versions"][1]["TaskGroups"][0]["Count"] == 2, versions
assert n.job.stable_job("pyweb", 0, True)["Index"] > 0
reverted = n.job.revert_job("pyweb", 0, enforce_prior_version=1)
assert reverted["EvalID"], reverted
job = n.job.get_job("pyweb")
assert job["Version"] == 2 and job["TaskGroups"][0]["Count"] == 2 and not job["Stable"], job
assert [v["Stable"] for v in n.job.get_versions("pyweb")["Versions"]] == [False, False, True]
try:
    n.job.revert_job("pyweb", 2)
    sys.exit("a revert to the current version must raise")
except nomad.api.exceptions.BaseNomadException as refused:
    assert "can't revert to current version" in refused.nomad_resp.text, refused.nomad_resp.text

stopped = n.job.deregister_job("pyweb")
assert stopped["EvalID"], stopped
wait_allocs(
    "pyweb",
    lambda allocs: all(a["DesiredStatus"] == "stop" and a["ClientStatus"] == "complete" for a in allocs),
    "stopped the allocations",
)

# The client endpoints, on a raw_exec task that answers SIGUSR1.
TRAP = "trap 'echo got-usr1' USR1; echo started $$; while :; do sleep 1; done"
TRAPPER = {
    "Job": {
        "ID": "pytrap",
        "Type": "service",
        "Datacenters": ["dc1"],
        "TaskGroups": [
            {
                "Name": "g",
                "Tasks": [
                    {
                        "Name": "t",
                        "Driver": "raw_exec",
                        "Config": {"command": "sh", "args": ["-c", TRAP]},
                        "Resources": {"CPU": 100, "MemoryMB": 64},
                    }
                ],
            }
        ],
    }
}


def last_pid(alloc):
    events = (alloc.get("TaskStates") or {}).get("t", {}).get("Events") or []
    started = [e for e in events if e["Type"] == "Started"]
    return started[-1]["Details"]["pid"] if started else None


n.jobs.register_job(TRAPPER)
trapping = wait_allocs(
    "pytrap",
    lambda allocs: any(a["ClientStatus"] == "running" for a in allocs),
    "ran the raw_exec task",
)
alloc_id = trapping[0]["ID"]
first_pid = last_pid(wait_alloc(alloc_id, last_pid, "started the task"))
node_id = trapping[0]["NodeID"]

names = sorted(f["Name"] for f in n.client.ls.list_files(alloc_id, "/"))
assert names == ["alloc", "t"], names
stat = n.client.stat.stat_file(alloc_id, "alloc/logs/t.stdout.0")
assert stat["Name"] == "t.stdout.0" and not stat["IsDir"], stat
assert n.client.cat.read_file(alloc_id, "alloc/logs/t.stdout.0") == f"started {first_pid}\n"
assert n.client.read_at.read_file_offset(alloc_id, 0, 7, "alloc/logs/t.stdout.0") == "started"
assert n.client.stream_logs.stream(alloc_id, "t", "stdout", plain=True) == f"started {first_pid}\n"
usage = n.client.allocation.read_allocation_stats(alloc_id)
assert usage["Tasks"]["t"]["ResourceUsage"]["MemoryStats"]["RSS"] > 0, usage
host = n.client.stats.read_stats(node_id)
assert host["Memory"]["Total"] > 0 and host["CPU"], host

try:
    n.client.allocation.signal_allocation(alloc_id, "SIGNOPE")
    sys.exit("a signal that does not exist must raise")
except nomad.api.exceptions.BadRequestNomadException:
    pass
try:
    n.client.ls.list_files("00000000-0000-4000-8000-000000000000", "/")
    sys.exit("an unknown allocation must raise")
except nomad.api.exceptions.URLNotFoundNomadException:
    pass

# A signal reaches the task: its followed log says so.
followed = requests.get(
    f"{ADDR}/v1/client/fs/logs/{alloc_id}",
    params={"task": "t", "type": "stdout", "follow": "true", "plain": "true"},
    stream=True,
    timeout=60,
)
followed.raise_for_status()
n.client.allocation.signal_allocation(alloc_id, "SIGUSR1", task="t")
seen = ""
for piece in followed.iter_content(chunk_size=None):
    seen += piece.decode()
    if "got-usr1" in seen:
        break
followed.close()
assert "got-usr1" in seen, seen

n.client.allocation.restart_allocation(alloc_id)
restarted = wait_alloc(alloc_id, lambda a: last_pid(a) not in (None, first_pid), "restarted the task")
assert restarted["TaskStates"]["t"]["Restarts"] == 1, restarted["TaskStates"]

stopped = n.allocation.stop_allocation(alloc_id)
assert stopped["EvalID"] and stopped["Index"] > 0, stopped
wait_alloc(
    alloc_id,
    lambda a: a["DesiredStatus"] == "stop" and a["ClientStatus"] == "complete",
    "stopped the allocation",
)
n.client.gc_allocation.garbage_collect(alloc_id)
try:
    n.client.ls.list_files(alloc_id, "/")
    sys.exit("a collected allocation's files must be gone")
except nomad.api.exceptions.URLNotFoundNomadException:
    pass
n.client.gc_all_allocations.garbage_collect(node_id)
n.job.deregister_job("pytrap")

print("python-nomad 2.1.0: 26 checks passed")
