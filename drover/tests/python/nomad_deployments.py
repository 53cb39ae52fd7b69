"""python-nomad 2.1.0's deployment calls against a real `drover server`
with a real `drover agent`.

Run by drover/tests/python_nomad.rs, which starts both and sets NOMAD_ADDR.
The job runs on the mock driver, whose allocations of a deployment report
themselves healthy as they start; a canary version waits for promotion.
Waits use the API's blocking queries (`blocking.py`), never sleeps.
"""

import sys

import nomad

from blocking import n, until


def job(run_for):
    """Job `pycanary`, one group of two mock tasks, one canary per version."""
    return {
        "Job": {
            "ID": "pycanary",
            "Type": "service",
            "Datacenters": ["dc1"],
            "TaskGroups": [
                {
                    "Name": "web",
                    "Count": 2,
                    "Update": {
                        "MaxParallel": 1,
                        "Canary": 1,
                        "MinHealthyTime": 1_000_000_000,
                        "HealthyDeadline": 30_000_000_000,
                        "ProgressDeadline": 60_000_000_000,
                    },
                    "Tasks": [
                        {
                            "Name": "server",
                            "Driver": "mock",
                            "Config": {"run_for": run_for},
                            "Resources": {"CPU": 100, "MemoryMB": 64},
                        }
                    ],
                }
            ],
        }
    }


def latest(done, what):
    """The job's latest deployment once `done` holds for it."""
    return until(
        "/v1/job/pycanary/deployment",
        lambda d: d is not None and done(d),
        what,
        lambda: n.job.get_deployment("pycanary"),
    )


def awaiting_promotion(version):
    """The deployment of `version` once its canary is healthy."""
    return latest(
        lambda d: d["JobVersion"] == version and d["TaskGroups"]["web"]["HealthyAllocs"] == 1,
        f"version {version}'s canary healthy",
    )


def refused(call, words):
    """`call` raises Nomad's RPC error (500) naming `words`."""
    try:
        call()
    except nomad.api.exceptions.BaseNomadException as error:
        assert words in error.nomad_resp.text, error.nomad_resp.text
        return
    sys.exit(f"expected a refusal: {words}")


n.jobs.register_job(job("1h"))
first = latest(lambda d: d["Status"] == "successful", "version 0 deployed")
assert n.deployment.get_deployment(first["ID"]) == first
assert first["ID"] in n.deployment
assert "00000000-0000-4000-8000-000000000000" not in n.deployment
listed = n.deployments.get_deployments()
assert [d["ID"] for d in listed] == [first["ID"]], listed
assert n.deployments.get_deployments(prefix=first["ID"][:4])[0]["ID"] == first["ID"]
allocs = n.deployment.get_deployment_allocations(first["ID"])
assert len(allocs) == 2 and all(a["DeploymentStatus"]["Healthy"] for a in allocs), allocs
assert n.job.get_deployments("pycanary")[0]["ID"] == first["ID"]

# Version 1: its canary waits; paused and resumed; promoted to success.
n.jobs.register_job(job("2h"))
waiting = awaiting_promotion(1)
assert waiting["StatusDescription"] == "Deployment is running but requires manual promotion", waiting
paused = n.deployment.pause_deployment(waiting["ID"], True)
assert paused["EvalID"] == "" and paused["Index"] > 0, paused
assert n.deployment.get_deployment(waiting["ID"])["Status"] == "paused"
resumed = n.deployment.pause_deployment(waiting["ID"], False)
assert resumed["EvalID"], resumed
refused(lambda: n.deployment.promote_deployment_groups(waiting["ID"], ["nope"]), "nope")
promoted = n.deployment.promote_deployment_all(waiting["ID"])
assert promoted["EvalID"] and promoted["DeploymentModifyIndex"] > 0, promoted
done = latest(lambda d: d["ID"] == waiting["ID"] and d["Status"] == "successful", "version 1 promoted")
assert done["TaskGroups"]["web"]["Promoted"], done
assert n.job.get_versions("pycanary")["Versions"][0]["Stable"]

# A deployment that ended changes no more.
refused(lambda: n.deployment.fail_deployment(done["ID"]), "can't fail terminal deployment")
refused(lambda: n.deployment.pause_deployment(done["ID"], True), "can't pause terminal deployment")
refused(lambda: n.deployment.promote_deployment_all(done["ID"]), "can't promote terminal deployment")
refused(lambda: n.deployment.fail_deployment("00000000-0000-4000-8000-000000000000"), "deployment not found")
try:
    n.deployment.get_deployment("00000000-0000-4000-8000-000000000000")
    sys.exit("an unknown deployment must raise")
except nomad.api.exceptions.URLNotFoundNomadException:
    pass

# Version 2: its canary reported unhealthy (python-nomad sends `UnHealthyAllocationIDs`).
n.jobs.register_job(job("3h"))
second = awaiting_promotion(2)
canary = second["TaskGroups"]["web"]["PlacedCanaries"][0]
refused(
    lambda: n.deployment.deployment_allocation_health(second["ID"]),
    "must specify at least one healthy/unhealthy allocation ID",
)
marked = n.deployment.deployment_allocation_health(second["ID"], unhealthy_allocations=[canary])
assert marked["RevertedJobVersion"] is None, marked
failed = n.deployment.get_deployment(second["ID"])
assert failed["Status"] == "failed", failed
assert failed["StatusDescription"] == "Failed due to unhealthy allocations", failed

# Version 3: failed by the operator.
n.jobs.register_job(job("4h"))
third = awaiting_promotion(3)
n.deployment.fail_deployment(third["ID"])
assert n.deployment.get_deployment(third["ID"])["StatusDescription"] == "Deployment marked as failed"
print("checks passed")
