"""The ReCycle planner: jobs, re-routing and Failure Normalization, the schedules, the
simulator, the exact MILP and the reports. Pure."""
