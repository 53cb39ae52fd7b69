"""python-nomad 2.1.0's node drain, eligibility and evaluate calls against
a real `drover server` with a real `drover agent` (one node).

Run by drover/tests/python_nomad.rs, which starts both and sets NOMAD_ADDR.
A batch job on the mock driver holds a drain without a deadline open, so
each step is seen as it is; waits use the API's blocking queries
(`blocking.py`), never sleeps.
"""

import sys

import nomad

from blocking import n, until, wait_allocs

node_id = n.nodes.get_nodes()[0]["ID"]
node_path = f"/v1/node/{node_id}"

batch = {
    "Job": {
        "ID": "pyreport",
        "Type": "batch",
        "Datacenters": ["dc1"],
        "TaskGroups": [
            {
                "Name": "report",
                "Count": 1,
                "Tasks": [{"Name": "main", "Driver": "mock", "Resources": {"CPU": 10, "MemoryMB": 10}}],
            }
        ],
    }
}
n.jobs.register_job(batch)
wait_allocs("pyreport", lambda allocs: any(a["ClientStatus"] == "running" for a in allocs), "the batch job running")

evaluated = n.node.evaluate_node(node_id)
assert evaluated["EvalIDs"], evaluated
assert evaluated["NodeModifyIndex"] > 0, evaluated

# A drain with a spec and no deadline: the batch allocation stays, the
# node is ineligible and cannot be made eligible while it drains.
answer = n.node.drain_node_with_spec(node_id, {"Deadline": 0, "IgnoreSystemJobs": False})
assert answer["NodeModifyIndex"] > 0, answer
drained = n.node.get_node(node_id)
assert drained["Drain"] is True, drained
assert drained["DrainStrategy"]["Deadline"] == 0, drained
assert drained["SchedulingEligibility"] == "ineligible", drained
assert drained["LastDrain"]["Status"] == "draining", drained
stub = [node for node in n.nodes.get_nodes() if node["ID"] == node_id][0]
assert stub["Drain"] is True, stub
try:
    n.node.eligible_node(node_id, eligible=True)
    sys.exit("a draining node was made eligible")
except nomad.api.exceptions.BaseNomadException as error:
    assert "while it is draining" in str(error.nomad_resp.text), error.nomad_resp.text

# Ended, eligible again: the record says canceled.
n.node.drain_node_with_spec(node_id, None, mark_eligible=True)
ended = n.node.get_node(node_id)
assert ended["Drain"] is False and ended["DrainStrategy"] is None, ended
assert ended["SchedulingEligibility"] == "eligible", ended
assert ended["LastDrain"]["Status"] == "canceled", ended

# Nomad 1.0's form: `?enable=true` forces the drain, and the batch
# allocation moves at once (nowhere to go: it is stopped).
n.node.drain_node(node_id, True)
until(node_path, lambda node: node["DrainStrategy"] is None, "the forced drain complete")
forced = n.node.get_node(node_id)
assert forced["LastDrain"]["Status"] == "complete", forced
assert forced["SchedulingEligibility"] == "ineligible", forced
allocs = n.job.get_allocations("pyreport")
old = [a for a in allocs if a["NodeID"] == node_id and a["DesiredStatus"] == "stop"]
assert old, allocs
n.node.drain_node(node_id, False)
assert n.node.get_node(node_id)["SchedulingEligibility"] == "eligible"

n.node.eligible_node(node_id, ineligible=True)
assert n.node.get_node(node_id)["SchedulingEligibility"] == "ineligible"
n.node.eligible_node(node_id, eligible=True)
assert n.node.get_node(node_id)["SchedulingEligibility"] == "eligible"

print("checks passed")
