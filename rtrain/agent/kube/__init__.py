"""rtrain on Kubernetes: what a pod's agent does differently (agent/kube/)."""
