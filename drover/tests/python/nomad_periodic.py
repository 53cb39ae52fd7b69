"""python-nomad 2.1.0's periodic and dispatch calls against a real
`drover server` with a real `drover agent` (one node).

Run by drover/tests/python_nomad.rs, which starts both and sets NOMAD_ADDR.
`job.periodic_job` forces a launch of a periodic job; `job.dispatch_job`
dispatches a parameterized one with a payload and meta, and again with the
same idempotency token. Waits use the API's blocking queries
(`blocking.py`), never sleeps.
"""

import base64

import nomad

from blocking import n, until, wait_allocs


def batch(job_id, **blocks):
    job = {
        "ID": job_id,
        "Type": "batch",
        "Datacenters": ["dc1"],
        "TaskGroups": [
            {
                "Name": "main",
                "Tasks": [
                    {
                        "Name": "main",
                        "Driver": "mock",
                        "Config": {"run_for": "1ms"},
                        "Resources": {"CPU": 10, "MemoryMB": 10},
                    }
                ],
            }
        ],
    }
    job.update(blocks)
    return {"Job": job}


# A periodic job: registered without an eval, forced at once.
registered = n.jobs.register_job(batch("pycron", Periodic={"Spec": "0 0 1 1 *", "ProhibitOverlap": True}))
assert registered["EvalID"] == "", registered
parent = n.job.get_job("pycron")
assert parent["Periodic"]["Spec"] == "0 0 1 1 *" and parent["Status"] == "running", parent
forced = n.job.periodic_job("pycron")
assert forced["EvalID"] and forced["EvalCreateIndex"] > 0 and forced["Index"] > 0, forced
children = until(
    "/v1/jobs?prefix=pycron/periodic-",
    lambda jobs: len(jobs) == 1,
    "the forced child",
    lambda: n.jobs.get_jobs(prefix="pycron/periodic-"),
)
assert children[0]["ParentID"] == "pycron", children
assert [stub for stub in n.jobs.get_jobs() if stub["ID"] == "pycron"][0]["Periodic"] is True
wait_allocs(children[0]["ID"], lambda allocs: len(allocs) == 1, "the child placed")
try:
    n.job.evaluate_job("pycron")
    raise SystemExit("a periodic job was evaluated")
except nomad.api.exceptions.BaseNomadException as refused:
    assert "can't evaluate periodic job" in str(refused.nomad_resp.text), refused.nomad_resp.text

# A parameterized job: dispatched with a payload and meta.
n.jobs.register_job(
    batch("pywork", ParameterizedJob={"Payload": "optional", "MetaRequired": ["owner"]}, Meta={"tier": "1"})
)
payload = base64.b64encode(b"hello from python").decode()
dispatched = n.job.dispatch_job("pywork", payload=payload, meta={"owner": "py"}, idempotency_token="tok")
child_id = dispatched["DispatchedJobID"]
assert child_id.startswith("pywork/dispatch-"), dispatched
assert dispatched["EvalID"] and dispatched["EvalCreateIndex"] > 0 and dispatched["JobCreateIndex"] > 0, dispatched
child = n.job.get_job(child_id)
assert child["Dispatched"] is True and child["ParentID"] == "pywork", child
assert child["Meta"] == {"owner": "py", "tier": "1"}, child
assert child["Payload"] and child["Payload"] != payload, "stored compressed"
again = n.job.dispatch_job("pywork", payload=payload, meta={"owner": "py"}, idempotency_token="tok")
assert again["DispatchedJobID"] == child_id, again
templated = n.job.dispatch_job("pywork", meta={"owner": "py"}, id_prefix_template="nightly")
assert templated["DispatchedJobID"].startswith("pywork/dispatch-nightly-"), templated
try:
    n.job.dispatch_job("pywork", payload=payload)
    raise SystemExit("a dispatch without its required meta")
except nomad.api.exceptions.BaseNomadException as refused:
    assert "Dispatch did not provide required meta keys" in refused.nomad_resp.text, refused.nomad_resp.text
wait_allocs(child_id, lambda allocs: len(allocs) == 1, "the dispatched child placed")

print("python-nomad 2.1.0: periodic force and dispatch; checks passed")
