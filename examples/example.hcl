# A Nomad job file that Drover runs as it is: `drover job run examples/example.hcl`.
job "example" {
  datacenters = ["dc1"]
  type        = "service"

  group "cache" {
    count = 2

    restart {
      attempts = 2
      delay    = "15s"
    }

    task "redis" {
      # The mock driver pretends to run the task (`drover dev` offers it).
      driver = "mock"

      config {
        run_for = "1h"
      }

      resources {
        cpu    = 500
        memory = 256
      }
    }
  }
}
