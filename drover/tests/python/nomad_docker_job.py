"""python-nomad 2.1.0 runs a Nomad job file with driver = "docker".

What `nomad job run web.nomad` does, as a user's script does it: the HCL
file is read by the server (`/v1/jobs/parse`), the job it gives back is
registered, the allocation is waited for until it runs, its task events
are read, the container answers HTTP on the host port the allocation was
given, and the job is stopped until its allocation is complete.

Run by drover/tests/python_nomad.rs, which starts a real `drover server`
and `drover agent` (docker on), builds the image, and sets NOMAD_ADDR,
DROVER_TEST_IMAGE and the label every container of the test carries
(DROVER_TEST_LABEL=DROVER_TEST_LABEL_VALUE), by which it removes them.
"""

import os
import sys
import time

import nomad
import requests

from blocking import n, wait_alloc, wait_allocs

IMAGE = os.environ["DROVER_TEST_IMAGE"]
LABEL = os.environ["DROVER_TEST_LABEL"]
LABEL_VALUE = os.environ["DROVER_TEST_LABEL_VALUE"]

JOB_FILE = f"""
job "pydocker" {{
  datacenters = ["dc1"]
  type        = "service"

  group "web" {{
    network {{
      port "http" {{
        to = 8080
      }}
    }}

    task "httpd" {{
      driver = "docker"

      config {{
        image   = "{IMAGE}"
        command = "sh"
        args    = ["-c", "echo hello from $NOMAD_ALLOC_ID on $NOMAD_PORT_http > /local/index.html && exec httpd -f -p $NOMAD_PORT_http -h /local"]
        ports   = ["http"]

        labels {{
          {LABEL} = "{LABEL_VALUE}"
        }}
      }}

      resources {{
        cpu    = 100
        memory = 64
      }}
    }}
  }}
}}
"""

# The server reads the file: Nomad's job JSON, not yet registered.
job = n.jobs.parse(JOB_FILE)
assert job["ID"] == "pydocker" and job["Type"] == "service", job
group = job["TaskGroups"][0]
task = group["Tasks"][0]
assert task["Driver"] == "docker", task
assert task["Config"]["image"] == IMAGE and task["Config"]["ports"] == ["http"], task["Config"]
# A block in `config`: Nomad's parser gives a list of maps, Drover's a
# map; the driver reads both.
labels = task["Config"]["labels"]
assert labels in ({LABEL: LABEL_VALUE}, [{LABEL: LABEL_VALUE}]), labels
dynamic = group["Networks"][0]["DynamicPorts"]
assert [(p["Label"], p["To"]) for p in dynamic] == [("http", 8080)], group["Networks"]
assert "pydocker" not in n.jobs, "parsing registers nothing"
for broken, message in [("job {", "Failed to parse job: input.hcl:1:"), ("", "Job spec is empty")]:
    try:
        n.jobs.parse(broken)
        sys.exit(f"parsing {broken!r} must raise")
    except nomad.api.exceptions.BadRequestNomadException as error:
        assert error.nomad_resp.text.startswith(message), error.nomad_resp.text

registered = n.jobs.register_job({"Job": job})
assert registered["EvalID"] and not registered["Warnings"], registered

running = wait_allocs(
    "pydocker",
    lambda allocs: any(a["ClientStatus"] == "running" for a in allocs),
    "ran the docker task",
)
alloc_id = running[0]["ID"]
alloc = n.allocation.get_allocation(alloc_id)

events = alloc["TaskStates"]["httpd"]["Events"]
kinds = [e["Type"] for e in events]
assert kinds == ["Received", "Task Setup", "Started"], kinds
started = events[-1]
assert len(started["Details"]["container_id"]) == 64, started
assert alloc["TaskStates"]["httpd"]["State"] == "running", alloc["TaskStates"]

# The host port the allocation was given, as the allocation says it: its
# shared ports, and the same in its network.
ports = alloc["AllocatedResources"]["Shared"]["Ports"]
assert [(p["Label"], p["To"]) for p in ports] == [("http", 8080)], ports
host_ip, host_port = ports[0]["HostIP"], ports[0]["Value"]
network = alloc["AllocatedResources"]["Shared"]["Networks"][0]
assert network["IP"] == host_ip and network["DynamicPorts"][0]["Value"] == host_port, network

# The container starts to answer once httpd listens, which nothing
# announces: polled, with a deadline.
url = f"http://{host_ip}:{host_port}/index.html"
deadline = time.monotonic() + 60
while True:
    try:
        answer = requests.get(url, timeout=5)
        break
    except requests.ConnectionError:
        if time.monotonic() > deadline:
            sys.exit(f"nothing answered on {url}")
        time.sleep(0.1)
assert answer.status_code == 200, answer
assert answer.text == f"hello from {alloc_id} on 8080\n", answer.text

stopped = n.job.deregister_job("pydocker")
assert stopped["EvalID"], stopped
ended = wait_alloc(
    alloc_id,
    lambda a: a["DesiredStatus"] == "stop" and a["ClientStatus"] == "complete",
    "stopped the allocation",
)
kinds = [e["Type"] for e in ended["TaskStates"]["httpd"]["Events"]]
assert kinds[-2:] == ["Killing", "Killed"], kinds
assert ended["TaskStates"]["httpd"]["State"] == "dead", ended["TaskStates"]

print("python-nomad 2.1.0: the docker job file ran, answered and stopped; checks passed")
