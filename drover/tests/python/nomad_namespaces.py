"""python-nomad 2.1.0's namespace calls against a real `drover server` with
a real `drover agent` (one node).

Run by drover/tests/python_nomad.rs, which starts both and sets NOMAD_ADDR.
`namespace.create_namespace` (a POST naming it in the body),
`update_namespace`, `get_namespace`, `namespaces.get_namespaces`; a client
made with `namespace=` registers and reads its jobs there, another
namespace does not see them; a namespace holding a job is not deleted,
an empty one is. Waits use the API's blocking queries (`blocking.py`).
"""

import sys

import nomad

from blocking import ADDR, n, until


def check(condition, what):
    if not condition:
        sys.exit(f"failed: {what}")


n.namespace.create_namespace({"Name": "pyteam", "Description": "python's team"})
n.namespace.update_namespace("pyteam", {"Name": "pyteam", "Description": "python's own team", "Meta": {"k": "v"}})
read = n.namespace.get_namespace("pyteam")
check(read["Description"] == "python's own team" and read["Meta"] == {"k": "v"}, f"the namespace read back: {read}")
names = [ns["Name"] for ns in n.namespaces.get_namespaces()]
check(names == ["default", "pyteam"], f"the namespace list: {names}")
check("pyteam" in n.namespaces and "nope" not in n.namespace, "membership tests")

team = nomad.Nomad(address=ADDR, timeout=10, namespace="pyteam")
team.jobs.register_job(
    {
        "Job": {
            "ID": "pyweb",
            "Type": "service",
            "Datacenters": ["dc1"],
            "TaskGroups": [
                {
                    "Name": "web",
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
check(team.job.get_job("pyweb")["Namespace"] == "pyteam", "the job is in pyteam")
check("pyweb" not in n.jobs, "the default namespace does not hold it")
until(
    "/v1/job/pyweb/allocations?namespace=pyteam",
    lambda allocs: any(a["ClientStatus"] == "running" for a in allocs),
    "pyweb runs in pyteam",
    lambda: team.job.get_allocations("pyweb"),
)

try:
    n.namespace.delete_namespace("pyteam")
    sys.exit("failed: a namespace holding a job was deleted")
except nomad.api.exceptions.BaseNomadException as refused:
    check("has 1 jobs" in refused.nomad_resp.text, f"the refusal: {refused.nomad_resp.text}")

team.job.deregister_job("pyweb", purge=True)
n.namespace.delete_namespace("pyteam")
check("pyteam" not in n.namespace, "the namespace is gone")
print("namespace checks passed")
