"""Agents agree through the rendezvous store: rounds and memberships (rounds.py), the
failure ledger (ledger.py), the job-end records and the exit barrier (job_end.py), and
the leases that tell a live agent from a lost one (lease.py). The rules they follow
are pure: core/rendezvous."""
